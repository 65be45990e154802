#pragma once
// An in-memory Store with the exact semantics of store.hpp (it passes the
// store conformance suite as a third backend), for the deterministic
// simulation of the saga engine.
//
// - The store's clock is a StoreClock the test controls: leases are compared
//   against it, never against the host's clock (ManualClock in the
//   simulation, WallClock for the conformance suite).
// - A MemoryDb is the shared database; `connect` opens one connection to it
//   (Store objects, one per simulated worker, like one SQLite connection per
//   process). Connections may be used from several threads: every call holds
//   the database's mutex.
// - Every call is atomic: a failed batch leaves nothing behind (an undo log
//   rolls it back), like one SQLite transaction per call.
// - Scopes (begin_scope/end_scope) are supported when MemoryOptions::scopes is
//   set, with real rollback, and behave like SQLite's BEGIN IMMEDIATE: while
//   one connection holds a scope, every call of another connection fails with
//   retry_call ("database is locked"). Without `scopes` the store behaves like
//   the PostgreSQL backend (supports_scope() is false).
// - Destroying a connection that holds a scope rolls it back, as a process
//   that dies mid-transaction does. A prepared scope outlives it, holding the
//   database's lock until some connection finishes it.
// - The database also records, for the simulation's checks, every transition
//   it applied that moves a transfer backwards (its new state is not ahead of
//   the old on the saga's graph), even inside a scope later rolled back.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "sagapool/store.hpp"

namespace sagapool::sim {

class StoreClock {
 public:
  virtual ~StoreClock() = default;
  virtual std::int64_t now_ms() = 0;
};

// The host's clock, milliseconds since the Unix epoch.
class WallClock final : public StoreClock {
 public:
  std::int64_t now_ms() override;
};

// A clock that moves only when told to.
class ManualClock final : public StoreClock {
 public:
  explicit ManualClock(std::int64_t start_ms) : now_(start_ms) {}
  std::int64_t now_ms() override { return now_; }
  void advance(std::int64_t ms) { now_ += ms; }

 private:
  std::int64_t now_;
};

struct MemoryOptions {
  std::string name = "memory";
  bool scopes = true;       // supports_scope() and real rollback
  // supports_prepare() (with scopes): a scope can end prepared, holding the
  // database's lock until finish_prepared, as PostgreSQL's PREPARE
  // TRANSACTION holds its row locks; the first store keeps decisions.
  bool prepare = false;
  bool initialised = true;  // false: like a new, empty file before `init_schema`
};

// One leg of one transfer on one account: the key of postings and voids.
struct LegKey {
  std::string transfer_id;
  std::string account_id;
  PostingKind kind = PostingKind::debit;
  friend bool operator<(const LegKey& a, const LegKey& b) {
    return std::tie(a.transfer_id, a.account_id, a.kind) <
           std::tie(b.transfer_id, b.account_id, b.kind);
  }
};

class MemoryStore;

class MemoryDb {
 public:
  MemoryDb(std::shared_ptr<StoreClock> clock, MemoryOptions options)
      : clock_(std::move(clock)), options_(std::move(options)), initialised_(options_.initialised) {}

  // Transitions the store applied that moved a transfer backwards, one line
  // each ("id: from -> to by owner@epoch").
  std::vector<std::string> illegal_transitions() const {
    std::lock_guard lock(mu_);
    return illegal_;
  }
  // Transitions applied and not rolled back.
  std::int64_t transitions_applied() const {
    std::lock_guard lock(mu_);
    return transitions_;
  }
  bool scope_open() const {
    std::lock_guard lock(mu_);
    return scope_owner_ != nullptr;
  }
  bool prepared() const {
    std::lock_guard lock(mu_);
    return prepared_gid_.has_value();
  }

 private:
  friend class MemoryStore;
  struct PostingRow {
    Posting posting;
    std::uint64_t seq = 0;  // insertion order, to order equal timestamps
  };

  mutable std::mutex mu_;
  std::shared_ptr<StoreClock> clock_;
  MemoryOptions options_;
  bool initialised_ = false;
  int schema_version_ = 0;   // the floor (Topology::schema_version)
  int schema_expanded_ = 0;
  std::optional<Topology> topology_;  // ledger_id, shard_index, shard_count
  std::map<std::string, WorkerRecord, std::less<>> workers_;
  std::map<std::string, TransferDoc, std::less<>> transfers_;
  std::map<std::string, Account, std::less<>> accounts_;
  std::map<LegKey, PostingRow> postings_;
  std::uint64_t posting_seq_ = 0;
  std::set<LegKey> voids_;  // kind: debit or credit
  // (account, transfer) -> what the entry reserves on the account (a
  // debit's amount; 0 for a credit).
  std::map<std::pair<std::string, std::string>, std::int64_t, std::less<>> pending_;
  const MemoryStore* scope_owner_ = nullptr;
  std::vector<std::function<void()>> scope_undo_;
  // A prepared scope (MemoryOptions::prepare): its name, time and undo log.
  std::optional<std::string> prepared_gid_;
  std::int64_t prepared_at_ms_ = 0;
  std::vector<std::function<void()>> prepared_undo_;
  struct Decision {
    bool committed = false;
    std::int64_t at_ms = 0;
  };
  std::map<std::string, Decision, std::less<>> decisions_;
  std::vector<std::string> illegal_;
  std::int64_t transitions_ = 0;
};

std::shared_ptr<MemoryDb> make_memory_db(std::shared_ptr<StoreClock> clock, MemoryOptions options = {});

// Opens a new connection to `db`.
std::unique_ptr<Store> connect(const std::shared_ptr<MemoryDb>& db);

}  // namespace sagapool::sim
