#pragma once
// saga-worker's wiring of worker_io.hpp: librdkafka's consumer group and
// idempotent producer, and the system clock.
#include <memory>

#include "sagapool/consumer.hpp"
#include "sagapool/kafka.hpp"
#include "sagapool/worker_io.hpp"

namespace sagapool {

struct WorkerOptions;

class KafkaRequestSource final : public RequestSource {
 public:
  static Status create(const WorkerOptions& options, std::unique_ptr<RequestSource>& out);
  Status poll_batch(std::size_t max, std::chrono::milliseconds timeout,
                    std::vector<ConsumedMessage>& out) override;
  Status store_offsets(std::span<const PartitionOffset> offsets) override;
  Status seek(std::span<const PartitionOffset> offsets) override;
  void headers_of(const ConsumedMessage& m, std::vector<CopiedHeader>& out) override;
  void close() override { consumer_->close(); }

 private:
  TopicPartitionListPtr list_of(std::span<const PartitionOffset> offsets) const;

  std::unique_ptr<Consumer> consumer_;
  std::string topic_;
  std::vector<MessagePtr> messages_;  // behind the views poll_batch handed out
};

class KafkaMessageOutput final : public MessageOutput, private DeliveryHandler {
 public:
  static Status create(const WorkerOptions& options, std::unique_ptr<MessageOutput>& out);
  void set_listener(DeliveryListener* listener) override { listener_ = listener; }
  Status produce(const std::string& topic, std::string_view key, std::string_view value,
                 std::span<const MessageHeader> headers, void* opaque, rd_kafka_resp_err_t* err,
                 std::int64_t timestamp_ms) override;
  int poll(std::chrono::milliseconds timeout) override { return producer_->poll(timeout); }
  bool flush(std::chrono::milliseconds timeout) override { return producer_->flush(timeout); }
  int outq_len() const override { return producer_->outq_len(); }
  void close(std::chrono::milliseconds flush_timeout) override { producer_->close(flush_timeout); }
  Status keep_usable() override;

 private:
  void on_delivery(const rd_kafka_message_t& m) override;

  DeliveryListener* listener_ = nullptr;
  KafkaProducerOptions options_;  // a replacement producer is made from these
  std::unique_ptr<KafkaProducer> producer_;  // last: its close serves the last reports
};

class SystemClock final : public WorkerClock {
 public:
  std::chrono::steady_clock::time_point now() override { return std::chrono::steady_clock::now(); }
  std::int64_t wall_ms() override;
  void sleep_for(std::chrono::milliseconds d) override;
};

}  // namespace sagapool
