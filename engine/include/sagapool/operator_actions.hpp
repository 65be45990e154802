#pragma once
// What an operator may do to one transfer (`sagactl cancel|retry`): both
// take the transfer over by bumping its epoch (fencing out the worker that
// held it) and drive it with the same engine the workers use.
#include <string>
#include <string_view>

#include "sagapool/saga_engine.hpp"

namespace sagapool {

enum class ActionResult {
  done,         // the action took effect; `message` says the final state
  refused,      // not allowed in the transfer's state; `message` says why and what to do
  not_found,
  preempted,    // cancel: canceled (or being canceled) by someone else, for their reason;
                // `message` says by whom and why
};

struct ActionOutcome {
  ActionResult result = ActionResult::not_found;
  TransferState state = TransferState::initial;  // the transfer's state afterwards
  std::string message;
};

// Cancels a transfer that has not applied: initial/pending/canceling ->
// canceled with reason canceled_by_operator, reversing a posted debit.
// Refused once applied (the fix is a new reverse transfer). If compensation
// finds both legs already posted, the transfer rolls forward and the cancel
// is reported as refused. Preempted when it is already canceled, or a worker
// decided to cancel it for its own reason before the command took it over
// (the command then finishes that compensation): the outcome keeps the
// worker's reason, and the report says so.
Status cancel_transfer(Ledger& ledger, std::string_view id, std::string_view operator_id,
                       SagaObserver& observer, ActionOutcome& out);

// Resumes a non-terminal transfer now instead of after its lease.
Status retry_transfer(Ledger& ledger, std::string_view id, std::string_view operator_id,
                      SagaObserver& observer, ActionOutcome& out);


}  // namespace sagapool
