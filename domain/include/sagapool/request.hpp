#pragma once
// Transfer requests: strict validation of the wire format (DESIGN.md,
// "Messages") and the payload hash that tells a duplicate from a conflict.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace sagapool {

inline constexpr std::size_t kMaxRequestBytes = 64 * 1024;
inline constexpr std::size_t kMaxMetadataBytes = 4 * 1024;
inline constexpr std::size_t kMaxIdLength = 128;
inline constexpr std::size_t kMaxAccountIdLength = 64;
// Nesting bound for every value in a request (in practice: metadata),
// counted from the value itself: `"metadata": {}` has depth 1, so metadata
// may hold 32 levels of objects/arrays including its own braces. The
// enclosing request object is not counted. Deeper input is `too_deep`.
inline constexpr int kMaxJsonDepth = 32;

// Why a request is invalid: one value per rule, each with a stable code that
// goes into the dead-letter header `saga.error` (the metric label stays the
// coarse reason `invalid`).
enum class RequestError : std::uint8_t {
  ok,
  empty,
  too_large,
  not_utf8,
  malformed_json,     // not JSON at all, or truncated
  not_object,         // valid JSON but not one object
  trailing_data,      // bytes after the object
  too_deep,           // nesting beyond kMaxJsonDepth (a structural error)
  unknown_key,
  duplicate_key,
  missing_id,
  missing_from,
  missing_to,
  missing_amount,
  bad_id,             // wrong type, length or characters
  bad_from,
  bad_to,
  same_account,
  amount_not_integer, // string, float, exponent, boolean, null, ...
  amount_leading_zero,
  amount_not_positive,
  amount_too_large,
  bad_currency,
  bad_metadata,       // not an object
  metadata_too_large,
};

std::string_view error_code(RequestError e) noexcept;     // e.g. "amount_leading_zero"
std::string_view error_message(RequestError e) noexcept;  // one human sentence

// A request that passed validation. The string members view into the
// caller's message bytes when `parse_request` returns, so the message must
// outlive the view; `metadata` is the object's original bytes.
struct RequestView {
  std::string_view id;
  std::string_view from;
  std::string_view to;
  std::int64_t amount = 0;
  std::string_view currency;  // empty when absent
  std::string_view metadata;  // empty when absent
};

// Validates `bytes` against every rule in DESIGN.md. Never allocates, never
// throws; runs in time linear in the input. Exactly one error is reported,
// the first in this order: empty, too_large, not_utf8 (whole message), JSON
// structure (malformed_json / too_deep / not_object / trailing_data, the
// first in byte order), keys (unknown_key before duplicate_key; a key with
// an escape is unknown), missing keys (id, from, to, amount), then field
// rules in enum order. `out` is reset first and filled only on `ok`, but
// for `out.id`: an invalid request whose id can still be read (the JSON
// object is well-formed and holds one literal "id" that passes its rule)
// keeps it there, so that the request can be answered (`rejected`).
[[nodiscard]] RequestError parse_request(std::string_view bytes, RequestView& out) noexcept;

// Stable 64-bit hash over the fields that define a transfer's payload
// (from, to, amount, currency, metadata bytes). Same id + same hash + same
// fields = duplicate; anything else under the same id = conflict.
std::uint64_t payload_hash(const RequestView& r) noexcept;

// Identifier alphabet shared by ids and account ids: [A-Za-z0-9._:-].
bool is_valid_identifier(std::string_view s, std::size_t max_len) noexcept;

}  // namespace sagapool
