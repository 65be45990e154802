#pragma once
// The pure part of `sagactl accounts import`: the CSV text to accounts, or
// errors naming their lines. No I/O and no store, so it can be fuzzed
// (tests/fuzz) on arbitrary bytes; import.cpp reads the file, checks the
// stores and creates the accounts.
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sagapool/domain.hpp"

namespace sagapool::ctl {

// Bounded error list: the first few are kept, the rest only counted.
class ImportErrors {
 public:
  static constexpr std::size_t kMaxShown = 10;
  explicit ImportErrors(std::string file) : file_(std::move(file)) {}
  void add(std::size_t line, const std::string& message) {
    if (shown_.size() < kMaxShown) shown_.push_back(file_ + ":" + std::to_string(line) + ": " + message);
    ++count_;
  }
  bool any() const { return count_ != 0; }
  std::size_t count() const { return count_; }
  const std::vector<std::string>& shown() const { return shown_; }
  // One line for a single error; otherwise one line per error shown and a
  // summary line naming `what`. Returns the exit code (1). In import.cpp.
  int report(std::string_view what) const;

 private:
  std::string file_;
  std::vector<std::string> shown_;
  std::size_t count_ = 0;
};

struct ParsedImport {
  std::vector<Account> accounts;   // in file order; opening_balance = balance
  std::vector<std::size_t> lines;  // each account's line number (1-based; the header is 1)
  // On errors: how report() names them ("error" for the file or its header,
  // "error(s) in the file" for rows).
  std::string_view what = "error";
};

// Parses a whole import file (RFC 4180 CSV: header `id,balance` plus
// optional columns `min_balance,currency,locked`; quoted fields; an optional
// UTF-8 byte order mark; LF or CRLF; blank lines at the end ignored): every
// row, every field, and ids repeated within the file. Field errors name
// their line and column. When
// `errors.any()` afterwards, nothing may be imported.
void parse_accounts_csv(std::string_view text, ParsedImport& out, ImportErrors& errors);

}  // namespace sagapool::ctl
