#include "sagapool/probe.hpp"

#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>

namespace sagapool {
namespace {

// Stage names the engine and the worker report; fixed so the hot path finds
// a pre-registered histogram without allocating.
constexpr std::string_view kStages[] = {"ingest",  "plan",    "claim",   "settle",
                                        "debit",   "credit",  "apply",   "cleanup",
                                        "compensate", "finish", "publish", "recovery"};

// Store calls that can fail, as the worker, the saga engine and the store
// collector name them; pre-registered so every series exists from the
// first scrape and the error path finds its counter without a lookup.
constexpr std::string_view kStoreOps[] = {
    "ingest", "notify", "claim",   "begin",      "commit", "transition", "plan",   "settle",
    "debit",  "credit", "cleanup", "compensate", "stats",  "ping",       "imbalance"};

prometheus::Histogram::BucketBoundaries seconds_buckets() {
  return {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
}

}  // namespace

WorkerProbe::WorkerProbe(prometheus::Registry& registry) {
  auto& requests = prometheus::BuildCounter()
                       .Name("saga_requests_total")
                       .Help("Transfer requests consumed, by ingest result")
                       .Register(registry);
  const char* results[] = {"accepted", "duplicate", "conflict", "invalid"};
  for (std::size_t i = 0; i < 4; ++i) requests_[i] = &requests.Add({{"result", results[i]}});

  auto& dead = prometheus::BuildCounter()
                   .Name("saga_dead_letters_total")
                   .Help("Requests sent to the dead-letter topic, by reason")
                   .Register(registry);
  dead_invalid_ = &dead.Add({{"reason", "invalid"}});
  dead_conflict_ = &dead.Add({{"reason", "conflict"}});
  dead_undeliverable_ = &prometheus::BuildCounter()
                             .Name("saga_dead_letters_undeliverable_total")
                             .Help("Dead letters the topic refused even truncated; passed "
                                   "without one (the error log names each)")
                             .Register(registry)
                             .Add({});

  auto& finished = prometheus::BuildCounter()
                       .Name("saga_transfers_finished_total")
                       .Help("Transfers that reached a terminal state, by outcome and reason")
                       .Register(registry);
  auto& compensations = prometheus::BuildCounter()
                            .Name("saga_compensations_total")
                            .Help("Transfers canceled by compensation, by reason")
                            .Register(registry);
  finished_done_ = &finished.Add({{"outcome", "done"}, {"reason", "none"}});
  for (int r = 1; r < kReasonCount; ++r) {
    const std::string reason(to_string(static_cast<Reason>(r)));
    if (reason == "invalid" || reason == "conflict") continue;  // never reach a transfer
    finished_canceled_[static_cast<std::size_t>(r)] =
        &finished.Add({{"outcome", "canceled"}, {"reason", reason}});
    compensations_[static_cast<std::size_t>(r)] = &compensations.Add({{"reason", reason}});
  }

  auto& transitions = prometheus::BuildCounter()
                          .Name("saga_stage_transitions_total")
                          .Help("Transfer state transitions written, by edge")
                          .Register(registry);
  for (std::size_t f = 0; f < kStates; ++f) {
    for (std::size_t t = 0; t < kStates; ++t) {
      const auto from = static_cast<TransferState>(f);
      const auto to = static_cast<TransferState>(t);
      if (!is_legal_transition(from, to)) continue;
      transitions_[f][t] = &transitions.Add(
          {{"from", std::string(to_string(from))}, {"to", std::string(to_string(to))}});
    }
  }

  auto& recoveries = prometheus::BuildCounter()
                         .Name("saga_recoveries_total")
                         .Help("Transfers claimed by the recovery pass after their lease expired, "
                               "by the state they were found in")
                         .Register(registry);
  for (std::size_t s = 0; s < kStates; ++s) {
    recoveries_[s] = &recoveries.Add({{"state", std::string(to_string(static_cast<TransferState>(s)))}});
  }

  transfer_duration_ = &prometheus::BuildHistogram()
                            .Name("saga_transfer_duration_seconds")
                            .Help("From the request's Kafka timestamp to the terminal state")
                            .Register(registry)
                            .Add({}, seconds_buckets());
  batch_size_ = &prometheus::BuildHistogram()
                     .Name("saga_batch_size")
                     .Help("Requests per ingest batch")
                     .Register(registry)
                     .Add({}, prometheus::Histogram::BucketBoundaries{1, 10, 50, 100, 250, 500,
                                                                      1000, 2000, 5000});
  stage_family_ = &prometheus::BuildHistogram()
                       .Name("saga_stage_duration_seconds")
                       .Help("Duration of one batch through one stage (one store round trip per shard)")
                       .Register(registry);
  for (std::string_view stage : kStages) {
    stages_.push_back({stage, &stage_family_->Add({{"stage", std::string(stage)}}, seconds_buckets())});
  }
  store_errors_ = &prometheus::BuildCounter()
                       .Name("saga_store_errors_total")
                       .Help("Failed store calls, by operation")
                       .Register(registry);
  for (std::string_view op : kStoreOps) {
    store_error_ops_.push_back({op, &store_errors_->Add({{"op", std::string(op)}})});
  }
  prometheus::BuildGauge()
      .Name("saga_build_info")
      .Help("Build information; always 1")
      .Register(registry)
      .Add({{"version", SAGAPOOL_VERSION}})
      .Set(1);
}

void WorkerProbe::on_finished(TransferState state, Reason reason, double seconds_since_request) {
  if (state == TransferState::done) {
    finished_done_->Increment();
  } else if (auto* c = finished_canceled_[static_cast<std::size_t>(reason)]) {
    c->Increment();
  }
  if (seconds_since_request >= 0) transfer_duration_->Observe(seconds_since_request);
}

void WorkerProbe::on_transitions(TransferState from, TransferState to, std::size_t count) {
  if (auto* c = transitions_[static_cast<std::size_t>(from)][static_cast<std::size_t>(to)]) {
    c->Increment(static_cast<double>(count));
  }
}

void WorkerProbe::on_compensation(Reason reason) {
  if (auto* c = compensations_[static_cast<std::size_t>(reason)]) c->Increment();
}

void WorkerProbe::on_stage(std::string_view stage, std::chrono::nanoseconds elapsed) {
  for (const StageSlot& s : stages_) {
    if (s.name == stage) {
      s.histogram->Observe(std::chrono::duration<double>(elapsed).count());
      return;
    }
  }
}

void WorkerProbe::on_store_error(std::string_view op, const Status& error) {
  // Errors are rare: a label lookup here is fine, and logging is rate-bound
  // by the engine's retry backoff.
  count_store_error(op);
  spdlog::warn("store error in {}: {} ({})", op, error.message(), to_string(error.kind()));
}

void WorkerProbe::count_store_error(std::string_view op) {
  for (const StoreErrorSlot& slot : store_error_ops_) {
    if (slot.op == op) {
      slot.counter->Increment();
      return;
    }
  }
  store_errors_->Add({{"op", std::string(op)}}).Increment();  // a new name: rare
}

// ---- ConsumerProbe -----------------------------------------------------------

namespace {

std::int64_t int_field(const nlohmann::json& o, const char* key, std::int64_t fallback) {
  const auto it = o.find(key);
  return it != o.end() && it->is_number_integer() ? it->get<std::int64_t>() : fallback;
}

// Messages of one assigned partition not yet ingested by the group, from a
// partition object of librdkafka's statistics; -1 when unknown.
// consumer_lag_stored (high watermark - offset stored after ingest) is the
// freshest; consumer_lag (- committed offset) trails it by the auto-commit
// interval. A group that never committed on the partition starts from the
// earliest offset (auto.offset.reset=earliest): the whole log is lag.
std::int64_t partition_lag(const nlohmann::json& p) {
  if (const std::int64_t stored = int_field(p, "consumer_lag_stored", -1); stored >= 0) return stored;
  if (const std::int64_t committed = int_field(p, "consumer_lag", -1); committed >= 0) return committed;
  const auto state = p.find("fetch_state");
  const bool active = state != p.end() && state->is_string() && state->get_ref<const std::string&>() == "active";
  const std::int64_t hi = int_field(p, "hi_offset", -1);
  const std::int64_t lo = int_field(p, "lo_offset", -1);
  if (active && int_field(p, "committed_offset", -1) < 0 && int_field(p, "stored_offset", -1) < 0 &&
      hi >= 0 && lo >= 0 && hi >= lo) {
    return hi - lo;
  }
  return -1;
}

}  // namespace

ConsumerProbe::ConsumerProbe(prometheus::Registry& registry)
    : lag_(&prometheus::BuildGauge()
                .Name("saga_kafka_consumer_lag")
                .Help("Messages of a partition assigned to this worker not yet ingested by the "
                      "group (high watermark - stored offset), from librdkafka statistics")
                .Register(registry)) {}

prometheus::Gauge& ConsumerProbe::slot(std::string_view topic, std::int32_t partition) {
  for (Slot& s : slots_) {
    if (s.partition == partition && s.topic == topic) {
      s.seen = true;
      return *s.gauge;
    }
  }
  Slot& s = slots_.emplace_back();
  s.topic.assign(topic);
  s.partition = partition;
  s.gauge = &lag_->Add({{"topic", s.topic}, {"partition", std::to_string(partition)}});
  s.seen = true;
  return *s.gauge;
}

void ConsumerProbe::on_consumer_stats(std::string_view json) {
  // One report per statistics interval (seconds), never per message: parsing
  // and allocating here is fine.
  const nlohmann::json stats =
      nlohmann::json::parse(json.begin(), json.end(), nullptr, /*allow_exceptions=*/false);
  std::lock_guard lock(mu_);
  if (!stats.is_object()) {
    if (!warned_) spdlog::warn("consumer statistics: not a JSON object; lag not exported");
    warned_ = true;
    return;
  }
  for (Slot& s : slots_) s.seen = false;
  int desired = 0;
  if (const auto topics = stats.find("topics"); topics != stats.end() && topics->is_object()) {
    for (const auto& [topic, t] : topics->items()) {
      const auto partitions = t.find("partitions");
      if (partitions == t.end() || !partitions->is_object()) continue;
      for (const auto& [key, p] : partitions->items()) {
        const std::int64_t partition = int_field(p, "partition", -1);
        const auto d = p.find("desired");
        if (partition < 0 || partition > INT32_MAX || d == p.end() || !d->is_boolean() || !d->get<bool>()) {
          continue;  // the internal "unassigned" partition, or not ours
        }
        ++desired;
        const std::int64_t lag = partition_lag(p);
        if (lag >= 0) slot(topic, static_cast<std::int32_t>(partition)).Set(static_cast<double>(lag));
      }
    }
  }
  for (auto it = slots_.begin(); it != slots_.end();) {
    if (it->seen) {
      ++it;
      continue;
    }
    lag_->Remove(it->gauge);
    it = slots_.erase(it);
  }
  int assigned = desired;
  if (const auto cgrp = stats.find("cgrp"); cgrp != stats.end() && cgrp->is_object()) {
    assigned = static_cast<int>(int_field(*cgrp, "assignment_size", desired));
  }
  assigned_.store(assigned, std::memory_order_relaxed);
}

}  // namespace sagapool
