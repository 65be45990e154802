#pragma once
// What the worker's loop needs from the outside, as three small interfaces:
// a source of request messages (the consumer group), an output for outcomes
// and dead letters (the producer), and a clock. saga-worker wires librdkafka
// and the system clock (kafka_io.hpp); the simulation (tests/sim) wires its
// simulated Kafka and manual clock, and so runs the real Worker.
//
// Kafka's error codes stay the vocabulary: the worker tells a message the
// broker refuses as too large, or a write the ACLs refuse, by them.
#include <librdkafka/rdkafka.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sagapool/kafka.hpp"
#include "sagapool/status.hpp"

namespace sagapool {

// A consumed request. The views stay valid until the next poll_batch.
struct ConsumedMessage {
  std::string_view topic;
  std::int32_t partition = 0;
  std::int64_t offset = 0;
  std::int64_t timestamp_ms = -1;  // -1: none
  std::string_view key;
  std::string_view value;
  const void* handle = nullptr;  // the source's own, for headers_of
};

// A header of a consumed message, copied. nullopt: a null value.
struct CopiedHeader {
  std::string name;
  std::optional<std::string> value;
};

// A position in one partition of the source's topic: the next offset to
// consume (one past the last message covered).
struct PartitionOffset {
  std::int32_t partition = 0;
  std::int64_t offset = 0;
};

// The consumer-group member the worker reads requests from. Offsets are
// stored by hand, only after the work they cover is durable, and committed
// by the source (periodically, on revocation and on close).
class RequestSource {
 public:
  virtual ~RequestSource() = default;
  // Replaces `out` with up to `max` messages, waiting at most `timeout` for
  // the first. Non-ok only for fatal errors (no retry can help).
  virtual Status poll_batch(std::size_t max, std::chrono::milliseconds timeout,
                            std::vector<ConsumedMessage>& out) = 0;
  // Stores offsets to be committed. A partition revoked meanwhile is skipped:
  // its next owner consumes the messages again and finds them ingested.
  virtual Status store_offsets(std::span<const PartitionOffset> offsets) = 0;
  // The next messages of these partitions start at these offsets.
  virtual Status seek(std::span<const PartitionOffset> offsets) = 0;
  // Replaces `out` with a copy of the message's headers, in order. Only on
  // the rare paths that need them (dead letters): the batch never does.
  virtual void headers_of(const ConsumedMessage& m, std::vector<CopiedHeader>& out) = 0;
  // Leaves the group, committing stored offsets. Idempotent.
  virtual void close() = 0;
};

// One delivery report: `opaque` as given to produce, err 0 when delivered.
struct DeliveryReport {
  void* opaque = nullptr;
  rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;
  std::string_view topic;
  std::string_view key;
};

class DeliveryListener {
 public:
  virtual ~DeliveryListener() = default;
  virtual void on_delivery(const DeliveryReport& report) = 0;
};

// The producer of outcomes and dead letters. Every message produce() queued
// gets exactly one report, served by poll(), flush() or close() on the
// caller's thread.
class MessageOutput {
 public:
  virtual ~MessageOutput() = default;
  virtual void set_listener(DeliveryListener* listener) = 0;
  // Queues one message (copied). `err` receives Kafka's code when it is not
  // queued, so the caller tells a message refused for its size.
  // `timestamp_ms`: its create time, 0 = now.
  virtual Status produce(const std::string& topic, std::string_view key, std::string_view value,
                         std::span<const MessageHeader> headers, void* opaque,
                         rd_kafka_resp_err_t* err, std::int64_t timestamp_ms) = 0;
  virtual int poll(std::chrono::milliseconds timeout) = 0;
  // True when everything queued was reported within `timeout`.
  virtual bool flush(std::chrono::milliseconds timeout) = 0;
  virtual int outq_len() const = 0;
  // Flushes, then drops what is left (reported as failed).
  virtual void close(std::chrono::milliseconds flush_timeout) = 0;
  // Ok while the output can go on. Called once per loop: a producer whose
  // idempotence state broke is replaced here, after what it had not
  // delivered was reported failed (as by close); other fatal errors return.
  virtual Status keep_usable() = 0;
};

class WorkerClock {
 public:
  virtual ~WorkerClock() = default;
  virtual std::chrono::steady_clock::time_point now() = 0;
  virtual std::int64_t wall_ms() = 0;  // milliseconds since the epoch
  virtual void sleep_for(std::chrono::milliseconds d) = 0;
};

}  // namespace sagapool
