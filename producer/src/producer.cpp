#include "sagapool/producer.hpp"

#include "sagapool/kafka_base.hpp"

#include <array>
#include <cstddef>

#include "sagapool/request.hpp"

// A thin client of librdkafka's C API on kafka_base (as KafkaProducer is),
// rather than sagapool::kafka's KafkaProducer itself: that one logs through
// spdlog and reads the project's configuration, which upstream code must not
// have to link.
namespace sagapool {
namespace {

// librdkafka quotes a rejected value in its message; the value may be a
// secret (a SASL password, a key), so every occurrence of it is masked.
std::string without_value(std::string message, const std::string& value) {
  if (value.empty()) return message;
  constexpr std::string_view kMask = "(value not shown)";
  for (std::size_t at = message.find(value); at != std::string::npos;
       at = message.find(value, at + kMask.size())) {
    message.replace(at, value.size(), kMask);
  }
  return message;
}

Status set_property(rd_kafka_conf_t& conf, const std::string& key, const std::string& value) {
  std::array<char, 512> errstr{};
  const rd_kafka_conf_res_t r =
      rd_kafka_conf_set(&conf, key.c_str(), value.c_str(), errstr.data(), errstr.size());
  if (r == RD_KAFKA_CONF_OK) return Status::ok();
  if (r == RD_KAFKA_CONF_UNKNOWN) {
    return Status::fatal("kafka option '" + key + "': no such librdkafka property");
  }
  return Status::fatal("kafka option '" + key + "': " + without_value(errstr.data(), value));
}

}  // namespace

TransferProducer::TransferProducer(std::string topic, DeliveryCallback on_delivery,
                                   std::chrono::milliseconds queue_full_wait)
    : topic_(std::move(topic)),
      on_delivery_(std::move(on_delivery)),
      queue_full_wait_(queue_full_wait) {}

TransferProducer::~TransferProducer() {
  // Close here, while the counters and callback the reports touch still exist.
  if (rk_) (void)close(std::chrono::seconds(10));
}

Status TransferProducer::create(TransferProducerOptions options,
                                std::unique_ptr<TransferProducer>& out,
                                DeliveryCallback on_delivery) {
  if (options.topic.empty()) return Status::fatal("transfer producer: empty topic name");
  if (options.brokers.empty()) return Status::fatal("transfer producer: no brokers given");
  std::vector<std::pair<std::string, std::string>> opts = {
      {"bootstrap.servers", options.brokers},
      {"client.id", options.client_id},
      {"enable.idempotence", "true"},
      {"compression.type", "lz4"},
      // Requests arrive one call at a time: waiting up to 25 ms makes fewer,
      // larger produce requests, whose per-request cost the broker pays. At
      // 20,000/s, 5 ms cost the broker 1.5-3 times the CPU a transfer and
      // the saga a p99 of 0.3-2.6 s (bench/REPORT.md, "The thirty-second
      // session"). The workers' outcomes wait as long.
      {"linger.ms", "25"},
      {"batch.num.messages", "10000"},
      {"queue.buffering.max.messages", "500000"},
  };
  opts.insert(opts.end(), options.kafka_opts.begin(), options.kafka_opts.end());
  ConfPtr conf(rd_kafka_conf_new());
  for (const auto& [key, value] : opts) {
    if (Status s = set_property(*conf, key, value); !s) return s;
  }
  if (options.configure) options.configure(*conf);

  // The producer's address is the conf's opaque, which every delivery
  // report gets: it must not move, so it lives behind a unique_ptr.
  std::unique_ptr<TransferProducer> p(new TransferProducer(
      std::move(options.topic), std::move(on_delivery), options.queue_full_wait));
  rd_kafka_conf_set_dr_msg_cb(conf.get(), &TransferProducer::delivery_report);
  rd_kafka_conf_set_opaque(conf.get(), p.get());
  std::array<char, 512> errstr{};
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf.get(), errstr.data(), errstr.size());
  if (rk == nullptr) return Status::fatal(std::string("transfer producer: ") + errstr.data());
  (void)conf.release();  // rd_kafka_new owns the conf now
  p->rk_.reset(rk);
  out = std::move(p);
  return Status::ok();
}

Status TransferProducer::publish(const TransferRequest& r, void* opaque) {
  buffer_.clear();
  append_json(buffer_, r);
  RequestView view;
  if (const RequestError e = parse_request(buffer_, view); e != RequestError::ok) {
    return Status::fatal("transfer " + r.id.substr(0, kMaxIdLength) + " is invalid (" +
                         std::string(error_code(e)) + "): " + std::string(error_message(e)));
  }
  return publish_raw(r.from, buffer_, opaque);
}

Status TransferProducer::publish_raw(std::string_view key, std::string_view value, void* opaque) {
  if (!rk_) return Status::fatal("transfer producer: publish after close");
  Status s = produce_with_backpressure(rk_.get(), queue_full_wait_, topic_, [&](rd_kafka_resp_err_t& err) {
    return produce_copy(rk_.get(), topic_, key, value, nullptr, 0, opaque, 0, err);
  });
  if (s) ++published_;
  return s;
}

int TransferProducer::poll(std::chrono::milliseconds timeout) {
  if (!rk_) return 0;
  return rd_kafka_poll(rk_.get(), static_cast<int>(timeout.count()));
}

bool TransferProducer::flush(std::chrono::milliseconds timeout) {
  return !rk_ || flush_producer(rk_.get(), timeout);
}

int TransferProducer::outq_len() const { return rk_ ? rd_kafka_outq_len(rk_.get()) : 0; }

int TransferProducer::close(std::chrono::milliseconds flush_timeout) {
  if (!rk_) return 0;
  // A purge error can only be a bad flag, which flush_or_purge's are not.
  rd_kafka_resp_err_t purge_error = RD_KAFKA_RESP_ERR_NO_ERROR;
  const int left = flush_or_purge(rk_.get(), flush_timeout, purge_error);
  rk_.reset();
  return left;
}

void TransferProducer::delivery_report(rd_kafka_t* /*rk*/, const rd_kafka_message_t* m,
                                       void* opaque) {
  static_cast<TransferProducer*>(opaque)->on_delivery(*m);
}

void TransferProducer::on_delivery(const rd_kafka_message_t& m) {
  const bool ok = m.err == RD_KAFKA_RESP_ERR_NO_ERROR;
  if (ok) {
    ++delivered_;
  } else {
    ++failed_;
    if (first_error_.empty()) {
      first_error_ = std::string(rd_kafka_err2str(m.err)) + " (" + rd_kafka_err2name(m.err) + ")";
    }
  }
  if (!on_delivery_) return;
  TransferDelivery d;
  d.opaque = m._private;
  d.partition = m.partition;
  d.offset = m.offset;
  if (!ok) {
    d.status = kafka_status(m.err, "delivery to " + topic_);
  }
  on_delivery_(d);
}

}  // namespace sagapool
