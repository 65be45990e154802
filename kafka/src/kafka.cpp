#include "sagapool/kafka.hpp"

#include <spdlog/spdlog.h>

#include <array>
#include <chrono>
#include <mutex>
#include <thread>

namespace sagapool {

// ---- Errors ---------------------------------------------------------------


// ---- Configuration --------------------------------------------------------

Status conf_set(rd_kafka_conf_t& conf, const std::string& key, const std::string& value) {
  std::array<char, 512> errstr{};
  const rd_kafka_conf_res_t r =
      rd_kafka_conf_set(&conf, key.c_str(), value.c_str(), errstr.data(), errstr.size());
  if (r == RD_KAFKA_CONF_OK) return Status::ok();
  std::string m = "kafka option '" + key + "': ";
  if (r == RD_KAFKA_CONF_UNKNOWN) {
    m += "no such librdkafka property";
  } else if (is_secret_key(key)) {
    // librdkafka's message quotes the value; a secret must never be printed.
    m += "invalid value (not shown: secret)";
  } else {
    m += errstr.data();
  }
  return Status::fatal(std::move(m));
}

Status make_conf(const std::vector<KeyValue>& opts, ConfPtr& out) {
  ConfPtr conf(rd_kafka_conf_new());
  for (const KeyValue& kv : opts) {
    if (Status s = conf_set(*conf, kv.key, kv.value); !s) return s;
  }
  out = std::move(conf);
  return Status::ok();
}

namespace {

spdlog::level::level_enum spdlog_level(int syslog_level) noexcept {
  // librdkafka uses syslog levels: 0 emerg .. 7 debug.
  if (syslog_level <= 2) return spdlog::level::critical;
  if (syslog_level == 3) return spdlog::level::err;
  if (syslog_level == 4) return spdlog::level::warn;
  if (syslog_level <= 6) return spdlog::level::info;
  return spdlog::level::debug;
}

void log_cb(const rd_kafka_t* rk, int level, const char* fac, const char* buf) {
  const auto lvl = spdlog_level(level);
  if (!spdlog::should_log(lvl)) return;
  spdlog::log(lvl, "librdkafka {} {}: {}", rd_kafka_name(rk), fac, buf);
}

// Every handle's error callback.
void error_cb(rd_kafka_t* rk, int err_code, const char* reason, void* /*opaque*/) {
  const auto err = static_cast<rd_kafka_resp_err_t>(err_code);
  if (err == RD_KAFKA_RESP_ERR__FATAL) {
    std::array<char, 512> buf{};
    const rd_kafka_resp_err_t orig = rd_kafka_fatal_error(rk, buf.data(), buf.size());
    spdlog::error("kafka {}: FATAL error {}: {}", rd_kafka_name(rk), rd_kafka_err2name(orig),
                  buf.data());
    return;
  }
  // All-brokers-down and transport errors are expected during broker
  // restarts; librdkafka keeps retrying, so they are warnings.
  spdlog::warn("kafka {}: {} ({})", rd_kafka_name(rk), reason, rd_kafka_err2name(err));
}

}  // namespace

void install_log_callbacks(rd_kafka_conf_t& conf) {
  rd_kafka_conf_set_log_cb(&conf, log_cb);
  rd_kafka_conf_set_error_cb(&conf, error_cb);
}

// ---- Start-up check ---------------------------------------------------------

namespace {

// What librdkafka's error callback reported while check_kafka waited.
struct StartupErrors {
  std::mutex mu;
  rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;
  std::string reason;
};

void record_error(rd_kafka_t*, int err, const char* reason, void* opaque) {
  if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN) return;  // the reason before it says more
  auto& e = *static_cast<StartupErrors*>(opaque);
  std::lock_guard lock(e.mu);
  e.err = static_cast<rd_kafka_resp_err_t>(err);
  e.reason = reason;
}

}  // namespace

