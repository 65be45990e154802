#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <string>
#include <stop_token>
#include <thread>
#include <vector>

#include "mock.hpp"
#include "sagapool/kafka.hpp"

namespace sagapool::broker {

// Every `interval`, asks the mock (as an ordinary Kafka client) for each
// partition's log-start offset and logs a warning when it moved: that means
// the mock dropped old messages, which it otherwise does silently.
class RetentionWatcher {
 public:
  RetentionWatcher(std::string bootstrap, std::vector<std::string> topics, int partitions,
                   std::chrono::milliseconds interval);
  ~RetentionWatcher();
  RetentionWatcher(const RetentionWatcher&) = delete;
  RetentionWatcher& operator=(const RetentionWatcher&) = delete;

  // False (with a warning logged) when the client could not be created.
  bool start();
  // Joins the thread (at most one ~1 s query in progress), then destroys the client.
  void stop();

 private:
  void run(std::stop_token st);
  void check_topic(const std::string& topic, std::vector<std::int64_t>& seen,
                   const std::stop_token& st);

  std::string bootstrap_;
  std::vector<std::string> topics_;
  int partitions_;
  std::chrono::milliseconds interval_;
  std::condition_variable_any cv_;
  KafkaHandle client_;
  std::jthread thread_;
};

}  // namespace sagapool::broker
