#pragma once
// RAII for librdkafka's C API (STYLE.md, "Handles and ownership"): one
// deleter + std::unique_ptr alias per C handle, so no *_destroy call appears
// anywhere else; Kafka errors mapped onto ErrorKind in one function; and
// KafkaProducer, the idempotent producer used by the worker (results, dead
// letters) and by the producer library.
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
#include "sagapool/kafka_errors.hpp"
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


// "<what>: <librdkafka's description> (<ERR_NAME>)" with the kind above; ok
// for RD_KAFKA_RESP_ERR_NO_ERROR.
Status kafka_status(rd_kafka_resp_err_t err, std::string_view what);
// Same for an rd_kafka_error_t (uses its fatal/retriable flags); ok for null.
Status kafka_status(const rd_kafka_error_t* error, std::string_view what);

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

// A value whose data() is null is a null header value (as Kafka allows).
struct MessageHeader {
  std::string_view name;
  std::string_view value;
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
  // compression.type=lz4, linger.ms=5, batch.num.messages=10000,
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

  // A fatal librdkafka error was raised (e.g. idempotence sequence broken);
  // the producer cannot continue.
  bool has_fatal_error() const noexcept { return fatal_.load(std::memory_order_relaxed); }
  Status fatal_error() const;

  std::uint64_t delivered() const noexcept { return delivered_.load(std::memory_order_relaxed); }
  std::uint64_t failed() const noexcept { return failed_.load(std::memory_order_relaxed); }

  rd_kafka_t* handle() const noexcept { return rk_.get(); }

 private:
  KafkaProducer(DeliveryHandler* handler, const KafkaProducerOptions& options);
  static void dr_msg_cb(rd_kafka_t* rk, const rd_kafka_message_t* m, void* opaque);
  static void error_cb(rd_kafka_t* rk, int err, const char* reason, void* opaque);
  Status produce_once(const std::string& topic, std::string_view key, std::string_view value,
                      std::span<const MessageHeader> headers, void* opaque,
                      std::int64_t timestamp_ms, rd_kafka_resp_err_t& err);

  DeliveryHandler* handler_;
  std::chrono::milliseconds queue_full_wait_;
  std::chrono::milliseconds close_flush_timeout_;
  std::atomic<bool> fatal_{false};
  std::atomic<std::uint64_t> delivered_{0};
  std::atomic<std::uint64_t> failed_{0};
  KafkaHandle rk_;  // last member: destroyed first, while the rest is alive
};

}  // namespace sagapool