Status check_kafka(const std::string& brokers, const std::vector<KeyValue>& kafka_opts,
                   const std::vector<std::string>& topics, std::chrono::milliseconds timeout) {
  std::vector<KeyValue> opts = {{"bootstrap.servers", brokers}, {"log_level", "0"}};
  opts.insert(opts.end(), kafka_opts.begin(), kafka_opts.end());
  ConfPtr conf;
  if (Status s = make_conf(opts, conf); !s) return s;
  install_log_callbacks(*conf);  // a `debug` option would otherwise print raw lines
  StartupErrors errors;
  rd_kafka_conf_set_error_cb(conf.get(), record_error);
  rd_kafka_conf_set_opaque(conf.get(), &errors);
  std::array<char, 512> err{};
  KafkaHandle rk(rd_kafka_new(RD_KAFKA_PRODUCER, conf.get(), err.data(), err.size()));
  if (!rk) return Status::fatal(std::string("cannot create Kafka client: ") + err.data());
  (void)conf.release();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string missing;
  rd_kafka_resp_err_t e = RD_KAFKA_RESP_ERR__TIMED_OUT;
  do {
    const struct rd_kafka_metadata* md = nullptr;
    e = rd_kafka_metadata(rk.get(), 1, nullptr, &md, 500);
    rd_kafka_poll(rk.get(), 0);  // serves the error callback
    if (!e) {
      // All topics: the brokers list only those this principal may Describe.
      missing.clear();
      for (const std::string& topic : topics) {
        bool seen = false;
        for (int i = 0; i < md->topic_cnt && !seen; ++i) {
          seen = topic == md->topics[i].topic && !md->topics[i].err;
        }
        if (!seen) missing += (missing.empty() ? "" : ", ") + topic;
      }
      rd_kafka_metadata_destroy(md);
      if (missing.empty()) return Status::ok();
    }
    {
      std::lock_guard lock(errors.mu);
      if (errors.err == RD_KAFKA_RESP_ERR__AUTHENTICATION || errors.err == RD_KAFKA_RESP_ERR__SSL) {
        return Status::fatal("Kafka at " + brokers + " refused the connection: " + errors.reason);
      }
    }
    if (!e) std::this_thread::sleep_for(std::chrono::milliseconds(250));
  } while (std::chrono::steady_clock::now() < deadline);
  const std::string secs = std::to_string(timeout.count() / 1000) + "s";
  if (!e) {
    return Status::fatal("Kafka topic(s) " + missing + " not found within " + secs +
                         ": they do not exist, or this principal may not Describe them (create "
                         "them, or grant the ACLs: docs/kafka.md)");
  }
  std::string why = rd_kafka_err2str(e);
  {
    std::lock_guard lock(errors.mu);
    if (!errors.reason.empty()) why = errors.reason;
  }
  return Status::fatal("no Kafka broker answered at " + brokers + " within " + secs + ": " + why);
}

// ---- Producer -------------------------------------------------------------

KafkaProducer::KafkaProducer(DeliveryHandler* handler, const KafkaProducerOptions& options)
    : handler_(handler),
      queue_full_wait_(options.queue_full_wait),
      close_flush_timeout_(options.close_flush_timeout) {}

Status KafkaProducer::create(const KafkaProducerOptions& options, DeliveryHandler* handler,
                             std::unique_ptr<KafkaProducer>& out) {
  if (options.brokers.empty()) return Status::fatal("kafka producer: no brokers given");
  std::vector<KeyValue> opts = {
      {"bootstrap.servers", options.brokers},
      {"client.id", options.client_id},
      {"enable.idempotence", "true"},
      {"compression.type", "lz4"},
      // Outcomes are small and many: a longer wait makes fewer, larger
      // produce requests, whose per-request cost the broker pays
      // (bench/REPORT.md, "The thirteenth session").
      {"linger.ms", "25"},
      {"batch.num.messages", "10000"},
      {"queue.buffering.max.messages", "500000"},
  };
  opts.insert(opts.end(), options.kafka_opts.begin(), options.kafka_opts.end());
  ConfPtr conf;
  if (Status s = make_conf(opts, conf); !s) return s;

  // The producer's address is the handle's opaque, so it must not move:
  // it lives behind a unique_ptr from here on.
  std::unique_ptr<KafkaProducer> p(new KafkaProducer(handler, options));
  install_log_callbacks(*conf);
  rd_kafka_conf_set_dr_msg_cb(conf.get(), &KafkaProducer::dr_msg_cb);
  rd_kafka_conf_set_opaque(conf.get(), p.get());

  std::array<char, 512> errstr{};
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf.get(), errstr.data(), errstr.size());
  if (rk == nullptr) return Status::fatal(std::string("kafka producer: ") + errstr.data());
  (void)conf.release();  // rd_kafka_new owns the conf now
  p->rk_.reset(rk);
  out = std::move(p);
  return Status::ok();
}

