#pragma once
// A consumer-group member for transfers.requests: cooperative-sticky
// assignment, batches taken oldest first across the assigned partitions, and
// offsets stored by hand (enable.auto.offset.store=false) only after the work
// they cover is durable; librdkafka's auto-commit then commits what was
// stored.
//
// Oldest first: each assigned partition is read from its own queue, and a
// batch takes the message with the oldest timestamp among the partitions'
// next ones. librdkafka's shared queue takes every partition at about the
// same pace, so under a backlog of unequal partitions a batch joined
// requests produced far apart: the rows they insert (keyed by request id)
// then land on as many pages, and a lagging partition's requests waited
// longer than anyone else's.
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

  // Fills `out` with up to `max` messages, oldest first (waiting at most
  // `timeout` for the first). Error events are logged and not returned,
  // except a refusal by the brokers' ACLs (no Read on the topic or the
  // group): fatal, as no retry can help. The caller owns the messages.
  Status poll_batch(std::size_t max, std::chrono::milliseconds timeout, std::vector<MessagePtr>& out);

  // Stores them, to be committed by auto-commit (or on close).
  Status store_offsets(rd_kafka_topic_partition_list_t& offsets);
  // The next messages of these partitions start at these offsets (what was
  // fetched beyond them is dropped, here and in librdkafka).
  Status seek(rd_kafka_topic_partition_list_t& offsets);

  // Partitions currently assigned to this member.
  int assigned_partitions() const noexcept { return static_cast<int>(partitions_.size()); }
  // Messages fetched into the assigned partitions' queues and not yet taken
  // (a message fetched before a seek counts until a poll drops it).
  std::size_t prefetched() const noexcept;

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

  // An assigned partition: its own queue, not forwarded to the consumer
  // queue, and the next message taken from it, if any.
  struct Partition {
    int32_t id;
    QueuePtr queue;
    MessagePtr next;
    int64_t next_timestamp = 0;
  };
  void on_assigned(rd_kafka_t* rk, const rd_kafka_topic_partition_list_t& partitions);
  void on_revoked(const rd_kafka_topic_partition_list_t* partitions);  // nullptr: all
  // Serves the consumer queue (rebalances, errors, statistics) for up to
  // `wait_ms`. A message found there (only a partition without a queue of
  // its own sends any) goes to `out`, until `out` holds `max`.
  Status serve_events(int wait_ms, std::size_t max, std::vector<MessagePtr>& out);
  // Takes p's next message from its queue, if one is there.
  Status take_next(Partition& p);
  Status check(const rd_kafka_message_t& m) const;  // fatal for an ACL refusal

  KafkaHandle rk_;
  QueuePtr queue_;
  std::string topic_, group_;  // for error messages
  std::vector<Partition> partitions_;
  bool ever_assigned_ = false;  // see close()
  bool closed_ = false;
};

}  // namespace sagapool
