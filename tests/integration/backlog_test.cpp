// Backlogs larger than one store statement (issue 19, finding 2). The
// worker hands its stores whatever a backlog gives it: full batches of
// 10,000 requests (two legs, two account ids, two releases each), and the
// delivery reports of every outcome held up behind a stalled broker, marked
// at once when it comes back. The workers must stay up and catch up, with
// every id one outcome, exact balances and the audit passing.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "ledger_cluster.hpp"

namespace sagapool::test {
namespace {

using namespace std::chrono_literals;
using Backend = LedgerCluster::Backend;

// Counts terminal transfers, and of them those not yet published.
std::pair<std::size_t, std::size_t> terminal_unpublished(LedgerCluster& cluster) {
  std::size_t terminal = 0;
  std::size_t unpublished = 0;
  const Status s = cluster.ledger().transfers().scan_transfer_states(
      [&](std::string_view, TransferState state, bool notified) {
        if (!is_terminal(state)) return;
        ++terminal;
        if (!notified) ++unpublished;
      });
  EXPECT_TRUE(s.is_ok()) << s.message();
  return {terminal, unpublished};
}

void expect_all_done(LedgerCluster& cluster, const std::vector<PlannedTransfer>& transfers,
                     std::vector<Process>& workers, std::chrono::seconds within) {
  const bool finished = cluster.wait_finished(transfers.size(), within);
  bool open = false;
  EXPECT_TRUE(finished) << cluster.finished(open) << " of " << transfers.size()
                        << " finished and published";
  for (std::size_t i = 0; i < workers.size(); ++i) {
    const std::string name = "w" + std::to_string(i);
    EXPECT_TRUE(workers[i].running()) << name << " exited:\n" << read_file(cluster.log_of(name));
    EXPECT_EQ(workers[i].stop(20s), 0) << read_file(cluster.log_of(name));
  }
  if (!finished) return;
  cluster.expect_outcomes(transfers);
  cluster.expect_balances(transfers);
  cluster.expect_audit_passes();
}

// 30,000 requests queued before the worker starts, taken 10,000 at a time.
void full_batches(int shards, Backend backend) {
  LedgerCluster cluster(shards, 2000, {.backend = backend});
  const auto transfers = cluster.plan(30'000, 19);
  std::vector<std::pair<std::string, std::string>> messages;
  for (const auto& t : transfers) messages.emplace_back(t.from, LedgerCluster::request(t));
  produce(cluster.bootstrap(), "transfers.requests", messages);
  std::vector<Process> workers;
  workers.push_back(cluster.start_worker("w0", "", {"--batch-size", "10000", "--lease", "60s"}));
  expect_all_done(cluster, transfers, workers, 240s);
  const std::string log = read_file(cluster.log_of("w0"));
  EXPECT_EQ(log.find("exceeds"), std::string::npos) << log;
}

TEST(Backlog, FullBatchesOnSqlite) { full_batches(1, Backend::sqlite); }
TEST(Backlog, FullBatchesOnOnePostgresStore) { full_batches(1, Backend::postgresql); }
TEST(Backlog, FullBatchesOnTwoPostgresShards) { full_batches(2, Backend::postgresql); }

// Two PostgreSQL shards, two workers. Every partition of transfers.results
// is led by mock broker 2, everything else by broker 1; broker 2 goes down
// while 30,000 requests are worked through, so each worker holds ~15,000
// outcomes that cannot be delivered. When it comes back their delivery
// reports arrive together and are marked in one store call per worker.
TEST(Backlog, OutcomesHeldUpByABrokerOutage) {
  constexpr int kPartitions = 6;
  LedgerCluster cluster(2, 2000, {.partitions = kPartitions, .brokers = 2, .real_kafka = false});
  Broker& broker = cluster.broker();
  for (int p = 0; p < kPartitions; ++p) {
    broker.control("leader transfers.requests " + std::to_string(p) + " 1");
    broker.control("leader transfers.dlq " + std::to_string(p) + " 1");
    broker.control("leader transfers.results " + std::to_string(p) + " 2");
  }
  broker.control("coordinator g 1");
  // A lease longer than the outage: recovery would otherwise publish every
  // held-up outcome again each lease.
  const std::vector<std::string> flags = {"--batch-size", "2000", "--lease", "120s"};
  std::vector<Process> workers;
  workers.push_back(cluster.start_worker("w0", "", flags));
  workers.push_back(cluster.start_worker("w1", "", flags));
  for (const char* name : {"w0", "w1"}) {
    ASSERT_TRUE(cluster.joined(name)) << read_file(cluster.log_of(name));
  }

  broker.control("down 2");
  const auto transfers = cluster.plan(30'000, 20);
  std::vector<std::pair<std::string, std::string>> messages;
  for (const auto& t : transfers) messages.emplace_back(t.from, LedgerCluster::request(t));
  produce(broker.bootstrap(), "transfers.requests", messages);
  ASSERT_TRUE(eventually([&] { return terminal_unpublished(cluster).first == transfers.size(); },
                         180s))
      << terminal_unpublished(cluster).first << " of " << transfers.size() << " terminal";
  const std::size_t held = terminal_unpublished(cluster).second;
  std::cout << "outcomes held up by the outage: " << held << "\n";
  EXPECT_GT(held, 20'000U) << "the outage did not hold the outcomes up";
  broker.control("up 2");

  expect_all_done(cluster, transfers, workers, 120s);
  for (const char* name : {"w0", "w1"}) {
    const std::string log = read_file(cluster.log_of(name));
    EXPECT_EQ(log.find("exceeds"), std::string::npos) << log;
  }
}

}  // namespace
}  // namespace sagapool::test