KafkaProducer::~KafkaProducer() {
  if (rk_) (void)close(close_flush_timeout_);
}

void KafkaProducer::dr_msg_cb(rd_kafka_t* /*rk*/, const rd_kafka_message_t* m, void* opaque) {
  auto* self = static_cast<KafkaProducer*>(opaque);
  if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
    self->delivered_.fetch_add(1, std::memory_order_relaxed);
  } else {
    self->failed_.fetch_add(1, std::memory_order_relaxed);
  }
  if (self->handler_ != nullptr) self->handler_->on_delivery(*m);
}

Status KafkaProducer::fatal_error() const {
  if (!rk_) return Status::ok();
  std::array<char, 512> buf{};
  const rd_kafka_resp_err_t err = rd_kafka_fatal_error(rk_.get(), buf.data(), buf.size());
  if (err == RD_KAFKA_RESP_ERR_NO_ERROR) return Status::ok();
  return Status::fatal(std::string("kafka producer fatal error ") + rd_kafka_err2name(err) +
                       ": " + buf.data());
}

rd_kafka_resp_err_t KafkaProducer::fatal_code() const {
  if (!rk_) return RD_KAFKA_RESP_ERR_NO_ERROR;
  std::array<char, 8> unused{};
  return rd_kafka_fatal_error(rk_.get(), unused.data(), unused.size());
}

Status KafkaProducer::produce(const std::string& topic, std::string_view key,
                              std::string_view value, std::span<const MessageHeader> headers,
                              void* opaque, rd_kafka_resp_err_t* err_out, std::int64_t timestamp_ms) {
  if (!rk_) return Status::fatal("kafka produce: the producer is closed");
  return produce_with_backpressure(rk_.get(), queue_full_wait_, topic, [&](rd_kafka_resp_err_t& err) {
    Status s = produce_copy(rk_.get(), topic, key, value, headers.data(), headers.size(), opaque, timestamp_ms,
                            err);
    if (err_out != nullptr) *err_out = err;
    return s;
  });
}

int KafkaProducer::poll(std::chrono::milliseconds timeout) {
  if (!rk_) return 0;
  return rd_kafka_poll(rk_.get(), static_cast<int>(timeout.count()));
}

bool KafkaProducer::flush(std::chrono::milliseconds timeout) {
  return !rk_ || flush_producer(rk_.get(), timeout);
}

int KafkaProducer::outq_len() const { return rk_ ? rd_kafka_outq_len(rk_.get()) : 0; }

int KafkaProducer::close(std::chrono::milliseconds flush_timeout) {
  if (!rk_) return 0;
  rd_kafka_resp_err_t purge_error = RD_KAFKA_RESP_ERR_NO_ERROR;
  const int left = flush_or_purge(rk_.get(), flush_timeout, purge_error);
  if (left > 0) {
    spdlog::warn("kafka producer: {} message(s) not delivered within {} ms; purged them", left,
                 flush_timeout.count());
  }
  if (purge_error != RD_KAFKA_RESP_ERR_NO_ERROR) {
    spdlog::warn("kafka producer: purge failed: {}", rd_kafka_err2str(purge_error));
  }
  rk_.reset();
  return left;
}

}  // namespace sagapool
