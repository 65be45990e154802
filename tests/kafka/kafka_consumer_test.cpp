// The workers' consumer takes a backlog oldest first across its partitions
// (kafka/include/sagapool/consumer.hpp): requests spread unequally over four
// partitions of a real Kafka node come out in the order they were produced,
// and after a seek back to the start, in that order again, with nothing it
// held from before the seek in between.
#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "kafka_client.hpp"
#include "sagapool/consumer.hpp"

namespace sagapool::test {
namespace {

using namespace std::chrono_literals;

constexpr int kPartitions = 4;
constexpr int kMessages = 1000;
constexpr int64_t kFirstTimestampMs = 1'700'000'000'000;

// Message i, stamped kFirstTimestampMs + i, to partition 0 six times in ten,
// 1 twice, 2 and 3 once: partitions of unequal backlogs, as hot accounts make.
int partition_of(int i) {
  const int r = i % 10;
  return r < 6 ? 0 : r < 8 ? 1 : r < 9 ? 2 : 3;
}

void produce_backlog(const std::string& bootstrap, const std::string& topic) {
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  ASSERT_EQ(rd_kafka_conf_set(conf, "bootstrap.servers", bootstrap.c_str(), err, sizeof err), RD_KAFKA_CONF_OK);
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  ASSERT_NE(rk, nullptr) << err;
  for (int i = 0; i < kMessages; ++i) {
    const std::string value = std::to_string(i);
    ASSERT_EQ(rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_PARTITION(partition_of(i)),
                                RD_KAFKA_V_TIMESTAMP(kFirstTimestampMs + i),
                                RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()),
                                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END),
              RD_KAFKA_RESP_ERR_NO_ERROR);
  }
  EXPECT_EQ(rd_kafka_flush(rk, 30'000), RD_KAFKA_RESP_ERR_NO_ERROR);
  rd_kafka_destroy(rk);
}

// Polls, taking nothing, until librdkafka has fetched the `n` messages the
// partitions hold beyond what was taken, so that the order is not looked at
// while a partition's queue is still empty.
void prefetch(Consumer& consumer, std::size_t n) {
  std::vector<MessagePtr> none;
  for (const auto until = std::chrono::steady_clock::now() + 60s;
       consumer.prefetched() < n && std::chrono::steady_clock::now() < until;) {
    ASSERT_TRUE(consumer.poll_batch(0, 50ms, none).is_ok());
  }
  ASSERT_EQ(consumer.prefetched(), n);
}

// The values of the next `n` messages, in batches of at most 64.
std::vector<int> take(Consumer& consumer, std::size_t n) {
  std::vector<int> values;
  std::vector<MessagePtr> batch;
  for (const auto until = std::chrono::steady_clock::now() + 30s;
       values.size() < n && std::chrono::steady_clock::now() < until;) {
    const Status s = consumer.poll_batch(std::min<std::size_t>(64, n - values.size()), 50ms, batch);
    EXPECT_TRUE(s.is_ok()) << s.message();
    for (const MessagePtr& m : batch) {
      values.push_back(std::stoi(std::string(static_cast<const char*>(m->payload), m->len)));
    }
  }
  return values;
}

std::vector<int> iota(int from, int to) {
  std::vector<int> v;
  for (int i = from; i < to; ++i) v.push_back(i);
  return v;
}

TEST(KafkaConsumer, TakesABacklogOldestFirstAcrossPartitions) {
  TempDir dir("sagapool-consumer");
  Broker broker = Broker::kafka(dir, kPartitions);
  const std::string topic = "transfers.requests";
  produce_backlog(broker.bootstrap(), topic);

  std::unique_ptr<Consumer> consumer;
  const Status created = Consumer::create({broker.bootstrap(), "order-test", topic, "order-test", {}}, consumer);
  ASSERT_TRUE(created.is_ok()) << created.message();
  for (const auto until = std::chrono::steady_clock::now() + 30s;
       consumer->assigned_partitions() < kPartitions && std::chrono::steady_clock::now() < until;) {
    std::vector<MessagePtr> none;
    ASSERT_TRUE(consumer->poll_batch(0, 50ms, none).is_ok());
  }
  ASSERT_EQ(consumer->assigned_partitions(), kPartitions);
  prefetch(*consumer, kMessages);
  EXPECT_EQ(take(*consumer, 500), iota(0, 500));

  // Back to the start of every partition: what the consumer held of each
  // (the message after the last one taken) is dropped, not taken first.
  TopicPartitionListPtr start(rd_kafka_topic_partition_list_new(kPartitions));
  for (int p = 0; p < kPartitions; ++p) rd_kafka_topic_partition_list_add(start.get(), topic.c_str(), p)->offset = 0;
  const Status sought = consumer->seek(*start);
  ASSERT_TRUE(sought.is_ok()) << sought.message();
  prefetch(*consumer, kMessages);
  EXPECT_EQ(take(*consumer, kMessages), iota(0, kMessages));
  consumer->close();
}

}  // namespace
}  // namespace sagapool::test
