#pragma once
// Reads the ledger under the running pool, below the store interface: each
// read is ONE SQL statement, so it sees one snapshot on both backends (a
// SQLite read transaction in WAL mode; a PostgreSQL statement's snapshot).
// `sagactl audit` scans transfers, postings and accounts in separate
// statements, so it is exact only at a quiet point; mid-run we use this.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace sagapool::test {
class PgServer;
}

namespace sagapool::chaos {

// Invariants 1-4 of DESIGN.md as one snapshot shows them while transfers
// are in flight.
struct LedgerSnapshot {
  std::int64_t accounts = 0;
  std::string balance_minus_opening;  // sum(balance) - sum(opening_balance)
  std::string in_flight_net;          // signed postings of non-terminal transfers
  std::int64_t below_minimum = 0;     // accounts with balance < min_balance
  std::int64_t off_journal = 0;       // accounts with balance != opening + postings
  std::int64_t terminal_unbalanced = 0;  // done/canceled transfers whose postings do not net to 0
  std::int64_t in_flight = 0;            // non-terminal transfers
  bool conserved() const {
    return balance_minus_opening == in_flight_net && below_minimum == 0 && off_journal == 0 &&
           terminal_unbalanced == 0;
  }
  std::string describe() const;
};

struct TransferCounts {
  std::int64_t transfers = 0;
  std::int64_t finished = 0;  // terminal and outcome published
};

class StoreReader {
 public:
  virtual ~StoreReader() = default;
  // Rows of text fields; nullopt when the store could not answer (busy,
  // restarting): the caller tries again later.
  virtual std::optional<std::vector<std::vector<std::string>>> query(const std::string& sql) = 0;

  std::optional<LedgerSnapshot> snapshot();
  std::optional<TransferCounts> transfer_counts();
  std::optional<std::set<std::string>> transfer_ids();
  std::optional<std::map<std::string, std::int64_t>> balances();

 protected:
  // Table names: `accounts` on SQLite, `saga_accounts` on PostgreSQL.
  explicit StoreReader(std::string table_prefix) : prefix_(std::move(table_prefix)) {}
  std::string table(const char* name) const { return prefix_ + name; }
  // An expression: finished transfers whose row says published but that are
  // still listed as unpublished elsewhere (the stores' outbox).
  virtual std::string listed_unpublished() const { return "0"; }

 private:
  std::string prefix_;
};

std::unique_ptr<StoreReader> sqlite_reader(const std::string& path);
std::unique_ptr<StoreReader> postgresql_reader(const test::PgServer& server, std::string database);

}  // namespace sagapool::chaos
