#include "store_reader.hpp"

#include <sqlite3.h>

#include <sstream>

#include "pg_server.hpp"

namespace sagapool::chaos {
namespace {

constexpr const char* kTerminal = "('done','canceled')";
// A posting's signed amount; `p` names the postings table (transfers also
// has an `amount` column).
std::string signed_amount(const std::string& p) {
  return "CASE " + p + ".kind WHEN 'debit' THEN -" + p + ".amount ELSE " + p + ".amount END";
}

struct SqliteCloser {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
struct StatementFinalizer {
  void operator()(sqlite3_stmt* st) const { sqlite3_finalize(st); }
};
using SqlitePtr = std::unique_ptr<sqlite3, SqliteCloser>;
using StatementPtr = std::unique_ptr<sqlite3_stmt, StatementFinalizer>;

class SqliteReader final : public StoreReader {
 public:
  explicit SqliteReader(const std::string& path) : StoreReader("") {
    sqlite3* db = nullptr;
    const int rc = sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
    db_.reset(db);
    if (rc != SQLITE_OK) throw std::runtime_error("cannot open " + path + " for reading");
    sqlite3_busy_timeout(db_.get(), 2000);
  }

  // store/sqlite/sql/schema.sql, the outbox
  std::string listed_unpublished() const override {
    return "(SELECT coalesce(sum(json_array_length(done) + json_array_length(canceled)), 0) FROM outbox)";
  }

  std::optional<std::vector<std::vector<std::string>>> query(const std::string& sql) override {
    sqlite3_stmt* raw = nullptr;
    if (sqlite3_prepare_v2(db_.get(), sql.c_str(), -1, &raw, nullptr) != SQLITE_OK) {
      return std::nullopt;
    }
    const StatementPtr st(raw);
    std::vector<std::vector<std::string>> rows;
    for (;;) {
      const int rc = sqlite3_step(st.get());
      if (rc == SQLITE_DONE) return rows;
      if (rc != SQLITE_ROW) return std::nullopt;
      auto& row = rows.emplace_back();
      for (int c = 0; c < sqlite3_column_count(st.get()); ++c) {
        const unsigned char* text = sqlite3_column_text(st.get(), c);
        row.emplace_back(text == nullptr ? "" : reinterpret_cast<const char*>(text));
      }
    }
  }

 private:
  SqlitePtr db_;
};

// Through psql on the server's unix socket: its connections are not the
// workers' (application_name `psql`), so killing those spares these.
class PostgresqlReader final : public StoreReader {
 public:
  PostgresqlReader(const test::PgServer& server, std::string database)
      : StoreReader("saga_"), server_(server), database_(std::move(database)) {}

  std::optional<std::vector<std::vector<std::string>>> query(const std::string& sql) override {
    const test::RunResult r = server_.psql(database_, sql);
    if (r.exit_code != 0) return std::nullopt;
    std::vector<std::vector<std::string>> rows;
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);) {
      if (line.empty()) continue;
      auto& row = rows.emplace_back();
      std::istringstream fields(line);
      for (std::string field; std::getline(fields, field, '|');) row.push_back(field);
    }
    return rows;
  }

  // store/postgres/sql/migrations/0006_outbox.sql
  std::string listed_unpublished() const override {
    return "(SELECT coalesce(sum(cardinality(done) + cardinality(canceled)), 0) FROM saga_outbox)";
  }

 private:
  const test::PgServer& server_;
  std::string database_;
};

std::int64_t to_int(const std::string& s) { return s.empty() ? 0 : std::stoll(s); }

}  // namespace

std::string LedgerSnapshot::describe() const {
  return std::to_string(accounts) + " accounts: balances - opening = " + balance_minus_opening +
         ", in-flight legs = " + in_flight_net + " (" + std::to_string(in_flight) +
         " transfers in flight); below minimum " + std::to_string(below_minimum) +
         ", off their journal " + std::to_string(off_journal) +
         ", terminal transfers not netting to 0 " + std::to_string(terminal_unbalanced);
}

std::optional<LedgerSnapshot> StoreReader::snapshot() {
  const std::string accounts = table("accounts");
  const std::string postings = table("postings");
  const std::string transfers = table("transfers");
  const std::string postings_of_transfers = " FROM " + postings + " p JOIN " + transfers +
                                            " t ON t.id = p.transfer_id WHERE t.state ";
  const std::string sql =
      "SELECT (SELECT count(*) FROM " + accounts + "), " +
      "(SELECT coalesce(sum(balance), 0) - coalesce(sum(opening_balance), 0) FROM " + accounts +
      "), (SELECT coalesce(sum(" + signed_amount("p") + "), 0)" + postings_of_transfers + "NOT IN " +
      kTerminal + "), (SELECT count(*) FROM " + accounts + " WHERE balance < min_balance), " +
      "(SELECT count(*) FROM " + accounts + " a WHERE a.balance <> a.opening_balance + " +
      "(SELECT coalesce(sum(" + signed_amount("q") + "), 0) FROM " + postings +
      " q WHERE q.account_id = a.id)), " + "(SELECT count(*) FROM (SELECT p.transfer_id" +
      postings_of_transfers + "IN " + kTerminal + " GROUP BY p.transfer_id HAVING sum(" +
      signed_amount("p") + ") <> 0) x), " + "(SELECT count(*) FROM " + transfers + " WHERE state NOT IN " +
      kTerminal + ")";
  const auto rows = query(sql);
  if (!rows || rows->size() != 1 || rows->front().size() != 7) return std::nullopt;
  const auto& f = rows->front();
  LedgerSnapshot s;
  s.accounts = to_int(f[0]);
  s.balance_minus_opening = f[1];
  s.in_flight_net = f[2];
  s.below_minimum = to_int(f[3]);
  s.off_journal = to_int(f[4]);
  s.terminal_unbalanced = to_int(f[5]);
  s.in_flight = to_int(f[6]);
  return s;
}

std::optional<TransferCounts> StoreReader::transfer_counts() {
  const auto rows =
      query("SELECT count(*), coalesce(sum(CASE WHEN state IN " + std::string(kTerminal) +
            " AND notified THEN 1 ELSE 0 END), 0) - " + listed_unpublished() + " FROM " +
            table("transfers"));
  if (!rows || rows->size() != 1 || rows->front().size() != 2) return std::nullopt;
  return TransferCounts{to_int(rows->front()[0]), to_int(rows->front()[1])};
}

std::optional<std::set<std::string>> StoreReader::transfer_ids() {
  const auto rows = query("SELECT id FROM " + table("transfers"));
  if (!rows) return std::nullopt;
  std::set<std::string> out;
  for (const auto& row : *rows) out.insert(row.at(0));
  return out;
}

std::optional<std::map<std::string, std::int64_t>> StoreReader::balances() {
  const auto rows = query("SELECT id, balance FROM " + table("accounts"));
  if (!rows) return std::nullopt;
  std::map<std::string, std::int64_t> out;
  for (const auto& row : *rows) {
    if (row.size() != 2) return std::nullopt;
    out[row[0]] = to_int(row[1]);
  }
  return out;
}

std::unique_ptr<StoreReader> sqlite_reader(const std::string& path) {
  return std::make_unique<SqliteReader>(path);
}

std::unique_ptr<StoreReader> postgresql_reader(const test::PgServer& server, std::string database) {
  return std::make_unique<PostgresqlReader>(server, std::move(database));
}

}  // namespace sagapool::chaos
