// `accounts import FILE.csv`: all or nothing across every store.
//
// The whole file is parsed and checked first (header, every field, ids
// repeated inside the file), then every id is looked up on the store it
// hashes to; only when nothing is wrong are the accounts created, one
// create_accounts batch (one transaction) per store. If a store still fails
// after others committed (a concurrent create, a lost connection), the
// message names exactly which stores' accounts were created.
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "commands.hpp"
#include "sagapool/request.hpp"

namespace sagapool::ctl {
namespace {

// Bounded error list: the first few are shown, the rest only counted.
constexpr std::size_t kMaxErrorsShown = 10;

enum class Column : std::uint8_t { id, balance, min_balance, currency, locked };
constexpr std::array<std::string_view, 5> kColumnNames = {"id", "balance", "min_balance",
                                                          "currency", "locked"};

class Errors {
 public:
  explicit Errors(std::string file) : file_(std::move(file)) {}
  void add(std::size_t line, const std::string& message) {
    if (shown_.size() < kMaxErrorsShown) {
      shown_.push_back(file_ + ":" + std::to_string(line) + ": " + message);
    }
    ++count_;
  }
  bool any() const { return count_ != 0; }
  // One line for a single error; otherwise one line per error shown and a
  // summary line. Exit 1.
  int report(std::string_view what) const {
    if (count_ == 1) return fail(kExitFailed, shown_.front() + "; nothing was imported");
    for (const std::string& e : shown_) fail(kExitFailed, e);
    std::string summary = std::to_string(count_) + " " + std::string(what);
    if (count_ > shown_.size()) summary += " (first " + std::to_string(shown_.size()) + " shown)";
    return fail(kExitFailed, summary + "; nothing was imported");
  }

 private:
  std::string file_;
  std::vector<std::string> shown_;
  std::size_t count_ = 0;
};

std::vector<std::string_view> split_fields(std::string_view line) {
  std::vector<std::string_view> out;
  for (;;) {
    const std::size_t comma = line.find(',');
    out.push_back(line.substr(0, comma));
    if (comma == std::string_view::npos) return out;
    line.remove_prefix(comma + 1);
  }
}

std::optional<Column> parse_column(std::string_view name) {
  for (std::size_t i = 0; i < kColumnNames.size(); ++i) {
    if (kColumnNames[i] == name) return static_cast<Column>(i);
  }
  return std::nullopt;
}

// Splits `text` into lines (LF or CRLF); the last line needs no newline.
std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    std::string_view line = text.substr(0, nl);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return lines;
}

bool parse_header(std::string_view line, std::vector<Column>& columns, Errors& errors) {
  std::array<bool, kColumnNames.size()> seen{};
  for (std::string_view name : split_fields(line)) {
    const std::optional<Column> c = parse_column(name);
    if (!c) {
      errors.add(1, "unknown column '" + std::string(name) +
                        "' in the header (expected id,balance and optionally min_balance, "
                        "currency, locked)");
      return false;
    }
    if (seen[static_cast<std::size_t>(*c)]) {
      errors.add(1, "column '" + std::string(name) + "' appears twice in the header");
      return false;
    }
    seen[static_cast<std::size_t>(*c)] = true;
    columns.push_back(*c);
  }
  for (Column required : {Column::id, Column::balance}) {
    if (!seen[static_cast<std::size_t>(required)]) {
      errors.add(1, "the header has no '" + std::string(kColumnNames[static_cast<std::size_t>(required)]) +
                        "' column (expected id,balance and optionally min_balance, currency, locked)");
      return false;
    }
  }
  return true;
}

// Parses one data row into `a`; on error adds it and returns false.
// `id_view` is the id as it appears in `line` (the file's own bytes).
bool parse_row(std::string_view line, std::size_t line_no, const std::vector<Column>& columns,
               Account& a, std::string_view& id_view, Errors& errors) {
  if (line.empty()) {
    errors.add(line_no, "empty line");
    return false;
  }
  if (line.find('"') != std::string_view::npos) {
    errors.add(line_no, "quoted fields are not supported (no field may contain '\"')");
    return false;
  }
  const std::vector<std::string_view> fields = split_fields(line);
  if (fields.size() != columns.size()) {
    errors.add(line_no, std::to_string(fields.size()) + " fields, but the header has " +
                            std::to_string(columns.size()));
    return false;
  }
  for (std::size_t i = 0; i < fields.size(); ++i) {
    const std::string_view f = fields[i];
    auto quoted = [f] { return "'" + std::string(f) + "'"; };
    switch (columns[i]) {
      case Column::id:
        if (!is_valid_identifier(f, kMaxAccountIdLength)) {
          errors.add(line_no, "bad account id " + quoted() + ": expected 1.." +
                                  std::to_string(kMaxAccountIdLength) + " chars of [A-Za-z0-9._:-]");
          return false;
        }
        a.id.assign(f);
        id_view = f;
        break;
      case Column::balance:
        if (!parse_int64(f, a.balance)) {
          errors.add(line_no, "bad balance " + quoted() + ": expected an integer of minor units");
          return false;
        }
        break;
      case Column::min_balance:
        if (!f.empty() && !parse_int64(f, a.min_balance)) {
          errors.add(line_no, "bad min_balance " + quoted() + ": expected an integer of minor units");
          return false;
        }
        break;
      case Column::currency:
        if (!is_valid_currency(f)) {
          errors.add(line_no, "bad currency " + quoted() + ": expected 3 upper-case letters or nothing");
          return false;
        }
        a.currency.assign(f);
        break;
      case Column::locked:
        if (f == "true" || f == "1") {
          a.locked = true;
        } else if (f.empty() || f == "false" || f == "0") {
          a.locked = false;
        } else {
          errors.add(line_no, "bad locked " + quoted() + ": expected true, false, 1, 0 or nothing");
          return false;
        }
        break;
    }
  }
  if (a.balance < a.min_balance) {
    errors.add(line_no, "balance " + std::to_string(a.balance) + " is below min_balance " +
                            std::to_string(a.min_balance));
    return false;
  }
  a.opening_balance = a.balance;
  return true;
}

struct ShardRows {
  std::vector<Account> accounts;
  std::vector<std::size_t> lines;
};

bool read_whole_file(const std::string& path, std::string& out, std::string& error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = "cannot open " + path + ": " + std::strerror(errno);
    return false;
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) {
    error = "cannot read " + path;
    return false;
  }
  out = std::move(ss).str();
  return true;
}

}  // namespace

