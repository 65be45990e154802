#include "pg_support.hpp"

#include <algorithm>
#include <charconv>
#include <cstring>

namespace sagapool::pg {

namespace {

struct OptionsFreer {
  void operator()(PQconninfoOption* o) const noexcept { PQconninfoFree(o); }
};
using OptionsPtr = std::unique_ptr<PQconninfoOption, OptionsFreer>;

bool has_value(const PQconninfoOption& o) { return o.val != nullptr && o.val[0] != '\0'; }

}  // namespace

std::optional<std::string> redacted_display_name(const std::string& conninfo) {
  char* err = nullptr;
  OptionsPtr opts(PQconninfoParse(conninfo.c_str(), &err));
  // The parser's message is dropped on purpose: it can quote the text around
  // a syntax error, which may be a password.
  PQfreemem(err);
  if (!opts) return std::nullopt;
  std::string user, host, port, dbname, extra;
  for (const PQconninfoOption* o = opts.get(); o->keyword != nullptr; ++o) {
    if (!has_value(*o)) continue;
    const std::string_view key = o->keyword;
    const std::string_view disp = o->dispchar != nullptr ? o->dispchar : "";
    // '*' marks secrets (password, sslpassword); 'D' marks debug options.
    if (disp.find('*') != std::string_view::npos || disp.find('D') != std::string_view::npos) {
      continue;
    }
    if (key == "user")
      user = o->val;
    else if (key == "host" || (key == "hostaddr" && host.empty()))
      host = o->val;
    else if (key == "port")
      port = o->val;
    else if (key == "dbname")
      dbname = o->val;
    else if (key != "hostaddr") {
      extra += extra.empty() ? '?' : '&';
      extra += key;
      extra += '=';
      extra += o->val;
    }
  }
  std::string out = "postgresql://";
  if (!user.empty()) out += user + "@";
  out += host;
  if (!port.empty()) out += ":" + port;
  out += "/" + dbname + extra;
  return out;
}

std::optional<std::string> conninfo_value(const std::string& conninfo, std::string_view key) {
  char* err = nullptr;
  OptionsPtr opts(PQconninfoParse(conninfo.c_str(), &err));
  PQfreemem(err);  // not shown: it may quote a password
  if (!opts) return std::nullopt;
  for (const PQconninfoOption* o = opts.get(); o->keyword != nullptr; ++o) {
    if (key == o->keyword && has_value(*o)) return std::string(o->val);
  }
  return std::nullopt;
}

void ArrayLiteral::separator() {
  if (!first_) out_.push_back(',');
  first_ = false;
}

void ArrayLiteral::text(std::string_view s) {
  separator();
  out_.push_back('"');
  // Ids and currencies rarely need escaping: appended whole when not.
  const auto special = [](char c) { return c == '"' || c == '\\' || c == '\0'; };
  if (std::none_of(s.begin(), s.end(), special)) {
    out_.append(s);
  } else {
    for (const char c : s) {
      if (c == '\0') ok_ = false;
      if (c == '"' || c == '\\') out_.push_back('\\');
      out_.push_back(c);
    }
  }
  out_.push_back('"');
}

void ArrayLiteral::int64(std::int64_t v) {
  separator();
  char digits[24];
  const auto end = std::to_chars(digits, digits + sizeof digits, v).ptr;
  out_.append(digits, end);
}

void ArrayLiteral::int64_or_null(std::optional<std::int64_t> v) {
  if (v) return int64(*v);
  separator();
  out_ += "NULL";
}

void ArrayLiteral::boolean(bool v) {
  separator();
  out_.push_back(v ? 't' : 'f');
}

std::string ArrayLiteral::finish() && {
  out_.push_back('}');
  return std::move(out_);
}

std::string_view value(const PGresult* r, int row, int col) {
  return {PQgetvalue(r, row, col), static_cast<std::size_t>(PQgetlength(r, row, col))};
}

bool is_null(const PGresult* r, int row, int col) { return PQgetisnull(r, row, col) != 0; }

namespace {
template <typename Int>
bool parse_integer(std::string_view text, Int& out) {
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && ptr == end && !text.empty();
}
}  // namespace

bool parse_int(std::string_view text, std::int64_t& out) { return parse_integer(text, out); }
bool parse_int(std::string_view text, std::int32_t& out) { return parse_integer(text, out); }

Failure classify(std::string_view sqlstate, bool connection_bad, bool unique_means_applied) {
  // The server gives every error a SQLSTATE: without one, libpq failed on
  // its side, nearly always the socket (a read can fail with EPIPE and leave
  // the connection marked OK, as an immediate shutdown shows) or the
  // protocol's sync. A fresh connection is the cure either way.
  if (sqlstate.empty()) return Failure::connection;
  if (sqlstate.starts_with("08") || sqlstate == "57P01" || sqlstate == "57P02" ||
      sqlstate == "57P03" || sqlstate == "53300") {
    return Failure::connection;
  }
  if (sqlstate == "40001" || sqlstate == "40P01" || sqlstate == "55P03" || sqlstate == "57014") {
    return Failure::retry_call;
  }
  if (sqlstate.starts_with("53")) return Failure::retry_stage;  // disk full, out of memory
  // saga_settle_apply, saga_walk_move: a walk no longer stands (functions.sql).
  if (sqlstate == "SGW01") return Failure::retry_stage;
  if (sqlstate == "23505" && unique_means_applied) return Failure::already_applied;
  if (sqlstate == "42804" || sqlstate == "42P13") return Failure::definition_changed;
  if (connection_bad) return Failure::connection;
  return Failure::fatal;
}

std::string_view sqlstate_of(const PGresult* r) {
  const char* s = r != nullptr ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : nullptr;
  return s != nullptr ? std::string_view(s) : std::string_view();
}

std::string describe(const PGresult* r, const PGconn* c) {
  std::string out;
  const char* primary = r != nullptr ? PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY) : nullptr;
  if (primary != nullptr) {
    out = primary;
    if (const char* detail = PQresultErrorField(r, PG_DIAG_MESSAGE_DETAIL)) {
      out += " (";
      out += detail;
      out += ")";
    }
  } else if (r != nullptr && PQresultErrorMessage(r)[0] != '\0') {
    out = PQresultErrorMessage(r);
  } else if (c != nullptr) {
    out = PQerrorMessage(c);
  }
  // libpq's own messages span lines ("...\n\tThis probably means..."): one
  // line for logs.
  std::string flat;
  for (const char ch : out) {
    const bool space = ch == '\n' || ch == '\t' || ch == '\r' || ch == ' ';
    if (space && (flat.empty() || flat.back() == ' ')) continue;
    flat.push_back(space ? ' ' : ch);
  }
  while (!flat.empty() && flat.back() == ' ') flat.pop_back();
  out = flat.empty() ? "unknown error" : std::move(flat);
  if (const std::string_view state = sqlstate_of(r); !state.empty()) {
    out += " [SQLSTATE ";
    out += state;
    out += "]";
  }
  return out;
}

}  // namespace sagapool::pg
