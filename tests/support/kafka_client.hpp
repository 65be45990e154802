#pragma once
// Small Kafka clients for tests: produce raw bytes, read a whole topic, and
// start/stop a saga-broker.
#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "process.hpp"

namespace sagapool::test {

struct Record {
  std::string key;
  std::string value;
  std::map<std::string, std::string> headers;
  int partition = -1;
  long long offset = -1;
};

// A running saga-broker; stopped (SIGTERM) when destroyed.
class Broker {
 public:
  // `brokers` mock brokers (ids 1..N); the control channel is always open.
  static Broker start(const TempDir& dir, int partitions = 4, int brokers = 1);
  const std::string& bootstrap() const { return bootstrap_; }
  Process& process() { return process_; }
  // One fault-injection command (`saga-broker --control-fifo`), e.g.
  // "down 2"; returns once the broker logged that it carried it out, and
  // throws if it refused it.
  void control(const std::string& command);

 private:
  Process process_;
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
std::vector<Record> consume(const std::string& brokers, const std::string& topic,
                            std::size_t at_least, std::chrono::milliseconds timeout,
                            std::chrono::milliseconds settle = std::chrono::milliseconds(500));

}  // namespace sagapool::test
