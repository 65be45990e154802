// Transfer request validation (DESIGN.md, "Messages").
//
// One hand-written pass over the caller's bytes: no allocation, no
// exceptions, time linear in the input. Recursion is bounded by
// kMaxJsonDepth, so stack use is bounded too.
//
// Checks run in a fixed order so that one message always yields one error:
//   empty -> too_large -> not_utf8 (whole message)
//   -> JSON structure (malformed_json, too_deep, not_object, trailing_data),
//      first problem in byte order, the scan stops there
//   -> keys (unknown_key before duplicate_key, wherever they occur)
//   -> missing required keys (id, from, to, amount)
//   -> field rules in RequestError order (id, from, to, same_account,
//      amount, currency, metadata).
#include "sagapool/request.hpp"

#include <array>
#include <cstdint>
#include <limits>

namespace sagapool {
namespace {

constexpr unsigned char to_byte(char c) noexcept { return static_cast<unsigned char>(c); }

constexpr bool is_digit(int c) noexcept { return c >= '0' && c <= '9'; }

constexpr bool is_hex(int c) noexcept {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

constexpr std::uint32_t hex_value(int c) noexcept {
  if (is_digit(c)) return static_cast<std::uint32_t>(c - '0');
  if (c >= 'a' && c <= 'f') return static_cast<std::uint32_t>(c - 'a' + 10);
  return static_cast<std::uint32_t>(c - 'A' + 10);
}

// RFC 8259: only these four bytes are whitespace (no form feed, no NBSP).
constexpr bool is_json_ws(unsigned char c) noexcept {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

constexpr bool is_identifier_char(char c) noexcept {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || is_digit(c) || c == '.' ||
         c == '_' || c == ':' || c == '-';
}

// Well-formed UTF-8 per Unicode table 3-7: the second byte's range rules out
// overlong forms (C0, C1, E0 80..9F, F0 80..8F), surrogates (ED A0..BF) and
// code points above U+10FFFF (F4 90.., F5..FF); a sequence cut short by the
// end of the message or by a non-continuation byte is rejected too.
bool is_utf8(std::string_view s) noexcept {
  std::size_t i = 0;
  while (i < s.size()) {
    const unsigned char b = to_byte(s[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    unsigned char lo = 0x80;
    unsigned char hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      len = 2;
    } else if (b == 0xE0) {
      len = 3;
      lo = 0xA0;
    } else if (b == 0xED) {
      len = 3;
      hi = 0x9F;
    } else if (b >= 0xE1 && b <= 0xEF) {
      len = 3;
    } else if (b == 0xF0) {
      len = 4;
      lo = 0x90;
    } else if (b >= 0xF1 && b <= 0xF3) {
      len = 4;
    } else if (b == 0xF4) {
      len = 4;
      hi = 0x8F;
    } else {
      return false;  // continuation byte without a lead, C0, C1, F5..FF
    }
    if (s.size() - i < len) return false;
    const unsigned char second = to_byte(s[i + 1]);
    if (second < lo || second > hi) return false;
    for (std::size_t k = 2; k < len; ++k) {
      if ((to_byte(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += len;
  }
  return true;
}

// The top-level keys, in the order their rules are checked.
enum class Key : std::uint8_t { id, from, to, amount, currency, metadata, unknown };
constexpr std::size_t kKnownKeys = 6;
constexpr std::array<std::string_view, kKnownKeys> kKeyNames{"id",       "from",    "to",
                                                             "amount", "currency", "metadata"};

// A key counts only when written literally: `raw` is the bytes between the
// quotes, undecoded, so a key with any escape ("\u0069d") never equals a
// name and cannot slip past duplicate detection.
Key classify_key(std::string_view raw) noexcept {
  for (std::size_t k = 0; k < kKnownKeys; ++k) {
    if (raw == kKeyNames[k]) return static_cast<Key>(k);
  }
  return Key::unknown;
}

// Raw byte span of each known key's value, as written.
struct Fields {
  std::array<std::string_view, kKnownKeys> value{};
  std::array<bool, kKnownKeys> present{};
  std::array<bool, kKnownKeys> repeated{};
  bool unknown = false;
  bool duplicate = false;

  void note(Key key, std::string_view raw) noexcept {
    if (key == Key::unknown) {
      unknown = true;
      return;
    }
    const auto k = static_cast<std::size_t>(key);
    if (present[k]) {
      duplicate = true;
      repeated[k] = true;
      return;
    }
    present[k] = true;
    value[k] = raw;
  }
  [[nodiscard]] bool has(Key key) const noexcept { return present[static_cast<std::size_t>(key)]; }
  [[nodiscard]] std::string_view raw(Key key) const noexcept {
    return value[static_cast<std::size_t>(key)];
  }
};

// Recursive-descent JSON scanner over UTF-8 that is already known to be
// well-formed. It validates the grammar and records the top-level fields;
// it never decodes or copies anything.
class Scanner {
 public:
  explicit Scanner(std::string_view s) noexcept : s_(s) {}

  // The whole message: one object, optional whitespace around it.
  RequestError request(Fields& fields) noexcept {
    skip_ws();
    if (peek() != '{') {
      if (peek() < 0) return RequestError::malformed_json;  // whitespace only
      // A valid non-object value is `not_object` whatever follows it.
      const RequestError e = value(1);
      return e == RequestError::ok ? RequestError::not_object : e;
    }
    ++pos_;
    skip_ws();
    if (!eat('}')) {
      if (const RequestError e = members(fields); e != RequestError::ok) return e;
    }
    skip_ws();
    return pos_ == s_.size() ? RequestError::ok : RequestError::trailing_data;
  }

 private:
  [[nodiscard]] int peek() const noexcept { return pos_ < s_.size() ? to_byte(s_[pos_]) : -1; }

  bool eat(char c) noexcept {
    if (peek() != to_byte(c)) return false;
    ++pos_;
    return true;
  }

  void skip_ws() noexcept {
    while (pos_ < s_.size() && is_json_ws(to_byte(s_[pos_]))) ++pos_;
  }

  void skip_digits() noexcept {
    while (is_digit(peek())) ++pos_;
  }

  // Members of the top-level object, after its '{'. The values of top-level
  // members start at depth 1, so a metadata object may nest kMaxJsonDepth
  // levels counting itself.
  RequestError members(Fields& fields) noexcept {
    for (;;) {
      if (peek() != '"') return RequestError::malformed_json;
      const std::size_t key_begin = pos_ + 1;
      if (const RequestError e = string(); e != RequestError::ok) return e;
      const Key key = classify_key(s_.substr(key_begin, pos_ - 1 - key_begin));
      skip_ws();
      if (!eat(':')) return RequestError::malformed_json;
      skip_ws();
      const std::size_t value_begin = pos_;
      // amount alone is lexed leniently so that "01" reaches its own rule
      // (amount_leading_zero) instead of failing as malformed JSON.
      const bool lenient = key == Key::amount && (peek() == '-' || is_digit(peek()));
      const RequestError e = lenient ? number(true) : value(1);
      if (e != RequestError::ok) return e;
      fields.note(key, s_.substr(value_begin, pos_ - value_begin));
      skip_ws();
      if (eat(',')) {
        skip_ws();
        continue;
      }
      return eat('}') ? RequestError::ok : RequestError::malformed_json;
    }
  }

  RequestError value(int depth) noexcept {
    switch (peek()) {
      case '{':
        return object(depth);
      case '[':
        return array(depth);
      case '"':
        return string();
      case 't':
        return literal("true");
      case 'f':
        return literal("false");
      case 'n':
        return literal("null");
      default:
        return number(false);
    }
  }

  // Objects below the top level are opaque (metadata, or a wrongly typed
  // field): duplicate keys inside them are allowed on purpose, since
  // metadata is kept verbatim and never interpreted.
  RequestError object(int depth) noexcept {
    if (depth > kMaxJsonDepth) return RequestError::too_deep;
    ++pos_;
    skip_ws();
    if (eat('}')) return RequestError::ok;
    for (;;) {
      if (peek() != '"') return RequestError::malformed_json;
      if (const RequestError e = string(); e != RequestError::ok) return e;
      skip_ws();
      if (!eat(':')) return RequestError::malformed_json;
      skip_ws();
      if (const RequestError e = value(depth + 1); e != RequestError::ok) return e;
      skip_ws();
      if (eat(',')) {
        skip_ws();
        continue;
      }
      return eat('}') ? RequestError::ok : RequestError::malformed_json;
    }
  }

  RequestError array(int depth) noexcept {
    if (depth > kMaxJsonDepth) return RequestError::too_deep;
    ++pos_;
    skip_ws();
    if (eat(']')) return RequestError::ok;
    for (;;) {
      if (const RequestError e = value(depth + 1); e != RequestError::ok) return e;
      skip_ws();
      if (eat(',')) {
        skip_ws();
        continue;
      }
      return eat(']') ? RequestError::ok : RequestError::malformed_json;
    }
  }

  // At the opening quote. Raw control characters are not allowed; bytes at
  // or above 0x80 pass, since the UTF-8 check already ran.
  RequestError string() noexcept {
    ++pos_;
    while (pos_ < s_.size()) {
      const unsigned char c = to_byte(s_[pos_]);
      if (c == '"') {
        ++pos_;
        return RequestError::ok;
      }
      if (c < 0x20) return RequestError::malformed_json;
      if (c == '\\') {
        if (!escape()) return RequestError::malformed_json;
        continue;
      }
      ++pos_;
    }
    return RequestError::malformed_json;  // unterminated
  }

  // At the backslash. \uXXXX must name a scalar value: a high surrogate must
  // be followed by an escaped low surrogate, a low surrogate alone is invalid.
  bool escape() noexcept {
    ++pos_;
    const int c = peek();
    if (c < 0) return false;
    ++pos_;
    switch (c) {
      case '"':
      case '\\':
      case '/':
      case 'b':
      case 'f':
      case 'n':
      case 'r':
      case 't':
        return true;
      case 'u':
        break;
      default:
        return false;
    }
    std::uint32_t unit = 0;
    if (!hex4(unit)) return false;
    if (unit >= 0xDC00 && unit <= 0xDFFF) return false;
    if (unit < 0xD800 || unit > 0xDBFF) return true;
    std::uint32_t low = 0;
    return eat('\\') && eat('u') && hex4(low) && low >= 0xDC00 && low <= 0xDFFF;
  }

  bool hex4(std::uint32_t& unit) noexcept {
    for (int k = 0; k < 4; ++k) {
      const int c = peek();
      if (!is_hex(c)) return false;
      unit = unit * 16 + hex_value(c);
      ++pos_;
    }
    return true;
  }

  // JSON number grammar; `lenient` also accepts leading zeros ("007").
  RequestError number(bool lenient) noexcept {
    eat('-');
    if (!is_digit(peek())) return RequestError::malformed_json;
    if (!lenient && peek() == '0') {
      ++pos_;
      if (is_digit(peek())) return RequestError::malformed_json;
    } else {
      skip_digits();
    }
    if (eat('.')) {
      if (!is_digit(peek())) return RequestError::malformed_json;
      skip_digits();
    }
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (!is_digit(peek())) return RequestError::malformed_json;
      skip_digits();
    }
    return RequestError::ok;
  }

  RequestError literal(std::string_view word) noexcept {
    if (s_.substr(pos_, word.size()) != word) return RequestError::malformed_json;
    pos_ += word.size();
    return RequestError::ok;
  }

  std::string_view s_;
  std::size_t pos_ = 0;
};

// The bytes between the quotes of a string value, or false when `raw` is
// not a string. Escapes stay as written, so they fail the identifier and
// currency alphabets: those fields must be written literally.
bool string_body(std::string_view raw, std::string_view& body) noexcept {
  if (raw.size() < 2 || raw.front() != '"') return false;
  body = raw.substr(1, raw.size() - 2);
  return true;
}

RequestError check_identifier(std::string_view raw, std::size_t max_len, RequestError bad,
                              std::string_view& out) noexcept {
  std::string_view body;
  if (!string_body(raw, body) || !is_valid_identifier(body, max_len)) return bad;
  out = body;
  return RequestError::ok;
}

// `raw` passed the scanner: a JSON value, or a lenient number for amount.
RequestError check_amount(std::string_view raw, std::int64_t& out) noexcept {
  const bool negative = !raw.empty() && raw.front() == '-';
  const std::string_view digits = raw.substr(negative ? 1 : 0);
  if (digits.empty() || !is_digit(digits.front())) return RequestError::amount_not_integer;
  for (const char c : digits) {
    if (!is_digit(c)) return RequestError::amount_not_integer;  // fraction or exponent
  }
  if (digits.size() > 1 && digits.front() == '0') return RequestError::amount_leading_zero;
  if (negative || digits == "0") return RequestError::amount_not_positive;
  constexpr std::size_t kMaxDigits = 19;  // 2^63-1 has 19 digits; 19 nines fit in uint64
  if (digits.size() > kMaxDigits) return RequestError::amount_too_large;
  std::uint64_t value = 0;
  for (const char c : digits) value = value * 10 + static_cast<std::uint64_t>(c - '0');
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  if (value > kMax) return RequestError::amount_too_large;
  out = static_cast<std::int64_t>(value);
  return RequestError::ok;
}

RequestError check_currency(std::string_view raw, std::string_view& out) noexcept {
  std::string_view body;
  if (!string_body(raw, body) || body.size() != 3) return RequestError::bad_currency;
  for (const char c : body) {
    if (c < 'A' || c > 'Z') return RequestError::bad_currency;
  }
  out = body;
  return RequestError::ok;
}

// The grammar inside was checked by the scanner (malformed_json, too_deep).
RequestError check_metadata(std::string_view raw, std::string_view& out) noexcept {
  if (raw.empty() || raw.front() != '{') return RequestError::bad_metadata;
  if (raw.size() > kMaxMetadataBytes) return RequestError::metadata_too_large;
  out = raw;
  return RequestError::ok;
}

RequestError check_missing(const Fields& f) noexcept {
  if (!f.has(Key::id)) return RequestError::missing_id;
  if (!f.has(Key::from)) return RequestError::missing_from;
  if (!f.has(Key::to)) return RequestError::missing_to;
  if (!f.has(Key::amount)) return RequestError::missing_amount;
  return RequestError::ok;
}

RequestError check_fields(const Fields& f, RequestView& v) noexcept {
  RequestError e = check_identifier(f.raw(Key::id), kMaxIdLength, RequestError::bad_id, v.id);
  if (e != RequestError::ok) return e;
  e = check_identifier(f.raw(Key::from), kMaxAccountIdLength, RequestError::bad_from, v.from);
  if (e != RequestError::ok) return e;
  e = check_identifier(f.raw(Key::to), kMaxAccountIdLength, RequestError::bad_to, v.to);
  if (e != RequestError::ok) return e;
  if (v.from == v.to) return RequestError::same_account;
  if (e = check_amount(f.raw(Key::amount), v.amount); e != RequestError::ok) return e;
  if (f.has(Key::currency)) {
    if (e = check_currency(f.raw(Key::currency), v.currency); e != RequestError::ok) return e;
  }
  if (f.has(Key::metadata)) {
    if (e = check_metadata(f.raw(Key::metadata), v.metadata); e != RequestError::ok) return e;
  }
  return RequestError::ok;
}

// Every rule after the JSON structure, in the documented order.
RequestError check_request(const Fields& f, RequestView& v) noexcept {
  if (f.unknown) return RequestError::unknown_key;
  if (f.duplicate) return RequestError::duplicate_key;
  if (const RequestError e = check_missing(f); e != RequestError::ok) return e;
  return check_fields(f, v);
}

struct Description {
  std::string_view code;
  std::string_view message;
};

// One switch for both strings, so -Wswitch flags a value added without them.
Description describe(RequestError e) noexcept {
  using E = RequestError;
  switch (e) {
    case E::ok: return {"ok", "request is valid"};
    case E::empty: return {"empty", "message is empty"};
    case E::too_large: return {"too_large", "message is larger than 64 KiB"};
    case E::not_utf8: return {"not_utf8", "message is not valid UTF-8"};
    case E::malformed_json: return {"malformed_json", "message is not well-formed JSON"};
    case E::not_object: return {"not_object", "message is JSON but not an object"};
    case E::trailing_data: return {"trailing_data", "message has data after the JSON object"};
    case E::too_deep: return {"too_deep", "JSON nesting is deeper than 32 levels"};
    case E::unknown_key:
      return {"unknown_key", "request has an unknown key (keys must be written without escapes)"};
    case E::duplicate_key: return {"duplicate_key", "request has a duplicate key"};
    case E::missing_id: return {"missing_id", "request has no id"};
    case E::missing_from: return {"missing_from", "request has no from account"};
    case E::missing_to: return {"missing_to", "request has no to account"};
    case E::missing_amount: return {"missing_amount", "request has no amount"};
    case E::bad_id:
      return {"bad_id", "id must be a string of 1 to 128 characters from [A-Za-z0-9._:-]"};
    case E::bad_from:
      return {"bad_from", "from must be a string of 1 to 64 characters from [A-Za-z0-9._:-]"};
    case E::bad_to:
      return {"bad_to", "to must be a string of 1 to 64 characters from [A-Za-z0-9._:-]"};
    case E::same_account: return {"same_account", "from and to must be different accounts"};
    case E::amount_not_integer: return {"amount_not_integer", "amount must be a JSON integer"};
    case E::amount_leading_zero:
      return {"amount_leading_zero", "amount must not have leading zeros"};
    case E::amount_not_positive: return {"amount_not_positive", "amount must be at least 1"};
    case E::amount_too_large:
      return {"amount_too_large", "amount must be at most 9223372036854775807"};
    case E::bad_currency:
      return {"bad_currency", "currency must be a string of 3 upper-case letters"};
    case E::bad_metadata: return {"bad_metadata", "metadata must be a JSON object"};
    case E::metadata_too_large:
      return {"metadata_too_large", "metadata must be at most 4 KiB serialized"};
  }
  return {"unknown", "unknown request error"};  // a value outside the enum
}

// FNV-1a 64. Integers are fed as 8 little-endian bytes, so the hash is the
// same on every platform; each string is preceded by its length, so field
// boundaries cannot shift (("ab","c") != ("a","bc")).
class Fnv1a64 {
 public:
  void u64(std::uint64_t v) noexcept {
    for (int k = 0; k < 8; ++k) byte(static_cast<unsigned char>(v >> (8 * k)));
  }
  void field(std::string_view s) noexcept {
    u64(s.size());
    for (const char c : s) byte(to_byte(c));
  }
  [[nodiscard]] std::uint64_t value() const noexcept { return h_; }

 private:
  void byte(unsigned char b) noexcept {
    h_ ^= b;
    h_ *= 0x100000001b3ULL;
  }
  std::uint64_t h_ = 0xcbf29ce484222325ULL;
};

}  // namespace

std::string_view error_code(RequestError e) noexcept { return describe(e).code; }

std::string_view error_message(RequestError e) noexcept { return describe(e).message; }

RequestError parse_request(std::string_view bytes, RequestView& out) noexcept {
  out = RequestView{};
  if (bytes.empty()) return RequestError::empty;
  if (bytes.size() > kMaxRequestBytes) return RequestError::too_large;
  if (!is_utf8(bytes)) return RequestError::not_utf8;
  Fields fields;
  if (const RequestError e = Scanner(bytes).request(fields); e != RequestError::ok) return e;
  RequestView view;
  const RequestError e = check_request(fields, view);
  if (e == RequestError::ok) {
    out = view;
  } else if (fields.has(Key::id) && !fields.repeated[static_cast<std::size_t>(Key::id)]) {
    // Still answerable: one literal, valid id in a well-formed object.
    check_identifier(fields.raw(Key::id), kMaxIdLength, RequestError::bad_id, out.id);
  }
  return e;
}

// Stored with every transfer: changing this layout turns every later
// duplicate into a conflict, so it needs a migration. Layout: from, to
// (length-prefixed), amount (8 bytes LE), currency, metadata (length-
// prefixed; absent = length 0). The id is left out on purpose. Metadata is
// hashed verbatim, so whitespace inside it is part of the payload.
std::uint64_t payload_hash(const RequestView& r) noexcept {
  Fnv1a64 h;
  h.field(r.from);
  h.field(r.to);
  h.u64(static_cast<std::uint64_t>(r.amount));
  h.field(r.currency);
  h.field(r.metadata);
  return h.value();
}

bool is_valid_identifier(std::string_view s, std::size_t max_len) noexcept {
  if (s.empty() || s.size() > max_len) return false;
  for (const char c : s) {
    if (!is_identifier_char(c)) return false;
  }
  return true;
}

}  // namespace sagapool
