// The pure part of `sagactl accounts import` (see import_parse.hpp): moved
// here unchanged from import.cpp so that a fuzz target can call it.
#include "import_parse.hpp"

#include <array>
#include <optional>
#include <unordered_map>

#include "commands.hpp"
#include "sagapool/request.hpp"

namespace sagapool::ctl {
namespace {

enum class Column : std::uint8_t { id, balance, min_balance, currency, locked };
constexpr std::array<std::string_view, 5> kColumnNames = {"id", "balance", "min_balance",
                                                          "currency", "locked"};

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

bool parse_header(std::string_view line, std::vector<Column>& columns, ImportErrors& errors) {
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
               Account& a, std::string_view& id_view, ImportErrors& errors) {
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

}  // namespace

void parse_accounts_csv(std::string_view text, ParsedImport& out, ImportErrors& errors) {
  out.accounts.clear();
  out.lines.clear();
  out.what = "error";
  std::string_view body = text;
  if (body.starts_with("\xEF\xBB\xBF")) body.remove_prefix(3);  // a UTF-8 byte order mark
  const std::vector<std::string_view> lines = split_lines(body);
  if (lines.empty()) {
    errors.add(1, "empty file: expected a header line id,balance[,min_balance,currency,locked]");
    return;
  }
  std::vector<Column> columns;
  if (!parse_header(lines[0], columns, errors)) return;

  // Every row, every field, ids repeated within the file.
  out.what = "error(s) in the file";
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
    out.accounts.push_back(std::move(a));
    out.lines.push_back(line_no);
  }
}

}  // namespace sagapool::ctl
