#include "sagapool/kafka_io.hpp"

#include <spdlog/spdlog.h>

#include <thread>

#include "sagapool/failpoints.hpp"
#include "sagapool/worker.hpp"

namespace sagapool {

Status KafkaRequestSource::create(const WorkerOptions& options, std::unique_ptr<RequestSource>& out) {
  auto source = std::make_unique<KafkaRequestSource>();
  ConsumerOptions copts{options.brokers, options.group, options.requests_topic, options.worker_id,
                        options.kafka_opts};
  if (Status s = Consumer::create(copts, source->consumer_); !s) return s;
  source->topic_ = options.requests_topic;
  source->messages_.reserve(options.batch_size);
  out = std::move(source);
  return Status::ok();
}

Status KafkaRequestSource::poll_batch(std::size_t max, std::chrono::milliseconds timeout,
                                      std::vector<ConsumedMessage>& out) {
  out.clear();
  if (Status s = consumer_->poll_batch(max, timeout, messages_); !s) return s;
  for (const MessagePtr& m : messages_) {
    rd_kafka_timestamp_type_t type;
    out.push_back({rd_kafka_topic_name(m->rkt), m->partition, m->offset,
                   rd_kafka_message_timestamp(m.get(), &type),
                   {static_cast<const char*>(m->key), m->key ? m->key_len : 0},
                   {static_cast<const char*>(m->payload), m->payload ? m->len : 0}, m.get()});
  }
  return Status::ok();
}

void KafkaRequestSource::headers_of(const ConsumedMessage& m, std::vector<CopiedHeader>& out) {
  out.clear();
  rd_kafka_headers_t* headers = nullptr;
  auto* message = static_cast<rd_kafka_message_t*>(const_cast<void*>(m.handle));
  if (message == nullptr || rd_kafka_message_headers(message, &headers) != RD_KAFKA_RESP_ERR_NO_ERROR) return;
  const char* name = nullptr;
  const void* value = nullptr;
  std::size_t size = 0;
  for (std::size_t i = 0; rd_kafka_header_get_all(headers, i, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR; ++i) {
    CopiedHeader& h = out.emplace_back();
    h.name = name;
    if (value != nullptr) h.value.emplace(static_cast<const char*>(value), size);
  }
}

TopicPartitionListPtr KafkaRequestSource::list_of(std::span<const PartitionOffset> offsets) const {
  TopicPartitionListPtr list(rd_kafka_topic_partition_list_new(static_cast<int>(offsets.size())));
  for (const PartitionOffset& p : offsets) {
    rd_kafka_topic_partition_list_add(list.get(), topic_.c_str(), p.partition)->offset = p.offset;
  }
  return list;
}

Status KafkaRequestSource::store_offsets(std::span<const PartitionOffset> offsets) {
  return consumer_->store_offsets(*list_of(offsets));
}

Status KafkaRequestSource::seek(std::span<const PartitionOffset> offsets) {
  return consumer_->seek(*list_of(offsets));
}

Status KafkaMessageOutput::create(const WorkerOptions& options, std::unique_ptr<MessageOutput>& out) {
  auto output = std::make_unique<KafkaMessageOutput>();
  output->options_.brokers = options.brokers;
  output->options_.kafka_opts = options.kafka_opts;
  output->options_.client_id = options.worker_id;
  if (Status s = KafkaProducer::create(output->options_, output.get(), output->producer_); !s) return s;
  out = std::move(output);
  return Status::ok();
}

// librdkafka refuses every produce once it has raised a fatal error, even
// before the worker's loop hears of it: one that a new producer cures is
// not the worker's end. A dead letter refused so is sent again (as when
// the queue stays full), an outcome is published again by recovery.
Status KafkaMessageOutput::produce(const std::string& topic, std::string_view key, std::string_view value,
                                   std::span<const MessageHeader> headers, void* opaque,
                                   rd_kafka_resp_err_t* err, std::int64_t timestamp_ms) {
  Status s = producer_->produce(topic, key, value, headers, opaque, err, timestamp_ms);
  if (!s && s.kind() == ErrorKind::fatal && cured_by_new_producer(producer_->fatal_code())) {
    return Status::retry_call(s.message() + "; the producer is about to be replaced");
  }
  return s;
}

Status KafkaMessageOutput::keep_usable() {
  const rd_kafka_resp_err_t fatal = producer_->fatal_code();
  if (fatal == RD_KAFKA_RESP_ERR_NO_ERROR) {
    // Raised here and found by the next loop, after it produced into the
    // broken producer, as a real one is.
    if (producer_->outq_len() > 0) {
      if (Status fp = SAGA_FAILPOINT("producer_in_flight"); !fp) {
        (void)rd_kafka_test_fatal_error(producer_->handle(), RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
                                        "injected at fail point producer_in_flight");
      }
    }
    return Status::ok();
  }
  Status why = producer_->fatal_error();
  if (!cured_by_new_producer(fatal)) return why;
  // Seen with librdkafka 2.0.2 when a partition's leader moved while a batch
  // was retried. What the old producer holds is purged and reported failed:
  // recovery publishes those outcomes again and dead letters are sent again
  // (at least once, as always). Rare, so a line each time.
  spdlog::error("{}; replacing the producer with a new one", why.message());
  const int purged = producer_->close(std::chrono::milliseconds(0));
  std::unique_ptr<KafkaProducer> fresh;
  if (Status s = KafkaProducer::create(options_, this, fresh); !s) return s;  // the closed one stays
  producer_ = std::move(fresh);
  spdlog::warn("kafka producer replaced; {} message(s) it had not delivered will be sent again", purged);
  return Status::ok();
}

void KafkaMessageOutput::on_delivery(const rd_kafka_message_t& m) {
  if (listener_ == nullptr) return;
  listener_->on_delivery({m._private, m.err, rd_kafka_topic_name(m.rkt),
                          {static_cast<const char*>(m.key), m.key ? m.key_len : 0}});
}

std::int64_t SystemClock::wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void SystemClock::sleep_for(std::chrono::milliseconds d) { std::this_thread::sleep_for(d); }

}  // namespace sagapool
