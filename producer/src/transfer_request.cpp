#include "sagapool/transfer_request.hpp"

#include <charconv>
#include <iterator>

#include "sagapool/json_text.hpp"

namespace sagapool {

void append_json(std::string& out, const TransferRequest& r) {
  out += R"({"id": ")";
  append_json_escaped(out, r.id);
  out += R"(", "from": ")";
  append_json_escaped(out, r.from);
  out += R"(", "to": ")";
  append_json_escaped(out, r.to);
  out += R"(", "amount": )";
  char digits[24];
  const auto [end, ec] = std::to_chars(std::begin(digits), std::end(digits), r.amount);
  (void)ec;  // 24 chars always hold an int64
  out.append(digits, end);
  if (!r.currency.empty()) {
    out += R"(, "currency": ")";
    append_json_escaped(out, r.currency);
    out += '"';
  }
  if (!r.metadata.empty()) {
    out += R"(, "metadata": )";
    out += r.metadata;
  }
  out += '}';
}

std::string to_json(const TransferRequest& r) {
  std::string out;
  out.reserve(96 + r.id.size() + r.from.size() + r.to.size() + r.metadata.size());
  append_json(out, r);
  return out;
}

}  // namespace sagapool
