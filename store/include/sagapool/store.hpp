#pragma once
// The store interface every backend implements (SQLite, PostgreSQL, memory).
//
// Contract (DESIGN.md, "States and stages" and "Stores"):
// - Every write is conditional and idempotent per record. A batch call groups
//   many such writes into one round trip / one transaction on this store;
//   results are reported per record, in input order, and a batch gives the
//   same result as applying its records one by one in that order.
// - Transfer writes are fenced by (owner, epoch). Leases are computed on the
//   store's clock (`now_ms`), never on the caller's.
// - Legs are made idempotent by the posting journal, and fenced against
//   zombies by leg voids: once a cancel has voided a leg, that leg can never
//   post (see LegOp).
// - A Store object is used by one thread at a time; open one per thread.
// - Errors are mapped onto ErrorKind inside the backend: busy / lost
//   connection -> retry_call or retry_stage; constraint violations that mean
//   "already applied" are success; anything else is fatal with a message.
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sagapool/domain.hpp"
#include "sagapool/request.hpp"
#include "sagapool/status.hpp"

namespace sagapool {

// The schema this build is written for. Versions change the schema in two
// steps (expand/contract, docs/design-additions.md "Schema versions"):
// `sagactl init` applies a version's expand step, which only adds what the
// programs of the previous version tolerate, and `sagactl migrate
// --contract` later removes what only they needed and raises the store's
// floor (Topology::schema_version) to this version.
// 2: accounts carry `reserved` and pending entries the amount they reserve
//    (applied in one step: a version-1 writer would break the credit rule).
// 3: the worker registry (expand); the contract drops saga_transition, the
//    call of schema 2's first builds (PostgreSQL).
// 4: SQLite chains each account's postings (expand: the columns); the
//    contract links the older ones and drops postings_account. Nothing
//    changes on PostgreSQL or MongoDB.
// 5: PostgreSQL drops the postings' and pending entries' foreign keys and
//    leaves room on the accounts' pages (expand only). Nothing changes on
//    SQLite or MongoDB.
// 6: PostgreSQL lists finished batches' unpublished transfers in an outbox
//    table (expand: the table; written once the floor is 6). Nothing
//    changes on SQLite or MongoDB.
// 7: SQLite does the same (expand: the table; written once the floor is 7).
//    Nothing changes on PostgreSQL or MongoDB.
// 8: PostgreSQL keeps the commit decisions of batches across stores
//    (expand: the table). Nothing changes on SQLite or MongoDB.
// 9: PostgreSQL finds an account's postings through its batches
//    (expand: the batch columns, links and index; contract: the older
//    postings' own index, and postings_account dropped). Nothing changes on
//    SQLite or MongoDB.
inline constexpr int kSchemaVersion = 9;

// Recorded in every store by `sagactl init` so that processes given the
// stores in another number or order refuse to start instead of misplacing
// money.
struct Topology {
  std::string ledger_id;  // shared by all shards of one ledger
  int shard_index = 0;
  int shard_count = 1;
  // The floor: every program running on the store must be built for at
  // least this version. Programs from before expand/contract require it to
  // equal their own version, so only `migrate --contract` raises it.
  int schema_version = 0;
  // The newest version whose expand step the store holds (>= schema_version).
  int schema_expanded = 0;
};

// A program may run on a store whose floor it knows and which holds its
// own version's additions.
inline bool schema_runs(const Topology& t, int program_version) noexcept {
  return t.schema_version <= program_version && t.schema_expanded >= program_version;
}

// ---- transfer documents (held by the first store) -------------------------

struct NewTransfer {
  RequestView request;  // views into the message bytes
  std::uint64_t payload_hash = 0;
  std::int64_t requested_at_ms = 0;
  std::string_view origin_topic;
  std::int32_t origin_partition = -1;
  std::int64_t origin_offset = -1;
};

enum class InsertResult : std::uint8_t { inserted, duplicate, conflict };

// Conditional state change: applies only if the record is in `from` and
// owned by (owner, epoch). Renews the lease; a terminal `to` also sets
// finished_at and notified = false. `reason` is written as given.
struct Transition {
  std::string_view id;
  TransferState from = TransferState::initial;
  TransferState to = TransferState::initial;
  Reason reason = Reason::none;
  std::string_view owner;
  std::int64_t epoch = 0;
};

// Per-state figures for monitoring, computed from indexed columns. For the
// non-terminal states: every transfer in it. For done and canceled: only
// those whose outcome is not yet published (the outbox; terminal totals come
// from the counters, as counting them here would scan the whole table).
struct StateStats {
  std::int64_t count = 0;
  std::int64_t oldest_ms = 0;  // the oldest's creation (finish, if terminal); 0 when count == 0
  std::int64_t stuck = 0;      // with an expired lease: waiting for recovery
};
using StateStatsTable = std::array<StateStats, kTransferStateCount>;

// A store's prepared transactions of one name prefix (TwoPhaseStore).
struct PreparedStats {
  std::int64_t count = 0;
  std::int64_t oldest_ms = 0;  // when the oldest was prepared (store's clock); 0 when count == 0
};

// ---- accounts and legs (every store holds the accounts that hash to it) ---

enum class LegOp : std::uint8_t {
  // Check account exists, unlocked, currency, funds/overflow; write the
  // posting, the balance and the pending entry together. If the journal
  // already holds the posting: already_posted. If the leg was voided: voided.
  // A debit also reserves its amount for its reversal (reserved += amount,
  // its pending entry records it; `overflow` if reserved would pass
  // INT64_MAX); a credit is refused with `overflow` unless
  // balance + reserved + amount <= INT64_MAX.
  debit,
  credit,
  // If the debit is posted: post reverse_debit once (reversed) and drop the
  // pending entry with what it reserved; otherwise void the debit so it can
  // never post (voided).
  cancel_debit,
  // If the credit is posted: credit_posted (the transfer must roll forward);
  // otherwise void the credit so it can never post (voided).
  cancel_credit,
  // Drop this transfer's pending entries on the account (released), and
  // with them what they reserved.
  release,
};

struct LegRequest {
  LegOp op = LegOp::debit;
  std::string_view transfer_id;
  std::string_view account_id;
  std::int64_t amount = 0;
  std::string_view currency;  // debit/credit: required currency, empty = any
};

enum class LegStatus : std::uint8_t {
  posted,
  already_posted,
  refused,  // a business rule failed; LegResult::reason says which
  voided,
  reversed,
  credit_posted,
  released,
};

struct LegResult {
  LegStatus status = LegStatus::refused;
  Reason reason = Reason::none;
  std::string account_currency;  // debit/credit: the account's currency ("" = any)
};

// The whole saga of a transfer inserted in the current scope (settle).
struct SettleRequest {
  std::string_view transfer_id;
  std::string_view source;
  std::string_view destination;
  std::int64_t amount = 0;
  std::string_view currency;  // the request's; empty = any
};

struct SettleResult {
  TransferState outcome = TransferState::canceled;  // done or canceled
  Reason reason = Reason::none;                     // canceled: the refused leg's rule
  std::string account_currency;  // the source account's when its debit posted ("" = any)
};

// ---- a batch across stores, in one transaction on each --------------------
// What a batch's whole sagas write on one store, walked by the engine over
// the accounts it locked there (SagaEngine::settle_across). Views into the
// engine's items and snapshot, valid for the call.
struct WalkPosting {
  std::string_view transfer_id;
  std::string_view account_id;
  PostingKind kind = PostingKind::debit;
  std::int64_t amount = 0;
};

struct WalkVoid {
  std::string_view transfer_id;
  std::string_view account_id;
  bool credit = false;  // the credit leg voided; else the debit
};

// An account as the walk read it, its balance as the walk leaves it (`to`),
// and what the walk's checks on it compared: as saga_settle_batch's lock
// pass (store/postgres/sql/functions.sql), the move stands where the row as
// locked gives every verdict the walk drew from it.
struct BalanceMove {
  std::string_view account_id;
  std::int64_t from = 0;  // the balance as read
  std::int64_t to = 0;
  std::int64_t reserved = 0;  // as read
  std::int64_t min_balance = 0;
  std::string_view currency;
  bool locked = false;
  // Per check the walk passed (none: not checked): the lowest balance a
  // debit left, the highest reservation a debit left, the highest
  // balance + reservation a credit left; and whether a leg was refused
  // for the balance (then the row must be exactly as read). Every posted
  // debit or credit passed its checks, so an account the walk posted to
  // has `low` or `sum_high`: PostgreSQL links its history by that.
  std::optional<std::int64_t> low;
  std::optional<std::int64_t> reserved_high;
  std::optional<std::int64_t> sum_high;
  bool refused = false;
};

// ---- admin and audit views -------------------------------------------------

struct PendingEntry {
  std::string account_id;
  std::string transfer_id;
};

// The store's methods, grouped by the role that calls them. A caller holds
// the narrowest role it needs; every backend implements all of them as one
// Store (below). Roles are not owned through, so their destructors are
// protected.

// The saga engine's batch stages (engine/): conditional transitions, legs,
// the planning read, and the transaction that can hold a whole batch.
class StageStore {
 public:
  // Groups the calls that follow into one transaction on this store, until
  // end_scope: one commit for all of a batch's stages instead of one per
  // stage. Every record write stays conditional and idempotent; the scope
  // only makes them atomic together. After any failed call inside a scope
  // the caller must end_scope(false), which undoes everything since
  // begin_scope. Only backends that say supports_scope() implement them.
  virtual bool supports_scope() const noexcept { return false; }
  // Scopes on several connections to the store commit side by side, row
  // locks keeping them apart (PostgreSQL), rather than one after another
  // behind a store-wide write lock (SQLite): what a worker's lanes need.
  virtual bool concurrent_scopes() const noexcept { return false; }
  virtual Status begin_scope() { return Status::fatal("this store has no transaction scopes"); }
  virtual Status end_scope(bool commit) {
    (void)commit;
    return Status::ok();
  }