int import_accounts(Ledger& ledger, const std::string& file) {
  std::string text;
  std::string error;
  if (!read_whole_file(file, text, error)) return fail(kExitFailed, error);
  std::string_view body = text;
  if (body.starts_with("\xEF\xBB\xBF")) body.remove_prefix(3);  // a UTF-8 byte order mark
  const std::vector<std::string_view> lines = split_lines(body);
  Errors errors(file);
  if (lines.empty()) {
    errors.add(1, "empty file: expected a header line id,balance[,min_balance,currency,locked]");
    return errors.report("error");
  }
  std::vector<Column> columns;
  if (!parse_header(lines[0], columns, errors)) return errors.report("error");

  // Pass 1: every row, every field, ids repeated within the file.
  std::vector<ShardRows> shards(ledger.shard_count());
  std::unordered_map<std::string_view, std::size_t> first_line;
  first_line.reserve(lines.size());
  for (std::size_t i = 1; i < lines.size(); ++i) {
    const std::size_t line_no = i + 1;
    Account a;
    std::string_view id_view;
    if (!parse_row(lines[i], line_no, columns, a, id_view, errors)) continue;
    const auto [seen, inserted] = first_line.emplace(id_view, line_no);
    if (!inserted) {
      errors.add(line_no, "account " + a.id + " repeats line " + std::to_string(seen->second));
      continue;
    }
    ShardRows& rows = shards[ledger.shard_index(a.id)];
    rows.accounts.push_back(std::move(a));
    rows.lines.push_back(line_no);
  }
  if (errors.any()) return errors.report("error(s) in the file");

  // Pass 2: nothing may exist yet, on any store.
  std::size_t total = 0;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    Store& store = ledger.shard(s);
    const ShardRows& rows = shards[s];
    total += rows.accounts.size();
    std::optional<Account> existing;
    for (std::size_t k = 0; k < rows.accounts.size(); ++k) {
      if (Status st = store.load_account(rows.accounts[k].id, existing); !st) {
        return fail(kExitFailed, st.message() + "; nothing was imported");
      }
      if (existing) {
        errors.add(rows.lines[k], "account " + rows.accounts[k].id + " already exists on " +
                                      describe_shard(ledger, s));
      }
    }
  }
  if (errors.any()) return errors.report("account(s) already exist");
  if (total == 0) {
    std::cout << "nothing to import: " << file << " has a header but no rows\n";
    return kExitOk;
  }

  // Pass 3: one all-or-nothing batch per store.
  std::size_t created = 0;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const ShardRows& rows = shards[s];
    if (rows.accounts.empty()) continue;
    if (Status st = ledger.shard(s).create_accounts(rows.accounts); !st) {
      if (created == 0) return fail(kExitFailed, st.message() + "; nothing was imported");
      std::string done;
      for (std::size_t d = 0; d < s; ++d) {
        if (shards[d].accounts.empty()) continue;
        done += (done.empty() ? "" : ", ") + describe_shard(ledger, d) + ": " +
                std::to_string(shards[d].accounts.size()) + " accounts";
      }
      return fail(kExitFailed,
                  "import stopped at " + describe_shard(ledger, s) + ": " + st.message() +
                      "; PARTIALLY IMPORTED: the rows of " + file + " placed on " + done +
                      " were created; the rows placed on " + describe_shard(ledger, s) +
                      " and later stores were not");
    }
    created += rows.accounts.size();
  }
  std::cout << "imported " << created << " accounts from " << file;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    std::cout << (s ? ", " : ": ") << shards[s].accounts.size() << " on " << describe_shard(ledger, s);
  }
  std::cout << '\n';
  return kExitOk;
}

}  // namespace sagapool::ctl
