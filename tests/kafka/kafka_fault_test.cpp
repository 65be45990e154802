// Broker faults on a real Apache Kafka cluster (three KRaft nodes, topics
// with replication factor 3 and min.insync.replicas 2, idempotent producers
// with acks=all) while three workers run transfers on SQLite. In every case
// each valid id ends with exactly one outcome (republished copies agree),
// the balances are those the published outcomes imply, and the audit
// passes.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "ledger_cluster.hpp"

namespace sagapool::test {
namespace {

using namespace std::chrono_literals;

class KafkaFault : public ::testing::Test {
 protected:
  static constexpr int kTransfers = 6000;

  void start(std::uint64_t seed) {
    transfers_ = cluster_.plan(kTransfers, seed);
    for (int i = 0; i < 3; ++i) {
      workers_.push_back(cluster_.start_worker("w" + std::to_string(i)));
    }
    for (int i = 0; i < 3; ++i) {
      const std::string name = "w" + std::to_string(i);
      ASSERT_TRUE(cluster_.joined(name)) << read_file(cluster_.log_of(name));
    }
    // Paced over ~10 s, keyed by id so every partition gets requests: the
    // faults land while requests still arrive.
    producer_ = cluster_.produce_paced(transfers_, 300, 500ms, LedgerCluster::Key::id);
    std::this_thread::sleep_for(2s);
  }

  // The workers rode the fault out on their own; they drain and exit 0.
  void finish_and_check() {
    producer_.join();
    for (std::size_t i = 0; i < workers_.size(); ++i) {
      EXPECT_TRUE(workers_[i].running()) << "worker " << i << " exited (logs under w*.log)";
    }
    const bool finished = cluster_.wait_finished(transfers_.size(), 120s);
    bool open = false;
    EXPECT_TRUE(finished) << cluster_.finished(open) << " of " << transfers_.size()
                          << " finished and published";
    for (std::size_t i = 0; i < workers_.size(); ++i) {
      EXPECT_EQ(workers_[i].stop(30s), 0) << "worker " << i;
    }
    if (!finished) return;
    cluster_.expect_outcomes(transfers_);
    cluster_.expect_balances(transfers_);
    cluster_.expect_audit_passes();
  }

  void TearDown() override {
    if (producer_.joinable()) producer_.join();
    if (HasFailure()) std::cout << cluster_.log_tails();
  }

  LedgerCluster cluster_{1, 200,
                         {.partitions = 6,
                          .brokers = 3,
                          .real_kafka = true,
                          .backend = LedgerCluster::Backend::sqlite}};
  std::vector<PlannedTransfer> transfers_;
  std::vector<Process> workers_;
  std::thread producer_;
};

// The node leading the first request partition (and, with it, whatever else
// it leads: result partitions, maybe the group coordinator) is SIGKILLed,
// stays down until another node leads that partition (and 10 s at least),
// and comes back on the same data.
TEST_F(KafkaFault, PartitionLeaderKilledAndRestarted) {
  ASSERT_NO_FATAL_FAILURE(start(31));
  const int leader = cluster_.kafka().leader_of("transfers.requests", 0);
  ASSERT_GT(leader, 0);
  const int results_leader = cluster_.kafka().leader_of("transfers.results", 0);
  const auto killed = std::chrono::steady_clock::now();
  cluster_.kafka().kill(leader);
  // The controller fences the node once its broker session (9 s) lapses,
  // and moves its leadership; a loaded machine takes longer.
  EXPECT_TRUE(eventually(
      [&] {
        const int now = cluster_.kafka().leader_of("transfers.requests", 0);
        return now > 0 && now != leader;
      },
      60s))
      << "no new leader";
  std::this_thread::sleep_until(killed + 10s);
  const auto down = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - killed);
  cluster_.kafka().restart(leader);
  std::cout << "killed node " << leader << " (results partition 0 was led by node " << results_leader
            << "), restarted after " << down.count() << " s\n";
  finish_and_check();
}

// A node frozen for 20 s, past its broker session (9 s by default): the
// controller fences it and its partitions move; when it resumes it catches
// up and rejoins.
TEST_F(KafkaFault, NodePausedPastItsSessionAndResumed) {
  ASSERT_NO_FATAL_FAILURE(start(32));
  const int leader = cluster_.kafka().leader_of("transfers.results", 0);
  ASSERT_GT(leader, 0);
  cluster_.kafka().pause(leader);
  std::this_thread::sleep_for(20s);
  cluster_.kafka().resume(leader);
  std::cout << "paused node " << leader << " for 20 s\n";
  finish_and_check();
}

// Every node stopped (SIGTERM) at once, down 5 s, and started again on the
// same data: the workers wait for the cluster and carry on.
TEST_F(KafkaFault, WholeClusterRestarted) {
  ASSERT_NO_FATAL_FAILURE(start(34));
  cluster_.kafka().stop();
  std::this_thread::sleep_for(5s);
  cluster_.kafka().start();
  finish_and_check();
}

// Workers join and leave while transfers flow: each change is a
// cooperative-sticky rebalance (only the partitions that move are revoked).
TEST_F(KafkaFault, WorkersJoinAndLeave) {
  ASSERT_NO_FATAL_FAILURE(start(35));
  workers_.push_back(cluster_.start_worker("w3"));
  std::this_thread::sleep_for(2s);
  EXPECT_EQ(workers_[0].stop(30s), 0) << read_file(cluster_.log_of("w0"));  // drains, leaves
  std::this_thread::sleep_for(2s);
  workers_.push_back(cluster_.start_worker("w4"));
  std::this_thread::sleep_for(2s);
  EXPECT_EQ(workers_[2].stop(30s), 0) << read_file(cluster_.log_of("w2"));
  workers_[0] = cluster_.start_worker("w0b");
  workers_[2] = cluster_.start_worker("w2b");
  const std::string log = read_file(cluster_.log_of("w1"));
  std::size_t rebalances = 0;
  for (auto at = log.find("rebalance:"); at != std::string::npos; at = log.find("rebalance:", at + 1)) {
    ++rebalances;
  }
  EXPECT_GE(rebalances, 2U) << "w1 saw no rebalance after its first assignment:\n" << log;
  finish_and_check();
}

// A worker SIGKILLed mid-run: the group rebalances its partitions to the
// others, and recovery finishes what it had claimed once its lease expires.
TEST_F(KafkaFault, WorkerKilled) {
  ASSERT_NO_FATAL_FAILURE(start(33));
  workers_[1].signal(SIGKILL);
  ASSERT_TRUE(workers_[1].wait(10s).has_value());
  workers_[1] = cluster_.start_worker("w1b");
  finish_and_check();
}

}  // namespace
}  // namespace sagapool::test