  // `at_ms`, when given, receives the store's time of the write: the
  // finished_at of the terminal transitions applied, which outcomes report.
  virtual Status transition(std::span<const Transition> batch, std::int64_t lease_ms,
                            std::span<std::uint8_t> applied, std::int64_t* at_ms) = 0;
  Status transition(std::span<const Transition> batch, std::int64_t lease_ms,
                    std::span<std::uint8_t> applied) {
    return transition(batch, lease_ms, applied, nullptr);
  }
  virtual Status apply_legs(std::span<const LegRequest> batch, std::span<LegResult> results) = 0;
  // Runs whole sagas of transfers inserted in the current scope, in input
  // order, each to its end before the next begins: what these legs give one
  // transfer at a time. The debit; if posted, the credit (in the request's
  // currency, or else the debit's account's); if that posts too, both
  // released (done); if the credit is refused, cancel_credit and
  // cancel_debit (the debit reversed); if the debit is refused, both legs
  // voided. Nothing of it stays pending. Such a transfer has no postings or
  // voids yet, so a backend need not look for any; finding one is a fatal
  // error. Only backends that say supports_settle_sagas() implement it, and
  // only inside a scope.
  virtual bool supports_settle_sagas() const noexcept { return false; }
  virtual Status settle_sagas(std::span<const SettleRequest> batch, std::span<SettleResult> results) {
    (void)batch;
    (void)results;
    return Status::fatal("this store cannot settle transfers in one call");
  }
  // Inside a scope: writes a walk's postings and voids (at the store's
  // time) and moves each account's balance by `to - from` where its row,
  // locked then, still gives the walk's verdicts (BalanceMove). The moves
  // may be sent last, with the scope's PREPARE or COMMIT, so that the rows
  // are locked only from there. A move that does not stand fails the scope
  // (retry_stage): the batch runs again. Only backends that say
  // supports_prepare() implement it.
  virtual Status write_walk(std::span<const WalkPosting> postings, std::span<const WalkVoid> voids,
                            std::span<const BalanceMove> balances) {
    (void)postings;
    (void)voids;
    (void)balances;
    return Status::fatal("this store cannot write a walk across stores");
  }
  // As load_accounts, but inside a scope without locking them (what is
  // committed as the statement starts).
  virtual Status read_accounts(std::span<const std::string_view> ids,
                               std::span<std::optional<Account>> out) {
    return load_accounts(ids, out);
  }
  // Reads many accounts in one round trip (one consistent snapshot);
  // out[i] is nullopt when ids[i] does not exist. The engine plans a batch
  // from it; every leg still re-checks its conditions when it writes.
  virtual Status load_accounts(std::span<const std::string_view> ids,
                               std::span<std::optional<Account>> out) = 0;

