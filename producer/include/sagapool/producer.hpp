#pragma once
// The producer library upstream systems link: a transfer request value type,
// its wire format (DESIGN.md, "Messages"), and an idempotent producer that
// publishes requests keyed by source account.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sagapool/config.hpp"
#include "sagapool/kafka.hpp"
#include "sagapool/status.hpp"

namespace sagapool {

inline constexpr std::string_view kDefaultRequestsTopic = "transfers.requests";

struct TransferRequest {
  std::string id;        // idempotency key, 1..128 of [A-Za-z0-9._:-]
  std::string from;      // source account id (also the Kafka key)
  std::string to;        // destination account id
  std::int64_t amount = 0;  // minor units, >= 1
  std::string currency;  // optional: empty = not sent
  std::string metadata;  // optional JSON object text, inserted verbatim; empty = not sent
};

// The request as one JSON line in DESIGN.md's format and key order:
// {"id": "...", "from": "...", "to": "...", "amount": N[, "currency": "..."][, "metadata": {...}]}
// Strings are JSON-escaped; metadata is inserted verbatim.
std::string to_json(const TransferRequest& r);
// Same, appended to `out` (lets a hot loop reuse one buffer).
void append_json(std::string& out, const TransferRequest& r);

// One per published message, on the thread that calls poll()/flush()/close().
struct TransferDelivery {
  void* opaque = nullptr;  // what was passed to publish()
  Status status;           // ok = acknowledged by the broker (acks=all)
  std::int32_t partition = -1;
  std::int64_t offset = -1;
};
using DeliveryCallback = std::function<void(const TransferDelivery&)>;

struct TransferProducerOptions {
  std::string brokers;
  std::string topic = std::string(kDefaultRequestsTopic);
  std::vector<KeyValue> kafka_opts;  // override the producer defaults (kafka.hpp)
  std::string client_id = "sagapool-producer";
  std::chrono::milliseconds queue_full_wait{30'000};
};

// Not thread-safe: use one per thread (each holds its own librdkafka handle)
// or serialize calls. Idempotent (enable.idempotence=true): librdkafka's
// retries never duplicate or reorder a partition's messages.
class TransferProducer final : private DeliveryHandler {
 public:
  static Status create(TransferProducerOptions options, std::unique_ptr<TransferProducer>& out,
                       DeliveryCallback on_delivery = {});
  ~TransferProducer() override;
  TransferProducer(const TransferProducer&) = delete;
  TransferProducer& operator=(const TransferProducer&) = delete;

  // Validates `r` (parse_request) and queues it with key = r.from. An
  // invalid request is not sent: fatal Status naming the rule it breaks.
  Status publish(const TransferRequest& r, void* opaque = nullptr);
  // Queues bytes as they are (no validation; empty key = no key). This is
  // how tests and saga-producer --file send deliberately invalid input.
  Status publish_raw(std::string_view key, std::string_view value, void* opaque = nullptr);

  // Serve delivery reports (callback and counters).
  int poll(std::chrono::milliseconds timeout) { return producer_->poll(timeout); }
  // True when everything published so far was reported within `timeout`.
  bool flush(std::chrono::milliseconds timeout) { return producer_->flush(timeout); }
  // Flush with the deadline, then purge and report what is left as failed;
  // returns how many were not delivered by the deadline.
  int close(std::chrono::milliseconds flush_timeout) { return producer_->close(flush_timeout); }

  std::uint64_t published() const noexcept { return published_; }
  std::uint64_t delivered() const noexcept { return delivered_; }
  std::uint64_t failed() const noexcept { return failed_; }
  std::uint64_t in_flight() const noexcept { return published_ - delivered_ - failed_; }
  // The first delivery error seen ("" when none): enough for a summary line.
  const std::string& first_error() const noexcept { return first_error_; }
  const std::string& topic() const noexcept { return topic_; }

 private:
  TransferProducer(std::string topic, DeliveryCallback on_delivery);
  void on_delivery(const rd_kafka_message_t& m) override;

  std::string topic_;
  DeliveryCallback on_delivery_;
  std::string buffer_;  // reused JSON buffer: no allocation per publish once warm
  std::uint64_t published_ = 0;
  std::uint64_t delivered_ = 0;
  std::uint64_t failed_ = 0;
  std::string first_error_;
  std::unique_ptr<KafkaProducer> producer_;  // last: closed before the rest goes
};

}  // namespace sagapool
