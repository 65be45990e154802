#pragma once
// The Kafka layer the programs share, on kafka_base.hpp (handles, errors,
// producing): librdkafka configuration and its logging, the start-up check,
// and KafkaProducer, the worker's idempotent producer (results, dead
// letters).
#include <librdkafka/rdkafka.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sagapool/config.hpp"
#include "sagapool/kafka_base.hpp"
#include "sagapool/status.hpp"

namespace sagapool {

// ---- Configuration --------------------------------------------------------

// Sets one property. A failure names the key; a secret key's value (see
// is_secret_key) never appears in the message.
Status conf_set(rd_kafka_conf_t& conf, const std::string& key, const std::string& value);

// A new conf holding `opts` in order (later pairs win); fatal Status naming
// the first bad key.
Status make_conf(const std::vector<KeyValue>& opts, ConfPtr& out);

// Routes librdkafka's log lines to spdlog at the matching level and its error
// callback to spdlog (warn, or error with "FATAL" for fatal errors). Used by
// every handle we create. The error callback looks up the fatal error on the
// handle; it does not touch the conf's opaque.
void install_log_callbacks(rd_kafka_conf_t& conf);

// Start-up check shared by the programs: waits up to `timeout` until a
// broker answers and every topic in `topics` is visible, and fails with one
// clear line when none answers, when the brokers refuse the credentials or
// the TLS handshake (at once: no wait helps), or when a topic is missing or
// hidden from this principal (no Describe ACL).
Status check_kafka(const std::string& brokers, const std::vector<KeyValue>& kafka_opts,
                   const std::vector<std::string>& topics, std::chrono::milliseconds timeout);

// ---- Producer -------------------------------------------------------------

// Receives one delivery report per produced message, from poll()/flush()/
// close() on the caller's thread. The message's per-message opaque (the
// `opaque` passed to produce) is m._private; m.err says whether it was
// delivered. Must outlive the KafkaProducer it is given to.
struct DeliveryHandler {
  virtual ~DeliveryHandler() = default;
  virtual void on_delivery(const rd_kafka_message_t& m) = 0;
};


struct KafkaProducerOptions {
  std::string brokers;               // bootstrap.servers
  std::vector<KeyValue> kafka_opts;  // applied after our defaults, so they win
  std::string client_id = "sagapool";
  // How long produce() keeps polling and retrying while librdkafka's queue
  // is full before giving up with retry_call (the message is not queued).
  std::chrono::milliseconds queue_full_wait{30'000};
  // close()/destructor: how long to flush before purging what is left.
  std::chrono::milliseconds close_flush_timeout{10'000};
};

class KafkaProducer {
 public:
  // Defaults (each overridable through kafka_opts): enable.idempotence=true,
  // compression.type=lz4, linger.ms=25, batch.num.messages=10000,
  // queue.buffering.max.messages=500000. `handler` may be null (reports are
  // then only counted).
  static Status create(const KafkaProducerOptions& options, DeliveryHandler* handler,
                       std::unique_ptr<KafkaProducer>& out);

  KafkaProducer(const KafkaProducer&) = delete;
  KafkaProducer& operator=(const KafkaProducer&) = delete;
  // close(options.close_flush_timeout) if not closed yet.
  ~KafkaProducer();

  // Queues one message (payloads copied, RD_KAFKA_MSG_F_COPY). An empty key
  // means no key (partitioned by librdkafka's default partitioner otherwise
  // by key hash). On QUEUE_FULL it polls (serving delivery reports) and
  // retries until `queue_full_wait`, never dropping silently. Each message
  // that was queued gets exactly one delivery report. `err`, when given,
  // receives librdkafka's error code (the caller tells a message librdkafka
  // refuses, such as one over message.max.bytes, from other failures).
  // `timestamp_ms` (create time, ms since the epoch): 0 = now.
  Status produce(const std::string& topic, std::string_view key, std::string_view value,
                 std::span<const MessageHeader> headers = {}, void* opaque = nullptr,
                 rd_kafka_resp_err_t* err = nullptr, std::int64_t timestamp_ms = 0);

  // Serves delivery reports; returns how many were served.
  int poll(std::chrono::milliseconds timeout);
  // Waits up to `timeout` for everything queued to be delivered (or failed),
  // serving reports; true when the out-queue drained.
  bool flush(std::chrono::milliseconds timeout);
  // rd_kafka_outq_len: messages queued, in flight or awaiting their report,
  // plus librdkafka requests and events not yet served; 0 = all reported.
  int outq_len() const;

  // Shutdown per STYLE.md: flush with the deadline -> check the out-queue ->
  // purge what is left (each purged message is reported as failed with
  // _PURGE_QUEUE/_PURGE_INFLIGHT) -> destroy. Returns how many messages had
  // not been delivered by the deadline. Idempotent; produce() after close()
  // is a fatal Status.
  int close(std::chrono::milliseconds flush_timeout);

  // A fatal librdkafka error (e.g. idempotence sequence broken), asked of
  // librdkafka: the producer cannot continue, and produce() refuses every
  // message with it. Ok while there is none.
  Status fatal_error() const;
  rd_kafka_resp_err_t fatal_code() const;  // NO_ERROR while there is none

  std::uint64_t delivered() const noexcept { return delivered_.load(std::memory_order_relaxed); }
  std::uint64_t failed() const noexcept { return failed_.load(std::memory_order_relaxed); }

  rd_kafka_t* handle() const noexcept { return rk_.get(); }

 private:
  KafkaProducer(DeliveryHandler* handler, const KafkaProducerOptions& options);
  static void dr_msg_cb(rd_kafka_t* rk, const rd_kafka_message_t* m, void* opaque);

  DeliveryHandler* handler_;
  std::chrono::milliseconds queue_full_wait_;
  std::chrono::milliseconds close_flush_timeout_;
  std::atomic<std::uint64_t> delivered_{0};
  std::atomic<std::uint64_t> failed_{0};
  KafkaHandle rk_;  // last member: destroyed first, while the rest is alive
};

}  // namespace sagapool
