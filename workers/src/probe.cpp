#include "probe.hpp"

#include <spdlog/spdlog.h>

namespace sagapool {
namespace {

// Stage names the engine and the worker report; fixed so the hot path finds
// a pre-registered histogram without allocating.
constexpr std::string_view kStages[] = {"ingest", "claim", "debit", "credit", "apply",
                                        "cleanup", "compensate", "finish", "publish", "recovery"};

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
  store_errors_->Add({{"op", std::string(op)}}).Increment();
  spdlog::warn("store error in {}: {} ({})", op, error.message(), to_string(error.kind()));
}

}  // namespace sagapool
