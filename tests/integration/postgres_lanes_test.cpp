// saga-worker's lanes on PostgreSQL: a batch split by partition over two
// transactions on two connections. The same request published twice under
// different keys lands in two partitions, often in both lanes of one batch:
// both lanes find the id new and run its saga, the second insert meets the
// first's row and fails that lane's whole transaction, and the lane runs
// again alone while the other keeps what it committed. Money moves once.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "kafka_client.hpp"
#include "ledger_cluster.hpp"

namespace sagapool::test {
namespace {

using namespace std::chrono_literals;

std::size_t count_of(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

TEST(PostgresLanes, ARequestInBothLanesOfABatchMovesItsMoneyOnce) {
  LedgerCluster cluster(1, 40);
  const auto transfers = cluster.plan(3000, 7);
  // Every third request twice, under two keys: in two partitions, at about
  // the same place in each, so in one batch.
  std::vector<std::pair<std::string, std::string>> messages;
  for (std::size_t i = 0; i < transfers.size(); ++i) {
    messages.emplace_back("a-" + transfers[i].id, LedgerCluster::request(transfers[i]));
    if (i % 3 == 0) messages.emplace_back("b-" + transfers[i].id, LedgerCluster::request(transfers[i]));
  }
  produce(cluster.bootstrap(), "transfers.requests", messages, cluster.client_config());

  // Everything is queued before the worker starts: its batches are large
  // and hold both copies of many requests.
  Process worker = cluster.start_worker("w0", "", {"--store-lanes", "2"});
  ASSERT_TRUE(cluster.wait_finished(transfers.size(), 90s)) << cluster.log_tails();
  EXPECT_EQ(worker.stop(20s), 0);

  const std::string log = read_file(cluster.log_of("w0"));
  EXPECT_NE(log.find("2 lane(s)"), std::string::npos) << log.substr(0, 2000);
  // A lane that lost the race shows as a repeated batch write.
  const std::size_t again = count_of(log, "store error in ingest");
  std::cout << again << " lane transaction(s) run again\n";
  if (again > 0) {
    const std::size_t at = log.find("store error in ingest");
    std::cout << log.substr(at, log.find('\n', at) - at) << "\n";
  }
  cluster.expect_outcomes(transfers);
  cluster.expect_balances(transfers);
  cluster.expect_audit_passes();
}

// Kafka orders a key's requests (the source account's), and so must the
// lanes: acct-0 pays out 600 times a 500th of its balance, its requests
// spread through a backlog of others', and nothing pays into it. In the
// order published the first 500 are paid and the last 100 overdraw; a
// batch that split a key over its lanes would pay some of the last 100
// instead.
TEST(PostgresLanes, AKeysRequestsRunInTheirOrder) {
  LedgerCluster cluster(1, 40);
  std::vector<PlannedTransfer> others = cluster.plan(3600, 11);
  std::erase_if(others, [](const PlannedTransfer& t) { return t.from == "acct-0" || t.to == "acct-0"; });
  ASSERT_GE(others.size(), 3000u);
  std::vector<PlannedTransfer> transfers;
  for (std::size_t i = 0; i < 600; ++i) {
    PlannedTransfer t;
    t.id = "hot-" + std::to_string(i);
    t.from = LedgerCluster::account_id(0);
    t.to = LedgerCluster::account_id(1 + static_cast<int>(i % 39));
    t.amount = LedgerCluster::kOpening / 500;
    t.state = i < 500 ? "done" : "canceled";
    if (i >= 500) t.reason = "insufficient_funds";
    transfers.push_back(std::move(t));
    transfers.insert(transfers.end(), others.begin() + static_cast<std::ptrdiff_t>(5 * i),
                     others.begin() + static_cast<std::ptrdiff_t>(5 * i + 5));
  }
  std::vector<std::pair<std::string, std::string>> messages;
  for (const PlannedTransfer& t : transfers) messages.emplace_back(t.from, LedgerCluster::request(t));
  produce(cluster.bootstrap(), "transfers.requests", messages, cluster.client_config());

  Process worker = cluster.start_worker("w0", "", {"--store-lanes", "2"});
  ASSERT_TRUE(cluster.wait_finished(transfers.size(), 90s)) << cluster.log_tails();
  EXPECT_EQ(worker.stop(20s), 0);
  cluster.expect_outcomes(transfers);
  cluster.expect_balances(transfers);
  cluster.expect_audit_passes();
}

}  // namespace
}  // namespace sagapool::test
