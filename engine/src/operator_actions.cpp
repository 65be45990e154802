#include "sagapool/operator_actions.hpp"

#include "sagapool/log.hpp"

namespace sagapool {
namespace {

// Operators' claims are short: a worker's recovery takes the transfer back
// (for instance to publish its outcome) soon after the command ends.
constexpr std::int64_t kOperatorLeaseMs = 5'000;

// Canceled, or being canceled, for a reason of its own by `by`.
std::string preempted_message(std::string_view id, TransferState state, Reason reason,
                              std::string_view by, bool finished_here) {
  std::string m = "transfer " + std::string(id) + " was " +
                  (state == TransferState::canceled && !finished_here ? "already canceled"
                                                                      : "being canceled") +
                  " by " + (by.empty() ? std::string("an unknown owner") : std::string(by)) +
                  " (reason " + std::string(to_string(reason)) + "), not by this command";
  if (finished_here) m += "; this command finished that cancel";
  return m;
}

std::string applied_refusal(std::string_view id, TransferState s) {
  return "transfer " + std::string(id) + " is " + std::string(to_string(s)) +
         ": both legs are posted and a transfer that applied is never canceled; publish a new "
         "transfer in the opposite direction to reverse it";
}

Status drive(Ledger& ledger, std::string_view operator_id,
             SagaObserver& observer, std::vector<SagaItem>& items) {
  SagaEngine engine(ledger, {std::string(operator_id), kOperatorLeaseMs, 5}, &observer);
  return engine.run(items);
}

// Reads the transfer; with none, says so in `out` and leaves `doc` empty.
Status load(Ledger& ledger, std::string_view id, std::optional<TransferDoc>& doc, ActionOutcome& out) {
  if (Status s = ledger.transfers().load_transfer(id, doc); !s) return s;
  if (!doc) out.message = "no transfer with id " + std::string(id);
  return Status::ok();
}

std::string_view result_name(ActionResult r) {
  switch (r) {
    case ActionResult::done: return "done";
    case ActionResult::refused: return "refused";
    case ActionResult::not_found: return "not_found";
    case ActionResult::preempted: return "preempted";
  }
  return "unknown";
}

// An action that changed something, or failed on the way, leaves a line an
// operator finds by transfer id; a refusal changed nothing and only answers.
Status logged(std::string_view action, std::string_view id, std::string_view operator_id,
              const ActionOutcome& out, Status s) {
  if (s && (out.result == ActionResult::refused || out.result == ActionResult::not_found)) return s;
  log_event(s ? spdlog::level::info : spdlog::level::warn, s ? out.message : s.message(),
            {{"action", action}, {"transfer_id", id}, {"operator", operator_id},
             {"result", s ? result_name(out.result) : std::string_view("error")}, {"state", to_string(out.state)}});
  return s;
}

Status cancel(Ledger& ledger, std::string_view id, std::string_view operator_id,
              SagaObserver& observer, ActionOutcome& out) {
  out = ActionOutcome{};
  std::optional<TransferDoc> doc;
  if (Status s = load(ledger, id, doc, out); !s || !doc) return s;
  out.state = doc->state;
  if (doc->state == TransferState::applied || doc->state == TransferState::done) {
    out.result = ActionResult::refused;
    out.message = applied_refusal(id, doc->state);
    return Status::ok();
  }
  // Take it over (a finished transfer is left as it is), then re-check: the
  // state may have moved since the load.
  if (doc->state != TransferState::canceled) {
    if (Status s = ledger.transfers().take_over(id, operator_id, kOperatorLeaseMs, doc); !s) {
      return s;
    }
    if (!doc) {
      out.message = "no transfer with id " + std::string(id);
      return Status::ok();
    }
  }
  out.state = doc->state;
  if (doc->state == TransferState::done) {
    out.result = ActionResult::refused;
    out.message = applied_refusal(id, doc->state);
    return Status::ok();
  }
  if (doc->state == TransferState::canceled) {
    out.result = ActionResult::preempted;
    out.message = preempted_message(id, doc->state, doc->reason, doc->owner, false);
    return Status::ok();
  }
  // A worker moved it to canceling for a reason of its own; the take-over
  // replaced that worker as owner, so the report can only say "a worker".
  const bool worker_decided =
      doc->state == TransferState::canceling && doc->reason != Reason::canceled_by_operator;
  std::vector<SagaItem> items(1);
  items[0].assign(*doc);
  SagaItem& it = items[0];
  if (it.state == TransferState::initial || it.state == TransferState::pending) {
    const Transition t{it.id, it.state, TransferState::canceling, Reason::canceled_by_operator,
                       operator_id, it.epoch};
    std::uint8_t applied = 0;
    if (Status s = ledger.transfers().transition({&t, 1}, kOperatorLeaseMs, {&applied, 1}); !s) {
      return s;
    }
    if (!applied) {
      return Status::retry_stage("transfer " + it.id + " changed hands during the cancel; try again");
    }
    observer.on_transitions(it.state, TransferState::canceling, 1);
    it.state = TransferState::canceling;
    it.reason = Reason::canceled_by_operator;
  }
  if (it.state == TransferState::canceling) {
    if (Status s = drive(ledger, operator_id, observer, items); !s) return s;
  }
  out.state = it.state;
  if (it.state == TransferState::canceled && worker_decided) {
    out.result = ActionResult::preempted;
    out.message = preempted_message(id, it.state, it.reason, "a worker", true);
  } else if (it.state == TransferState::canceled) {
    out.result = ActionResult::done;
    out.message = "transfer " + it.id + " canceled (reason " + std::string(to_string(it.reason)) + ")";
  } else if (it.state == TransferState::applied || it.state == TransferState::done) {
    out.result = ActionResult::refused;
    out.message = applied_refusal(id, it.state) + " (both legs were already posted; it rolled forward)";
  } else {
    return Status::retry_stage("transfer " + it.id + " could not be finished now (state " +
                               std::string(to_string(it.state)) + "); a worker will resume it");
  }
  return Status::ok();
}

Status retry(Ledger& ledger, std::string_view id, std::string_view operator_id,
             SagaObserver& observer, ActionOutcome& out) {
  out = ActionOutcome{};
  std::optional<TransferDoc> doc;
  if (Status s = load(ledger, id, doc, out); !s || !doc) return s;
  if (is_terminal(doc->state)) {
    out.result = ActionResult::refused;
    out.state = doc->state;
    out.message = "transfer " + std::string(id) + " is already " + std::string(to_string(doc->state)) +
                  (doc->notified ? "" : "; a worker will publish its outcome");
    return Status::ok();
  }
  if (Status s = ledger.transfers().take_over(id, operator_id, kOperatorLeaseMs, doc); !s) return s;
  std::vector<SagaItem> items(1);
  items[0].assign(*doc);
  if (Status s = drive(ledger, operator_id, observer, items); !s) return s;
  out.state = items[0].state;
  out.result = is_terminal(items[0].state) ? ActionResult::done : ActionResult::refused;
  out.message = "transfer " + items[0].id + " is now " + std::string(to_string(items[0].state)) +
                (items[0].reason != Reason::none ? " (reason " + std::string(to_string(items[0].reason)) + ")" : "");
  return Status::ok();
}

}  // namespace

Status cancel_transfer(Ledger& ledger, std::string_view id, std::string_view operator_id,
                       SagaObserver& observer, ActionOutcome& out) {
  return logged("cancel", id, operator_id, out, cancel(ledger, id, operator_id, observer, out));
}

Status retry_transfer(Ledger& ledger, std::string_view id, std::string_view operator_id,
                      SagaObserver& observer, ActionOutcome& out) {
  return logged("retry", id, operator_id, out, retry(ledger, id, operator_id, observer, out));
}

}  // namespace sagapool
