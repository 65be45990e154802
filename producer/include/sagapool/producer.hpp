#pragma once
// The producer library upstream systems link: an idempotent Kafka producer
// that publishes transfer requests keyed by source account. It needs only
// librdkafka and sagapool::request, both installed with it (see
// producer/README.md), and it never logs by itself.
#include <librdkafka/rdkafka.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sagapool/kafka_base.hpp"
#include "sagapool/status.hpp"
#include "sagapool/transfer_request.hpp"

namespace sagapool {

inline constexpr std::string_view kDefaultRequestsTopic = "transfers.requests";

// One per published message, on the thread that calls poll()/flush()/close().
struct TransferDelivery {
  void* opaque = nullptr;  // what was passed to publish()
  Status status;           // ok = acknowledged by the broker (acks=all)
  std::int32_t partition = -1;
  std::int64_t offset = -1;
};
using DeliveryCallback = std::function<void(const TransferDelivery&)>;

struct TransferProducerOptions {
  std::string brokers;  // bootstrap.servers
  std::string topic = std::string(kDefaultRequestsTopic);
  // librdkafka properties, set in order after these defaults, so they win:
  // enable.idempotence=true, compression.type=lz4, linger.ms=25,
  // batch.num.messages=10000, queue.buffering.max.messages=500000.
  std::vector<std::pair<std::string, std::string>> kafka_opts;
  std::string client_id = "sagapool-producer";
  // How long publish() serves delivery reports and retries while
  // librdkafka's queue is full before it gives up with retry_call (the
  // message is then not queued).
  std::chrono::milliseconds queue_full_wait{30'000};
  // Called once the properties are set, before the client exists: the place
  // for what a property cannot say (rd_kafka_conf_set_log_cb, error_cb, an
  // OAUTHBEARER token refresh). Without it librdkafka logs to stderr. The
  // delivery report callback and the conf's opaque are the producer's.
  std::function<void(rd_kafka_conf_t&)> configure;
};

// Not thread-safe: use one per thread (each holds its own librdkafka handle)
// or serialize calls. Idempotent (enable.idempotence=true): librdkafka's
// retries never duplicate or reorder a partition's messages.
class TransferProducer final {
 public:
  static Status create(TransferProducerOptions options, std::unique_ptr<TransferProducer>& out,
                       DeliveryCallback on_delivery = {});
  // close() with a 10 s flush if not closed yet.
  ~TransferProducer();
  TransferProducer(const TransferProducer&) = delete;
  TransferProducer& operator=(const TransferProducer&) = delete;

  // Validates `r` (parse_request) and queues it with key = r.from. An
  // invalid request is not sent: fatal Status naming the rule it breaks.
  Status publish(const TransferRequest& r, void* opaque = nullptr);
  // Queues bytes as they are (no validation; empty key = no key). This is
  // how tests and saga-producer --file send deliberately invalid input.
  Status publish_raw(std::string_view key, std::string_view value, void* opaque = nullptr);

  // Serves delivery reports (callback and counters); returns how many.
  int poll(std::chrono::milliseconds timeout);
  // True when everything published so far was reported within `timeout`.
  bool flush(std::chrono::milliseconds timeout);
  // Flush with the deadline, then purge and report what is left as failed
  // (every published message is reported exactly once); returns how many
  // were not delivered by the deadline. publish() afterwards is fatal.
  int close(std::chrono::milliseconds flush_timeout);

  std::uint64_t published() const noexcept { return published_; }
  std::uint64_t delivered() const noexcept { return delivered_; }
  std::uint64_t failed() const noexcept { return failed_; }
  std::uint64_t in_flight() const noexcept { return published_ - delivered_ - failed_; }
  // The first delivery error seen ("" when none): enough for a summary line.
  const std::string& first_error() const noexcept { return first_error_; }
  const std::string& topic() const noexcept { return topic_; }

 private:
  TransferProducer(std::string topic, DeliveryCallback on_delivery,
                   std::chrono::milliseconds queue_full_wait);
  static void delivery_report(rd_kafka_t* rk, const rd_kafka_message_t* m, void* opaque);
  void on_delivery(const rd_kafka_message_t& m);
  int outq_len() const;

  std::string topic_;
  DeliveryCallback on_delivery_;
  std::chrono::milliseconds queue_full_wait_;
  std::string buffer_;  // reused JSON buffer: no allocation per publish once warm
  std::uint64_t published_ = 0;
  std::uint64_t delivered_ = 0;
  std::uint64_t failed_ = 0;
  std::string first_error_;
  KafkaHandle rk_;  // last: closed before the rest goes
};

}  // namespace sagapool