 protected:
  ~StageStore() = default;
};

// The worker's ingest and outbox (workers/): new transfers in, finished
// transfers' outcomes marked as published.
class IngestStore {
 public:
  virtual Status insert_transfers(std::span<const NewTransfer> batch, std::string_view owner,
                                  std::int64_t lease_ms, std::span<InsertResult> results) = 0;
  virtual Status mark_notified(std::span<const std::string_view> ids) = 0;

 protected:
  ~IngestStore() = default;
};

// Taking over transfers: the worker's recovery pass and operator commands.
class RecoveryStore {
 public:
  // Claims up to `limit` transfers whose lease expired on the store's clock
  // and that are non-terminal or terminal with notified = false: owner :=
  // `owner`, epoch += 1, attempts += 1, a new lease. Returns the claimed docs.
  virtual Status claim_expired(std::string_view owner, std::int64_t lease_ms, std::size_t limit,
                               std::vector<TransferDoc>& out) = 0;
  // Claims one unfinished transfer regardless of its lease (operator
  // commands). A finished one is returned as it is, owner included (who
  // finished it), and left alone.
  virtual Status take_over(std::string_view id, std::string_view owner, std::int64_t lease_ms,
                           std::optional<TransferDoc>& out) = 0;

 protected:
  ~RecoveryStore() = default;
};

// What operators and monitoring read and set (sagactl, the store collector).
class OperatorStore {
 public:
  virtual Status load_transfer(std::string_view id, std::optional<TransferDoc>& out) = 0;
  // Non-terminal transfers last modified before `before_ms`, oldest first.
  virtual Status list_stale(std::int64_t before_ms, std::size_t limit,
                            std::vector<TransferDoc>& out) = 0;
  virtual Status state_stats(StateStatsTable& out) = 0;
  // Inserts all accounts or none; an existing id is a fatal error naming it.
  virtual Status create_accounts(std::span<const Account> accounts) = 0;
  virtual Status load_account(std::string_view id, std::optional<Account>& out) = 0;
  virtual Status set_locked(std::string_view id, bool locked, bool& found) = 0;
  virtual Status postings_for_transfer(std::string_view transfer_id, std::vector<Posting>& out) = 0;
  virtual Status postings_for_account(std::string_view account_id, std::size_t limit,
                                      std::vector<Posting>& out) = 0;
  virtual Status pending_for_account(std::string_view account_id,
                                     std::vector<std::string>& transfer_ids) = 0;

