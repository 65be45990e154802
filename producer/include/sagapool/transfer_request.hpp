#pragma once
// A transfer request as upstream code builds it, and its wire format
// (DESIGN.md, "Messages"): what saga-worker reads from transfers.requests.
#include <cstdint>
#include <string>

namespace sagapool {

struct TransferRequest {
  std::string id;        // idempotency key, 1..128 of [A-Za-z0-9._:-]
  std::string from;      // source account id (also the Kafka key)
  std::string to;        // destination account id
  std::int64_t amount = 0;  // minor units, >= 1
  std::string currency;  // optional: empty = not sent
  std::string metadata;  // optional JSON object text, inserted verbatim; empty = not sent
};

// The request as one JSON line in DESIGN.md's format and key order:
// {"id": "...", "from": "...", "to": "...", "amount": N[, "currency": "..."][, "metadata": {...}]}
// Strings are JSON-escaped; metadata is inserted verbatim. Nothing is
// checked here: parse_request (sagapool/request.hpp) says whether the
// result is a request saga-worker accepts.
std::string to_json(const TransferRequest& r);
// Same, appended to `out` (lets a hot loop reuse one buffer).
void append_json(std::string& out, const TransferRequest& r);

}  // namespace sagapool
