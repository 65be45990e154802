// PostgreSQL faults under a running worker pool (two shards, three workers):
// the servers kill the workers' connections, or a shard goes away for
// several seconds (fast or immediate shutdown) and comes back. The workers
// must carry on by themselves, /readyz must say when any shard is out of
// reach, and in the end every id has its one planned outcome, every
// balance is exact (nothing lost, nothing applied twice) and the audit
// passes.
#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "http_get.hpp"
#include "ledger_cluster.hpp"

namespace sagapool::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

class PostgresFault : public ::testing::Test {
 protected:
  static constexpr int kTransfers = 6000;

  void start(std::uint64_t seed) {
    transfers_ = cluster_.plan(kTransfers, seed);
    // w0 serves /readyz; the others run without a listener. w0 joins first
    // and holds partitions before the others come (sticky assignment keeps
    // some with it); started together, one CI run saw w0 left without any.
    workers_.push_back(cluster_.start_worker("w0", "127.0.0.1:" + std::to_string(http_port_)));
    ASSERT_TRUE(eventually([&] { return readyz() == 200; }, 30s))
        << http_get(http_port_, "/readyz").body << read_file(cluster_.log_of("w0"));
    for (int i = 1; i < 3; ++i) workers_.push_back(cluster_.start_worker("w" + std::to_string(i)));
    std::this_thread::sleep_for(3s);  // the others join; w0 gives some partitions up
    ASSERT_TRUE(eventually([&] { return readyz() == 200; }, 30s))
        << http_get(http_port_, "/readyz").body << read_file(cluster_.log_of("w0"));
    // Paced over ~10 s, so the faults land while requests still arrive.
    producer_ = cluster_.produce_paced(transfers_, 300, 500ms);
  }

  // The workers survived the faults on their own; they drain and exit 0.
  void finish_and_check() {
    producer_.join();
    for (std::size_t i = 0; i < workers_.size(); ++i) {
      EXPECT_TRUE(workers_[i].running()) << "w" << i << " exited:\n"
                                         << read_file(cluster_.log_of("w" + std::to_string(i)));
    }
    const bool finished = cluster_.wait_finished(transfers_.size(), 60s);
    bool open = false;
    EXPECT_TRUE(finished) << cluster_.finished(open) << " of " << transfers_.size()
                          << " finished and published";
    for (std::size_t i = 0; i < workers_.size(); ++i) {
      EXPECT_EQ(workers_[i].stop(20s), 0) << read_file(cluster_.log_of("w" + std::to_string(i)));
    }
    if (!finished) return;
    cluster_.expect_outcomes(transfers_);
    cluster_.expect_balances(transfers_);
    cluster_.expect_audit_passes();
  }

  int readyz() { return http_get(http_port_, "/readyz", 2).status; }

  // Stops a shard for `down`, watching w0's /readyz meanwhile, checks that
  // the workers are still alive, and starts the shard again on the same port
  // and data. Returns whether /readyz answered 503 during the outage.
  bool outage(std::size_t shard, PgServer::StopMode mode, std::chrono::milliseconds down) {
    const auto t = Clock::now();
    cluster_.server(shard).stop(mode);
    bool not_ready = false;
    std::string why;
    while (Clock::now() - t < down) {
      const HttpReply r = http_get(http_port_, "/readyz", 2);
      if (r.status == 503 && !not_ready) why = r.body;
      not_ready |= r.status == 503;
      std::this_thread::sleep_for(200ms);
    }
    for (Process& w : workers_) EXPECT_TRUE(w.running()) << "a worker exited during the outage";
    cluster_.server(shard).start();
    std::cout << "shard " << shard + 1 << " down "
              << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count()
              << " ms; /readyz " << (not_ready ? "503: " + why : std::string("stayed 200")) << "\n";
    // Ready again once the store answers.
    EXPECT_TRUE(eventually([&] { return readyz() == 200; }, 20s))
        << http_get(http_port_, "/readyz").body;
    return not_ready;
  }

  LedgerCluster cluster_{2, 200};
  int http_port_ = free_loopback_port();
  std::vector<PlannedTransfer> transfers_;
  std::vector<Process> workers_;
  std::thread producer_;