 protected:
  ~OperatorStore() = default;
};

// One transaction across stores: two-phase commit (docs/design-additions.md,
// "A batch across stores"). The first store's scope records the decision
// and its COMMIT is the commit point; every other store's scope is first
// prepared under the batch's name (gid), then finished. A prepared
// transaction left by a crash is finished by whoever finds it, as the
// first store's decision says; a decision not committed is recorded as an
// abort first, so it never can be.
class TwoPhaseStore {
 public:
  // Whether this store can prepare a scope (PostgreSQL with
  // max_prepared_transactions > 0) and write walks (write_walk).
  virtual bool supports_prepare() const noexcept { return false; }
  // Ends the open scope as a prepared transaction named `gid`: durable,
  // its locks held, until finish_prepared. On failure it is rolled back.
  virtual Status prepare_scope(std::string_view gid) {
    (void)gid;
    return Status::fatal("this store cannot prepare a transaction");
  }
  // Outside a scope: commits or rolls back the prepared transaction `gid`.
  // One no longer there (finished already) is success.
  virtual Status finish_prepared(std::string_view gid, bool commit) {
    (void)gid;
    (void)commit;
    return Status::fatal("this store cannot prepare a transaction");
  }
  // The names of this store's prepared transactions that start with
  // `prefix` and were prepared at least `min_age_ms` ago (store's clock).
  virtual Status list_prepared(std::string_view prefix, std::int64_t min_age_ms,
                               std::vector<std::string>& gids) {
    (void)prefix;
    (void)min_age_ms;
    gids.clear();
    return Status::ok();
  }
  // For monitoring: how many prepared transactions start with `prefix`,
  // and when the oldest was prepared. Reads no rows, so it never waits
  // on the locks a prepared batch holds.
  virtual Status prepared_stats(std::string_view prefix, PreparedStats& out) {
    (void)prefix;
    out = {};
    return Status::ok();
  }

