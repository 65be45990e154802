#pragma once
// The worker's metrics (DESIGN.md, "Metrics"): every family registered once
// at start-up; the hot path only increments references held here.
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "sagapool/consumer.hpp"
#include "sagapool/saga_engine.hpp"

namespace sagapool {

enum class RequestResult { accepted, duplicate, conflict, invalid };

class WorkerProbe final : public SagaObserver {
 public:
  explicit WorkerProbe(prometheus::Registry& registry);

  void on_request(RequestResult r, std::size_t n = 1) {
    requests_[static_cast<std::size_t>(r)]->Increment(static_cast<double>(n));
  }
  void on_dead_letter(Reason reason) {
    (reason == Reason::conflict ? dead_conflict_ : dead_invalid_)->Increment();
  }
  void on_dead_letter_undeliverable() { dead_undeliverable_->Increment(); }
  void on_finished(TransferState state, Reason reason, double seconds_since_request);
  void on_recovered(TransferState state) { recoveries_[static_cast<std::size_t>(state)]->Increment(); }
  void on_batch(std::size_t n) { batch_size_->Observe(static_cast<double>(n)); }

  // SagaObserver
  void on_transitions(TransferState from, TransferState to, std::size_t count) override;
  void on_compensation(Reason reason) override;
  void on_stage(std::string_view stage, std::chrono::nanoseconds elapsed) override;
  void on_store_error(std::string_view op, const Status& error) override;
  // Counts a failed store call without logging (the caller rate-limits its
  // own messages). Thread-safe: the scrape path uses it.
  void count_store_error(std::string_view op);

 private:
  static constexpr std::size_t kStates = kTransferStateCount;
  std::array<prometheus::Counter*, 4> requests_{};
  prometheus::Counter* dead_invalid_ = nullptr;
  prometheus::Counter* dead_conflict_ = nullptr;
  prometheus::Counter* dead_undeliverable_ = nullptr;
  prometheus::Counter* finished_done_ = nullptr;
  std::array<prometheus::Counter*, kReasonCount> finished_canceled_{};
  std::array<prometheus::Counter*, kReasonCount> compensations_{};
  std::array<std::array<prometheus::Counter*, kStates>, kStates> transitions_{};
  std::array<prometheus::Counter*, kStates> recoveries_{};
  prometheus::Histogram* transfer_duration_ = nullptr;
  prometheus::Histogram* batch_size_ = nullptr;
  prometheus::Family<prometheus::Histogram>* stage_family_ = nullptr;
  prometheus::Family<prometheus::Counter>* store_errors_ = nullptr;
  struct StageSlot {
    std::string_view name;
    prometheus::Histogram* histogram;
  };
  std::vector<StageSlot> stages_;  // fixed at start-up
  struct StoreErrorSlot {
    std::string_view op;
    prometheus::Counter* counter;
  };
  std::vector<StoreErrorSlot> store_error_ops_;  // fixed at start-up
};

// The Kafka consumer's metrics: saga_kafka_consumer_lag{topic,partition},
// from librdkafka's statistics (Consumer::set_stats_listener). Reports come
// every statistics.interval.ms; a partition that is no longer assigned loses
// its series at the next report.
class ConsumerProbe final : public ConsumerStatsListener {
 public:
  explicit ConsumerProbe(prometheus::Registry& registry);

  void on_consumer_stats(std::string_view json) override;

  // Partitions assigned to this member at the last report; -1 before the
  // first one. Any thread.
  int assigned_partitions() const noexcept { return assigned_.load(std::memory_order_relaxed); }

 private:
  struct Slot {
    std::string topic;
    std::int32_t partition = -1;
    prometheus::Gauge* gauge = nullptr;
    bool seen = false;  // in the report being applied
  };
  prometheus::Gauge& slot(std::string_view topic, std::int32_t partition);

  prometheus::Family<prometheus::Gauge>* lag_ = nullptr;
  std::mutex mu_;            // guards slots_ (reports may come from any thread)
  std::vector<Slot> slots_;  // one per assigned partition: a handful
  std::atomic<int> assigned_{-1};
  bool warned_ = false;      // a malformed report is logged once
};

}  // namespace sagapool
