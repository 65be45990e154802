#pragma once
// The part of the Kafka layer that needs only librdkafka and Status (STYLE.md,
// "Handles and ownership"): one deleter + std::unique_ptr alias per C handle,
// so no *_destroy call appears anywhere else; which errors are fatal; and how
// a producer queues a message and serves its local queue. The kafka component
// (KafkaProducer, with logging and the project's settings) and the installed
// producer library (TransferProducer) share it.
#include <librdkafka/rdkafka.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "sagapool/status.hpp"

namespace sagapool {

// ---- Handles --------------------------------------------------------------

struct KafkaDeleter {
  void operator()(rd_kafka_t* p) const noexcept;  // rd_kafka_destroy
};
struct ConfDeleter {
  void operator()(rd_kafka_conf_t* p) const noexcept;
};
struct TopicPartitionListDeleter {
  void operator()(rd_kafka_topic_partition_list_t* p) const noexcept;
};
struct MessageDeleter {
  void operator()(rd_kafka_message_t* p) const noexcept;
};
struct HeadersDeleter {
  void operator()(rd_kafka_headers_t* p) const noexcept;
};
struct QueueDeleter {
  void operator()(rd_kafka_queue_t* p) const noexcept;
};
struct KafkaErrorDeleter {
  void operator()(rd_kafka_error_t* p) const noexcept;
};
struct MetadataDeleter {
  void operator()(const rd_kafka_metadata_t* p) const noexcept;
};

// rd_kafka_destroy blocks until librdkafka's threads are gone. For a consumer
// call rd_kafka_consumer_close first; for a producer use KafkaProducer, which
// flushes with a deadline before destroying.
using KafkaHandle = std::unique_ptr<rd_kafka_t, KafkaDeleter>;
// Ownership passes to rd_kafka_new only on success: call release() then.
using ConfPtr = std::unique_ptr<rd_kafka_conf_t, ConfDeleter>;
using TopicPartitionListPtr =
    std::unique_ptr<rd_kafka_topic_partition_list_t, TopicPartitionListDeleter>;
// A consumed message (rd_kafka_consumer_poll); destroying it returns the
// memory to librdkafka.
using MessagePtr = std::unique_ptr<rd_kafka_message_t, MessageDeleter>;
using HeadersPtr = std::unique_ptr<rd_kafka_headers_t, HeadersDeleter>;
using QueuePtr = std::unique_ptr<rd_kafka_queue_t, QueueDeleter>;
using KafkaErrorPtr = std::unique_ptr<rd_kafka_error_t, KafkaErrorDeleter>;
// From rd_kafka_metadata(); released with rd_kafka_metadata_destroy.
using MetadataPtr = std::unique_ptr<const rd_kafka_metadata_t, MetadataDeleter>;

// ---- Errors ---------------------------------------------------------------

// The one place Kafka errors meet the taxonomy: librdkafka's fatal flag (or
// err == _FATAL) -> fatal; configuration, authorization, size and unknown
// topic/partition errors -> fatal; everything else (transport, timeouts,
// leader changes, queue full, coordinator moves, librdkafka's retriable flag)
// -> retry_call.
ErrorKind classify_kafka_error(rd_kafka_resp_err_t err, bool is_fatal = false,
                               bool is_retriable = false) noexcept;

// A fatal error of an idempotent producer that a new producer instance cures
// (librdkafka: "the producer must be destroyed and re-created"): its
// sequence or producer id went out of step with a broker, e.g. after a
// leader change while a batch was being retried. Refusals by the ACLs and
// an asked-for gapless guarantee are not: a new producer meets them again.
bool cured_by_new_producer(rd_kafka_resp_err_t fatal_err) noexcept;

// "<what>: <librdkafka's description> (<ERR_NAME>)" with the kind above; ok
// for RD_KAFKA_RESP_ERR_NO_ERROR.
Status kafka_status(rd_kafka_resp_err_t err, std::string_view what);
// Same for an rd_kafka_error_t (uses its fatal/retriable flags); ok for null.
Status kafka_status(const rd_kafka_error_t* error, std::string_view what);

// ---- Producing ------------------------------------------------------------

// A value whose data() is null is a null header value (as Kafka allows).
struct MessageHeader {
  std::string_view name;
  std::string_view value;
};

// Queues a copy of `value`, with `key` (none when empty), `header_count`
// headers and `timestamp_ms` (the broker's time when 0), and `opaque` for
// its delivery report. `err` gets librdkafka's code (_QUEUE_FULL: try again
// later). C++17, like every header the producer package installs.
Status produce_copy(rd_kafka_t* rk, const std::string& topic, std::string_view key, std::string_view value,
                    const MessageHeader* headers, std::size_t header_count, void* opaque,
                    std::int64_t timestamp_ms, rd_kafka_resp_err_t& err);

// Calls produce_once(err) until the message is queued or refused for another
// reason than a full local queue. While the queue is full it serves delivery
// reports (which frees slots), for at most `wait`; then retry_call: a
// message is never dropped silently.
template <typename ProduceOnce>
Status produce_with_backpressure(rd_kafka_t* rk, std::chrono::milliseconds wait, std::string_view topic,
                                 ProduceOnce&& produce_once) {
  const auto deadline = std::chrono::steady_clock::now() + wait;
  for (;;) {
    rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;
    Status s = produce_once(err);
    if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL) return s;
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status::retry_call("kafka produce to " + std::string(topic) + ": local queue still full after " +
                                std::to_string(wait.count()) + " ms (broker unreachable or too slow?)");
    }
    (void)rd_kafka_poll(rk, 10);
  }
}

// Flushes, serving delivery reports on this thread; true when nothing is
// left queued.
bool flush_producer(rd_kafka_t* rk, std::chrono::milliseconds timeout);

// Flushes; what is still queued after `timeout` is purged and its failed
// reports served (for about a second at most), so every message queued is
// reported exactly once. Returns how many were left when the flush ran out
// (0: all delivered); `purge_error` gets rd_kafka_purge's answer.
int flush_or_purge(rd_kafka_t* rk, std::chrono::milliseconds timeout, rd_kafka_resp_err_t& purge_error);

}  // namespace sagapool