  void TearDown() override {
    if (producer_.joinable()) producer_.join();
  }
};

TEST_F(PostgresFault, TerminatedConnectionsAreReopened) {
  ASSERT_NO_FATAL_FAILURE(start(11));
  // Every 300 ms for ~6 s, on both servers, end every backend the workers
  // hold (the test's own connections carry another application_name).
  std::this_thread::sleep_for(1500ms);
  long terminated = 0;
  for (int round = 0; round < 20; ++round) {
    for (std::size_t shard = 0; shard < 2; ++shard) {
      const RunResult r = cluster_.server(shard).psql(
          "ledger",
          "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
          "WHERE application_name = 'sagapool' AND pid <> pg_backend_pid()");
      ASSERT_EQ(r.exit_code, 0) << r.output;
      terminated += std::stol(r.output);
    }
    std::this_thread::sleep_for(300ms);
  }
  std::cout << "terminated " << terminated << " worker connections\n";
  EXPECT_GT(terminated, 20);
  finish_and_check();
}

// Each shard is stopped once for 8 s, longer than /readyz's 5 s grace for a
// store that answered recently: the first (transfers and accounts) and the
// second (accounts only), so both ingest and legs meet an outage, and
// readiness must report either.
TEST_F(PostgresFault, ShardsStoppedFastAndRestarted) {
  ASSERT_NO_FATAL_FAILURE(start(12));
  std::this_thread::sleep_for(2s);
  EXPECT_TRUE(outage(1, PgServer::StopMode::fast, 8s)) << "/readyz never said the shard was gone";
  std::this_thread::sleep_for(2s);
  EXPECT_TRUE(outage(0, PgServer::StopMode::fast, 8s)) << "/readyz never said the store was gone";
  finish_and_check();
}

TEST_F(PostgresFault, ShardsStoppedImmediatelyAndRestarted) {
  ASSERT_NO_FATAL_FAILURE(start(13));
  std::this_thread::sleep_for(2s);
  EXPECT_TRUE(outage(0, PgServer::StopMode::immediate, 8s))
      << "/readyz never said the store was gone";
  std::this_thread::sleep_for(2s);
  EXPECT_TRUE(outage(1, PgServer::StopMode::immediate, 8s)) << "/readyz never said the shard was gone";
  finish_and_check();
}

// SIGTERM while the transfers shard is down and a batch (with dead letters)
// waits to be written: the worker exits 0 without committing that batch's
// offsets, and the next worker finds every request.
TEST_F(PostgresFault, StopDuringAnOutageLosesNothing) {
  transfers_ = cluster_.plan(600, 14);
  workers_.push_back(cluster_.start_worker("w0"));
  ASSERT_TRUE(cluster_.joined("w0")) << read_file(cluster_.log_of("w0"));
  cluster_.server(0).stop(PgServer::StopMode::fast);
  std::vector<std::pair<std::string, std::string>> messages;
  for (const auto& t : transfers_) messages.emplace_back(t.from, LedgerCluster::request(t));
  for (int i = 0; i < 20; ++i) messages.emplace_back("x", "not json " + std::to_string(i));
  produce(cluster_.bootstrap(), "transfers.requests", messages);
  std::this_thread::sleep_for(3s);  // consumed, dead letters sent, the write retried
  EXPECT_EQ(workers_[0].stop(20s), 0) << read_file(cluster_.log_of("w0"));

  cluster_.server(0).start();
  workers_[0] = cluster_.start_worker("w1");
  ASSERT_TRUE(cluster_.wait_finished(transfers_.size(), 60s)) << read_file(cluster_.log_of("w1"));
  EXPECT_EQ(workers_[0].stop(20s), 0) << read_file(cluster_.log_of("w1"));
  cluster_.expect_outcomes(transfers_);
  cluster_.expect_balances(transfers_);
  cluster_.expect_audit_passes();
  // Every invalid request was dead-lettered (some twice: the batch was
  // consumed again).
  std::set<std::string> dead;
  for (const Record& r : consume(cluster_.bootstrap(), "transfers.dlq", 20, 30s)) {
    dead.insert(r.value);
  }
  EXPECT_EQ(dead.size(), 20U);
}

}  // namespace
}  // namespace sagapool::test
