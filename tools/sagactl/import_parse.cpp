// The pure part of `sagactl accounts import` (see import_parse.hpp), apart
// from import.cpp so that a fuzz target can call it.
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

std::optional<Column> parse_column(std::string_view name) {
  for (std::size_t i = 0; i < kColumnNames.size(); ++i) {
    if (kColumnNames[i] == name) return static_cast<Column>(i);
  }
  return std::nullopt;
}

// One CSV record (RFC 4180): its fields unquoted, and the line it starts on.
struct Record {
  std::vector<std::string> fields;
  std::size_t line = 0;
  bool blank = false;  // an empty line: one empty field, unquoted
};

// Splits `text` into records: fields separated by commas, records by LF or
// CRLF; a field in double quotes may hold commas, line breaks and "" for a
// quote. Empty lines at the end are dropped. On a quoting error, adds it and
// returns false.
bool read_records(std::string_view text, std::vector<Record>& out, ImportErrors& errors) {
  std::size_t i = 0;
  std::size_t line = 1;
  const std::size_t n = text.size();
  while (i < n) {
    Record& r = out.emplace_back();
    r.line = line;
    bool quoted_any = false;
    for (;;) {  // one field
      std::string& f = r.fields.emplace_back();
      if (i < n && text[i] == '"') {
        quoted_any = true;
        const std::size_t opened = line;
        ++i;
        for (;;) {
          if (i >= n) {
            errors.add(opened, "column " + std::to_string(r.fields.size()) + ": a quoted field is never closed");
            return false;
          }
          const char c = text[i++];
          if (c == '"') {
            if (i < n && text[i] == '"') {
              f += '"';
              ++i;
              continue;
            }
            break;
          }
          if (c == '\n') ++line;
          f += c;
        }
        if (i < n && text[i] != ',' && text[i] != '\n' && !(text[i] == '\r' && i + 1 < n && text[i + 1] == '\n')) {
          errors.add(line, "column " + std::to_string(r.fields.size()) +
                               ": only a comma or the end of the line may follow a closing quote");
          return false;
        }
      } else {
        const std::size_t stop = text.find_first_of(",\n", i);
        std::string_view raw = text.substr(i, stop == std::string_view::npos ? n - i : stop - i);
        i += raw.size();
        if (i < n && text[i] == '\n' && !raw.empty() && raw.back() == '\r') raw.remove_suffix(1);
        if (raw.find('"') != std::string_view::npos) {
          errors.add(line, "column " + std::to_string(r.fields.size()) +
                               ": a quote inside an unquoted field (quote the whole field, doubling its quotes)");
          return false;
        }
        f.assign(raw);
      }
      if (i < n && text[i] == '\r') ++i;  // the CR of a CRLF after a quoted field
      if (i < n && text[i] == ',') {
        ++i;
        continue;
      }
      break;
    }
    r.blank = !quoted_any && r.fields.size() == 1 && r.fields[0].empty();
    if (i < n) {  // the LF ending the record
      ++i;
      ++line;
    }
  }
  while (!out.empty() && out.back().blank) out.pop_back();
  return true;
}

std::string column_of(std::size_t index, std::string_view name) {
  return "column " + std::to_string(index + 1) + " (" + std::string(name) + "): ";
}

bool parse_header(const Record& header, std::vector<Column>& columns, ImportErrors& errors) {
  std::array<bool, kColumnNames.size()> seen{};
  for (const std::string& name : header.fields) {
    const std::optional<Column> c = parse_column(name);
    if (!c) {
      errors.add(header.line, "unknown column '" + name +
                        "' in the header (expected id,balance and optionally min_balance, "
                        "currency, locked)");
      return false;
    }
    if (seen[static_cast<std::size_t>(*c)]) {
      errors.add(header.line, "column '" + name + "' appears twice in the header");
      return false;
    }
    seen[static_cast<std::size_t>(*c)] = true;
    columns.push_back(*c);
  }
  for (Column required : {Column::id, Column::balance}) {
    if (!seen[static_cast<std::size_t>(required)]) {
      errors.add(header.line, "the header has no '" + std::string(kColumnNames[static_cast<std::size_t>(required)]) +
                        "' column (expected id,balance and optionally min_balance, currency, locked)");
      return false;
    }
  }
  return true;
}

// Parses one data row into `a`; on error adds it and returns false.
bool parse_row(const Record& row, const std::vector<Column>& columns, Account& a, ImportErrors& errors) {
  const std::size_t line_no = row.line;
  if (row.blank) {
    errors.add(line_no, "empty line");
    return false;
  }
  const std::vector<std::string>& fields = row.fields;
  if (fields.size() != columns.size()) {
    errors.add(line_no, std::to_string(fields.size()) + " fields, but the header has " +
                            std::to_string(columns.size()));
    return false;
  }
  for (std::size_t i = 0; i < fields.size(); ++i) {
    const std::string_view f = fields[i];
    auto quoted = [f] { return "'" + std::string(f) + "'"; };
    const std::string at = column_of(i, kColumnNames[static_cast<std::size_t>(columns[i])]);
    switch (columns[i]) {
      case Column::id:
        if (!is_valid_identifier(f, kMaxAccountIdLength)) {
          errors.add(line_no, at + "bad account id " + quoted() + ": expected 1.." +
                                  std::to_string(kMaxAccountIdLength) + " chars of [A-Za-z0-9._:-]");
          return false;
        }
        a.id.assign(f);
        break;
      case Column::balance:
        if (!parse_int64(f, a.balance)) {
          errors.add(line_no, at + "bad balance " + quoted() + ": expected an integer of minor units");
          return false;
        }
        break;
      case Column::min_balance:
        if (!f.empty() && !parse_int64(f, a.min_balance)) {
          errors.add(line_no, at + "bad min_balance " + quoted() + ": expected an integer of minor units");
          return false;
        }
        break;
      case Column::currency:
        if (!is_valid_currency(f)) {
          errors.add(line_no, at + "bad currency " + quoted() + ": expected 3 upper-case letters or nothing");
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
          errors.add(line_no, at + "bad locked " + quoted() + ": expected true, false, 1, 0 or nothing");
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
  std::vector<Record> records;
  if (!read_records(body, records, errors)) return;
  if (records.empty()) {
    errors.add(1, "empty file: expected a header line id,balance[,min_balance,currency,locked]");
    return;
  }
  std::vector<Column> columns;
  if (!parse_header(records[0], columns, errors)) return;

  // Every row, every field, ids repeated within the file.
  out.what = "error(s) in the file";
  std::unordered_map<std::string, std::size_t> first_line;
  first_line.reserve(records.size());
  for (std::size_t i = 1; i < records.size(); ++i) {
    const std::size_t line_no = records[i].line;
    Account a;
    if (!parse_row(records[i], columns, a, errors)) continue;
    const auto [seen, inserted] = first_line.emplace(a.id, line_no);
    if (!inserted) {
      errors.add(line_no, "account " + a.id + " repeats line " + std::to_string(seen->second));
      continue;
    }
    out.accounts.push_back(std::move(a));
    out.lines.push_back(line_no);
  }
}

}  // namespace sagapool::ctl
