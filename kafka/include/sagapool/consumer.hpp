#pragma once
// A consumer-group member for transfers.requests: cooperative-sticky
// assignment, batches from the consumer queue, and offsets stored by hand
// (enable.auto.offset.store=false) only after the work they cover is durable;
// librdkafka's auto-commit then commits what was stored.
#include <librdkafka/rdkafka.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sagapool/config.hpp"
#include "sagapool/kafka.hpp"

namespace sagapool {

// Receives librdkafka's statistics JSON (STATISTICS.md) every
// `statistics.interval.ms`, on the thread that polls the consumer. Must not
// block; the text is only valid during the call.
class ConsumerStatsListener {
 public:
  virtual ~ConsumerStatsListener() = default;
  virtual void on_consumer_stats(std::string_view json) = 0;
};

// Consumer statistics default to one report per this interval when a
// listener is installed; `--kafka-opt statistics.interval.ms=N` overrides it.
inline constexpr const char* kConsumerStatsIntervalMs = "1000";

struct ConsumerOptions {
  std::string brokers;
  std::string group;
  std::string topic;
  std::string client_id;
  std::vector<KeyValue> kafka_opts;  // applied after our defaults
};

class Consumer {
 public:
  static Status create(const ConsumerOptions& options, std::unique_ptr<Consumer>& out);
  ~Consumer();
  Consumer(const Consumer&) = delete;
  Consumer& operator=(const Consumer&) = delete;

  // Fills `out` with up to `max` messages (waiting at most `timeout` for the
  // first). Error events are logged and not returned, except a refusal by
  // the brokers' ACLs (no Read on the topic or the group): fatal, as no
  // retry can help. The caller owns the messages.
  Status poll_batch(std::size_t max, std::chrono::milliseconds timeout, std::vector<MessagePtr>& out);

  // Stores them, to be committed by auto-commit (or on close).
  Status store_offsets(rd_kafka_topic_partition_list_t& offsets);
  // The next messages of these partitions start at these offsets (what was
  // fetched beyond them is dropped).
  Status seek(rd_kafka_topic_partition_list_t& offsets);

  // Partitions currently assigned to this member.
  int assigned_partitions() const noexcept { return assigned_; }

  // Leaves the group, committing stored offsets. Idempotent.
  void close();

  // Consumers created after this call report their statistics to `listener`
  // (nullptr: no statistics). Set once at start-up, before Worker::create;
  // the listener must outlive every consumer.
  static void set_stats_listener(ConsumerStatsListener* listener) noexcept;

 private:
  Consumer() = default;
  static void rebalance_cb(rd_kafka_t* rk, rd_kafka_resp_err_t err,
                           rd_kafka_topic_partition_list_t* partitions, void* opaque);
  static int stats_cb(rd_kafka_t* rk, char* json, std::size_t json_len, void* opaque);

  KafkaHandle rk_;
  QueuePtr queue_;
  std::string topic_, group_;  // for error messages
  int assigned_ = 0;
  bool ever_assigned_ = false;  // see close()
  bool closed_ = false;
};

}  // namespace sagapool
