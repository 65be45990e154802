// libFuzzer target: the request validator (DESIGN.md, "Messages") on
// arbitrary bytes. Besides "no crash, no hang, no sanitizer report", every
// accepted request must obey every rule, view only the input's bytes, and
// survive a round trip: its canonical JSON parses to the same request with
// the same payload hash.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "sagapool/request.hpp"

namespace {

using sagapool::RequestError;
using sagapool::RequestView;

void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_parse_request: violated: %s\n", what);
  std::abort();
}

bool inside(std::string_view part, std::string_view whole) {
  return part.empty() ||
         (part.data() >= whole.data() && part.data() + part.size() <= whole.data() + whole.size());
}

bool is_currency(std::string_view c) {
  if (c.size() != 3) return false;
  for (char ch : c) {
    if (ch < 'A' || ch > 'Z') return false;
  }
  return true;
}

std::string canonical(const RequestView& r) {
  std::string s = R"({"id":")" + std::string(r.id) + R"(","from":")" + std::string(r.from) +
                  R"(","to":")" + std::string(r.to) + R"(","amount":)" + std::to_string(r.amount);
  if (!r.currency.empty()) s += R"(,"currency":")" + std::string(r.currency) + "\"";
  if (!r.metadata.empty()) s += R"(,"metadata":)" + std::string(r.metadata);
  return s + "}";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  RequestView r;
  r.id = "stale";
  const RequestError e = sagapool::parse_request(bytes, r);
  require(!sagapool::error_code(e).empty() && !sagapool::error_message(e).empty(), "every error has a code and a message");
  if (e != RequestError::ok) {
    require(r.from.empty() && r.to.empty() && r.amount == 0 && r.currency.empty() && r.metadata.empty(),
            "a refused request leaves the view reset");
    // But for an id it could still read (a `rejected` answer goes to it):
    // a valid identifier from the message's own bytes, never from a message
    // whose structure or id was the fault.
    require(r.id.empty() || (inside(r.id, bytes) && sagapool::is_valid_identifier(r.id, sagapool::kMaxIdLength) &&
                             e > RequestError::too_deep && e != RequestError::missing_id &&
                             e != RequestError::bad_id),
            "a refused request keeps only a readable id");
    return 0;
  }
  require(size <= sagapool::kMaxRequestBytes, "an accepted message is at most 64 KiB");
  require(inside(r.id, bytes) && inside(r.from, bytes) && inside(r.to, bytes) && inside(r.currency, bytes) &&
              inside(r.metadata, bytes),
          "views point into the message");
  require(sagapool::is_valid_identifier(r.id, sagapool::kMaxIdLength), "id is 1..128 identifier chars");
  require(sagapool::is_valid_identifier(r.from, sagapool::kMaxAccountIdLength), "from is 1..64 identifier chars");
  require(sagapool::is_valid_identifier(r.to, sagapool::kMaxAccountIdLength), "to is 1..64 identifier chars");
  require(r.from != r.to, "from and to differ");
  require(r.amount >= 1, "amount is at least 1");
  require(r.currency.empty() || is_currency(r.currency), "currency is 3 upper-case letters");
  require(r.metadata.empty() || (r.metadata.size() <= sagapool::kMaxMetadataBytes && r.metadata.front() == '{' &&
                                 r.metadata.back() == '}'),
          "metadata is one object of at most 4 KiB");

  const std::string again_bytes = canonical(r);
  RequestView again;
  require(sagapool::parse_request(again_bytes, again) == RequestError::ok, "the canonical form is accepted");
  require(again.id == r.id && again.from == r.from && again.to == r.to && again.amount == r.amount &&
              again.currency == r.currency && again.metadata == r.metadata,
          "the canonical form carries the same request");
  require(sagapool::payload_hash(again) == sagapool::payload_hash(r), "the canonical form has the same payload hash");
  return 0;
}
