#pragma once
// The outcome message on transfers.results (DESIGN.md, "Messages").
#include <cstdint>
#include <string>
#include <string_view>

#include "sagapool/domain.hpp"

namespace sagapool {

struct OutcomeFields {
  std::string_view id;
  TransferState state = TransferState::done;
  Reason reason = Reason::none;
  std::string_view from;
  std::string_view to;
  std::int64_t amount = 0;
  std::int64_t finished_at_ms = 0;
  // Echoed from the request, so callers need not keep it: empty when absent.
  std::string_view currency;
  std::string_view metadata;  // a JSON object's text, verbatim
};

// Replaces `out` with the JSON object; reuses its capacity.
void format_outcome(const OutcomeFields& f, std::string& out);

// The answer to a request that started no transfer (state "rejected"): an
// invalid request whose id could be read, or another payload under an id
// already used (whose transfer and outcome stand unchanged). The request's
// position tells its sender which message is answered.
struct RejectionFields {
  std::string_view id;
  Reason reason = Reason::invalid;  // invalid or conflict
  std::string_view error;           // the dead letter's saga.error code
  std::string_view message;         // and its saga.message
  std::string_view topic;
  std::int32_t partition = 0;
  std::int64_t offset = 0;
  std::int64_t rejected_at_ms = 0;
};

void format_rejection(const RejectionFields& f, std::string& out);

// "2026-11-21T19:30:00.123Z"
void append_utc_timestamp(std::int64_t ms_since_epoch, std::string& out);

}  // namespace sagapool
