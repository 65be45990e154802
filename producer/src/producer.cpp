#include "sagapool/producer.hpp"

#include <charconv>

#include "sagapool/json_text.hpp"
#include "sagapool/request.hpp"

namespace sagapool {

void append_json(std::string& out, const TransferRequest& r) {
  out += R"({"id": ")";
  append_json_escaped(out, r.id);
  out += R"(", "from": ")";
  append_json_escaped(out, r.from);
  out += R"(", "to": ")";
  append_json_escaped(out, r.to);
  out += R"(", "amount": )";
  char digits[24];
  const auto [end, ec] = std::to_chars(std::begin(digits), std::end(digits), r.amount);
  (void)ec;  // 24 chars always hold an int64
  out.append(digits, end);
  if (!r.currency.empty()) {
    out += R"(, "currency": ")";
    append_json_escaped(out, r.currency);
    out += '"';
  }
  if (!r.metadata.empty()) {
    out += R"(, "metadata": )";
    out += r.metadata;
  }
  out += '}';
}

std::string to_json(const TransferRequest& r) {
  std::string out;
  out.reserve(96 + r.id.size() + r.from.size() + r.to.size() + r.metadata.size());
  append_json(out, r);
  return out;
}

TransferProducer::TransferProducer(std::string topic, DeliveryCallback on_delivery)
    : topic_(std::move(topic)), on_delivery_(std::move(on_delivery)) {}

TransferProducer::~TransferProducer() {
  // Close here, while the counters and callback the reports touch still exist.
  if (producer_) (void)producer_->close(std::chrono::seconds(10));
}

Status TransferProducer::create(TransferProducerOptions options,
                                std::unique_ptr<TransferProducer>& out,
                                DeliveryCallback on_delivery) {
  if (options.topic.empty()) return Status::fatal("transfer producer: empty topic name");
  std::unique_ptr<TransferProducer> p(
      new TransferProducer(std::move(options.topic), std::move(on_delivery)));
  KafkaProducerOptions kopts;
  kopts.brokers = std::move(options.brokers);
  kopts.kafka_opts = std::move(options.kafka_opts);
  kopts.client_id = std::move(options.client_id);
  kopts.queue_full_wait = options.queue_full_wait;
  if (Status s = KafkaProducer::create(kopts, p.get(), p->producer_); !s) return s;
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
  Status s = producer_->produce(topic_, key, value, {}, opaque);
  if (s) ++published_;
  return s;
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
  if (!ok) d.status = kafka_status(m.err, "delivery to " + topic_);
  on_delivery_(d);
}

}  // namespace sagapool