  // The first store. Inside a scope: this scope's commit commits `gid`.
  virtual Status record_decision(std::string_view gid) {
    (void)gid;
    return Status::fatal("this store keeps no commit decisions");
  }
  // Outside a scope: whether `gid` committed. If no commit of it is
  // recorded, records its abort, so it never can be; a scope still open
  // that recorded it is waited for (a lock wait: retry_call when it times
  // out).
  virtual Status decide(std::string_view gid, bool& committed) {
    (void)gid;
    committed = false;
    return Status::fatal("this store keeps no commit decisions");
  }
  // Decisions recorded at least `min_age_ms` ago (store's clock), oldest first.
  virtual Status list_decisions(std::int64_t min_age_ms, std::size_t limit, std::vector<std::string>& gids) {
    (void)min_age_ms;
    (void)limit;
    gids.clear();
    return Status::ok();
  }
  // Drops decisions no prepared transaction needs any more. Inside a scope
  // it rides with the scope's next statement.
  virtual Status forget_decisions(std::span<const std::string> gids) {
    (void)gids;
    return Status::ok();
  }

 protected:
  ~TwoPhaseStore() = default;
};

// ---- the worker registry (held by the first store) ------------------------

// What a running worker records about itself, refreshed every heartbeat on
// the store's clock. A worker whose heartbeat is older than
// kWorkerGoneLeases of its leases is gone (killed without deregistering).
struct WorkerRecord {
  std::string worker_id;
  std::string build_version;
  std::string git_revision;
  int schema_version = 0;  // kSchemaVersion of its build
  std::int64_t lease_ms = 0;
  std::int64_t heartbeat_ms = 0;  // set by the store
};
inline constexpr std::int64_t kWorkerGoneLeases = 3;
inline bool worker_live(const WorkerRecord& w, std::int64_t store_now_ms) {
  return store_now_ms - w.heartbeat_ms <= kWorkerGoneLeases * w.lease_ms;
}

// Workers announce themselves; `sagactl migrate --contract` reads who is
// live before it removes what older builds need.
class RegistryStore {
 public:
  // Inserts or refreshes the worker's row; heartbeat_ms := the store's now.
  virtual Status register_worker(const WorkerRecord& w) = 0;
  virtual Status deregister_worker(std::string_view worker_id) = 0;
  virtual Status list_workers(std::vector<WorkerRecord>& out) = 0;
  // The distinct owners of transfers whose lease ends at or after
  // `since_ms` and, on PostgreSQL, of recovery passes run since then
  // (saga_owners_seen): how builds from before the registry are seen.
  virtual Status recent_owners(std::int64_t since_ms, std::vector<std::string>& out) = 0;

 protected:
  ~RegistryStore() = default;
};

// Whole-table reads for the audit (engine/audit.cpp). A callback must not
// call the store.
class AuditStore {
 public:
  virtual Status scan_transfer_states(
      const std::function<void(std::string_view id, TransferState s, bool notified)>& fn) = 0;
  virtual Status scan_accounts(const std::function<void(const Account&)>& fn) = 0;
  virtual Status scan_postings(const std::function<void(const Posting&)>& fn) = 0;
  virtual Status scan_pending(const std::function<void(const PendingEntry&)>& fn) = 0;

 protected:
  ~AuditStore() = default;
};

// One store of a ledger: every role, plus its schema, topology and clock.
class Store : public StageStore,
              public IngestStore,
              public RecoveryStore,
              public OperatorStore,
              public AuditStore,
              public RegistryStore,
              public TwoPhaseStore {
 public:
  virtual ~Store() = default;
  Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // The URL with any password removed, for messages and logs.
  virtual const std::string& display_name() const noexcept = 0;

  // Schema and topology.
  // Create, or apply every expand step up to kSchemaVersion; idempotent.
  // A store made here from nothing is contracted too (no older program can
  // be running on it).
  virtual Status init_schema() = 0;
  // Apply the contract steps up to kSchemaVersion and raise the floor to
  // it. Checking that no older program still runs is the caller's job
  // (Ledger::contract).
  virtual Status contract_schema() = 0;
  virtual Status read_topology(std::optional<Topology>& out) = 0;  // nullopt: not initialised
  virtual Status write_topology(const Topology& t) = 0;
  virtual Status now_ms(std::int64_t& out) = 0;  // the store's clock

  // One account at a time; backends read them in one round trip instead.
  Status load_accounts(std::span<const std::string_view> ids,
                       std::span<std::optional<Account>> out) override {
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (Status s = load_account(ids[i], out[i]); !s) return s;
    }
    return Status::ok();
  }
};

// Opens `url`: `sqlite:PATH` or a PostgreSQL URI / conninfo. Does not create
// the schema (that is `sagactl init`).
Status open_store(std::string_view url, std::unique_ptr<Store>& out);

}  // namespace sagapool
