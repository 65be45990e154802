// A dead letter the broker refuses as too large (the topic's
// max.message.bytes is below the request's size, the producer's own limit
// above it): the delivery report says so, and the worker sends it again cut
// to 64 KiB (issue 19, finding 3; saga-broker enforces no topic limit, so
// this path needs a real Kafka).
#include <gtest/gtest.h>

#include <cstdint>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "ledger_cluster.hpp"

namespace sagapool::test {
namespace {

using namespace std::chrono_literals;

TEST(KafkaDeadLetter, RefusedByTheTopicAsTooLargeIsSentTruncated) {
  LedgerCluster cluster(1, 4,
                        {.partitions = 1,
                         .brokers = 1,
                         .real_kafka = true,
                         .dlq_configs = {{"max.message.bytes", "200000"}},
                         .backend = LedgerCluster::Backend::sqlite});
  struct LogsOnFailure {
    const LedgerCluster& cluster;
    ~LogsOnFailure() {
      if (::testing::Test::HasFailure()) std::cout << cluster.log_tails();
    }
  } logs_on_failure{cluster};
  const std::vector<PlannedTransfer> transfers = cluster.plan(2, 7);
  // Letters that do not compress much: the worker's producer compresses
  // (lz4), and the broker checks the compressed size.
  constexpr std::string_view kLetters =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string filler(500'000, ' ');
  std::uint32_t x = 7;
  for (char& c : filler) {
    x = x * 1103515245U + 12345U;
    c = kLetters[(x >> 16) % kLetters.size()];
  }
  const std::string huge =
      R"({"id":"t-huge","from":"a","to":"b","amount":1,"metadata":")" + filler + "\"}";
  // Small dead letters on each side share the broker's refusal of the
  // produce request that carried the huge one: they must still go whole.
  produce(cluster.bootstrap(), "transfers.requests",
          {{transfers[0].from, LedgerCluster::request(transfers[0])},
           {"a", "not json before"},
           {"a", huge},
           {"a", "not json after"},
           {transfers[1].from, LedgerCluster::request(transfers[1])}});
  Process worker = cluster.start_worker("w0");
  ASSERT_TRUE(cluster.wait_finished(transfers.size(), 60s)) << read_file(cluster.log_of("w0"));
  const std::vector<Record> all = consume(cluster.bootstrap(), "transfers.dlq", 3, 30s, 2s);
  ASSERT_EQ(all.size(), 3U) << read_file(cluster.log_of("w0"));
  std::vector<Record> dead;
  for (const Record& r : all) {
    if (r.headers.at("saga.error") == "too_large") {
      dead.push_back(r);
      continue;
    }
    EXPECT_TRUE(r.value == "not json before" || r.value == "not json after") << r.value.substr(0, 80);
    EXPECT_EQ(r.headers.count("saga.truncated"), 0U) << r.value.substr(0, 80);
  }
  ASSERT_EQ(dead.size(), 1U);
  EXPECT_EQ(dead[0].headers.at("saga.truncated"), "true");
  EXPECT_EQ(dead[0].headers.at("saga.original.size"), std::to_string(huge.size()));
  EXPECT_EQ(dead[0].value, huge.substr(0, 64 * 1024));
  const std::string log = read_file(cluster.log_of("w0"));
  EXPECT_NE(log.find("dead letter not delivered (MSG_SIZE_TOO_LARGE)"), std::string::npos) << log;
  EXPECT_TRUE(worker.running()) << log;
  EXPECT_EQ(worker.stop(30s), 0) << log;
  cluster.expect_outcomes(transfers);
  cluster.expect_audit_passes();
}

}  // namespace
}  // namespace sagapool::test
