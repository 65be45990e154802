#pragma once
// Small Kafka clients for tests: produce raw bytes, read a whole topic, and
// start/stop a broker: a real one-node Apache Kafka, or saga-broker where a
// test needs its fault injection.
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kafka_cluster.hpp"
#include "process.hpp"

namespace sagapool::test {

struct Record {
  std::string key;
  std::string value;
  std::map<std::string, std::string> headers;  // the last value of each name
  std::vector<std::pair<std::string, std::optional<std::string>>> header_list;  // all, in order
  int partition = -1;
  long long offset = -1;
  long long timestamp_ms = -1;
};

// A running broker for a test; stopped when destroyed.
class Broker {
 public:
  // A real Apache Kafka node (tools/kafka/kafka.sh) with transfers.requests,
  // .results and .dlq of `partitions` partitions each: what tests use unless
  // they inject broker faults. `requests_configs`: topic configs of
  // transfers.requests (max.message.bytes, ...).
  static Broker kafka(const TempDir& dir, int partitions = 4,
                      const std::vector<std::pair<std::string, std::string>>& requests_configs = {});
  // saga-broker, librdkafka's mock cluster: `brokers` mock brokers (ids
  // 1..N), topics made on first use, and the control channel for faults.
  static Broker start(const TempDir& dir, int partitions = 4, int brokers = 1);
  const std::string& bootstrap() const { return bootstrap_; }
  // SIGKILL the broker (the Kafka node, or saga-broker) and wait for it.
  void kill();
  // One fault-injection command (`saga-broker --control-fifo`), e.g.
  // "down 2"; returns once the broker logged that it carried it out, and
  // throws if it refused it.
  void control(const std::string& command);

 private:
  std::unique_ptr<KafkaCluster> kafka_;  // real Kafka
  Process process_;                      // saga-broker
  std::string bootstrap_;
  std::filesystem::path control_;
  std::filesystem::path log_;
};

// Produces each (key, value) and waits for delivery; throws on failure.
// `config`: more librdkafka producer properties (message.max.bytes, ...).
void produce(const std::string& brokers, const std::string& topic,
             const std::vector<std::pair<std::string, std::string>>& messages,
             const std::vector<std::pair<std::string, std::string>>& config = {});

// Reads `topic` from the beginning until `at_least` records arrived or
// `timeout` passed, then keeps reading for `settle` to catch extras.
// `config`: more librdkafka consumer properties (security, ...).
std::vector<Record> consume(const std::string& brokers, const std::string& topic,
                            std::size_t at_least, std::chrono::milliseconds timeout,
                            std::chrono::milliseconds settle = std::chrono::milliseconds(500),
                            const std::vector<std::pair<std::string, std::string>>& config = {});

// Reads `topic` from the beginning until every one of `keys` has a record or
// `timeout` passed: for topics where a key may have several records (outcomes
// published again after a take-over), which can fill consume()'s `at_least`
// from one partition before another's first records arrive.
std::vector<Record> consume_keys(const std::string& brokers, const std::string& topic,
                                 const std::set<std::string>& keys, std::chrono::milliseconds timeout,
                                 const std::vector<std::pair<std::string, std::string>>& config = {});

// The same, for records told apart by their value (dead letters keep the
// original message's key, which several requests may share).
std::vector<Record> consume_values(const std::string& brokers, const std::string& topic,
                                   const std::set<std::string>& values, std::chrono::milliseconds timeout);

}  // namespace sagapool::test
