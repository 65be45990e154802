#pragma once
// RAII and small helpers for libpq, and the one place SQLSTATEs map onto the
// error taxonomy (status.hpp). Private to the PostgreSQL backend.
#include <libpq-fe.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sagapool/status.hpp"

namespace sagapool::pg {

struct ConnCloser {
  void operator()(PGconn* c) const noexcept { PQfinish(c); }
};
using ConnPtr = std::unique_ptr<PGconn, ConnCloser>;

struct ResultClearer {
  void operator()(PGresult* r) const noexcept { PQclear(r); }
};
using ResultPtr = std::unique_ptr<PGresult, ResultClearer>;

// ---- connection strings ----------------------------------------------------

// The connection string with every secret option (libpq marks them with
// dispchar '*': password, sslpassword) left out, as
// `postgresql://user@host:port/dbname?option=value...`. nullopt when libpq
// cannot parse `conninfo` (the parser's message is not repeated: it may quote
// part of a password).
std::optional<std::string> redacted_display_name(const std::string& conninfo);

// The value of one option of a connection string (URI or key=value), or
// nullopt when it is absent or the string does not parse.
std::optional<std::string> conninfo_value(const std::string& conninfo, std::string_view key);

// ---- parameters ------------------------------------------------------------

// Parameters of one statement, all sent in text format. Values are owned so a
// batch can be encoded once and sent in one round trip.
class Params {
 public:
  // Distinct names: an overload set of string_view/int64/bool would send a
  // string literal as a bool.
  void text(std::string_view v) {
    if (v.find('\0') != std::string_view::npos) ok_ = false;
    values_.emplace_back(v);
  }
  void int64(std::int64_t v) { values_.push_back(std::to_string(v)); }
  void boolean(bool v) { values_.emplace_back(v ? "t" : "f"); }
  void owned(std::string&& v) { values_.push_back(std::move(v)); }
  // SQL NULL for nullopt.
  void int64_or_null(std::optional<std::int64_t> v) {
    if (v) {
      int64(*v);
    } else {
      nulls_.push_back(values_.size());
      values_.emplace_back();
    }
  }

  // False when a text value held a NUL byte (text format cannot carry it).
  bool ok() const noexcept { return ok_; }
  int count() const noexcept { return static_cast<int>(values_.size()); }
  // Pointers into the owned values; valid until the next add.
  const char* const* values() {
    pointers_.clear();
    for (const auto& v : values_) pointers_.push_back(v.c_str());
    for (std::size_t k : nulls_) pointers_[k] = nullptr;
    return pointers_.data();
  }

 private:
  std::vector<std::string> values_;
  std::vector<const char*> pointers_;
  std::vector<std::size_t> nulls_;  // positions of NULL values
  bool ok_ = true;
};

// Builds a one-dimensional array literal (`{"a","b"}`, `{1,2}`) for a text
// parameter. Strings are quoted and escaped; a string holding a NUL byte
// cannot be sent in text format and makes `ok()` false.
class ArrayLiteral {
 public:
  ArrayLiteral() { out_.push_back('{'); }
  void text(std::string_view s);
  void int64(std::int64_t v);
  void int64_or_null(std::optional<std::int64_t> v);
  void boolean(bool v);
  bool ok() const noexcept { return ok_; }
  std::string finish() &&;

 private:
  void separator();
  std::string out_;
  bool first_ = true;
  bool ok_ = true;
};

// ---- results ---------------------------------------------------------------

std::string_view value(const PGresult* r, int row, int col);
bool is_null(const PGresult* r, int row, int col);
// Integer columns; false when the text is not an integer of that width.
bool parse_int(std::string_view text, std::int64_t& out);
bool parse_int(std::string_view text, std::int32_t& out);

// ---- errors ----------------------------------------------------------------

// What a failed statement means, decided from its SQLSTATE in one place.
enum class Failure : std::uint8_t {
  connection,       // 08*, 57P01..57P03, 53300, a dead socket, no SQLSTATE: reconnect
  retry_call,       // 40001 serialization failure, 40P01 deadlock, 55P03 lock timeout, 57014
  retry_stage,      // the server is short of resources (53*): leave it to recovery
  already_applied,  // 23505 on a write whose caller says duplicates mean "done"
  // 42804 datatype mismatch, 42P13 bad function definition: what a call
  // planned before an expand changed a row type it returns meets once the
  // expand's lock is granted (docs/RELIABILITY.md); a fresh connection plans
  // it anew. PgStore allows it once a minute a connection, else fatal.
  definition_changed,
  fatal,            // anything else: a bug, a schema mismatch, corrupted data
};

// `sqlstate` is empty when libpq itself failed (socket, protocol): always a
// reconnect. `connection_bad` says whether libpq saw the socket go.
Failure classify(std::string_view sqlstate, bool connection_bad, bool unique_means_applied);

// The server's primary message and SQLSTATE, for a Status message.
std::string describe(const PGresult* r, const PGconn* c);
std::string_view sqlstate_of(const PGresult* r);

}  // namespace sagapool::pg
