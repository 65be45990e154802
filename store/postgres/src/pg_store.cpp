// PostgreSQL backend of the store interface: production, one or many shards.
//
// One connection per Store (a Store is single-threaded by contract), lost
// connections re-established on the next call with capped exponential
// backoff. Every batch call is one prepared statement, so one round trip: the
// batch travels as arrays and a PL/pgSQL function (pg_schema.cpp) applies its
// records in input order, a few set-based statements per batch, and returns
// one row per record. Outside a scope each call is its own transaction;
// inside one (begin_scope .. end_scope) every call runs in the scope's
// transaction, and one COMMIT makes the whole batch durable. The store's
// clock is the server's (clock_timestamp()).
#include "sagapool/pg_store.hpp"

#include <libpq-fe.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <bitset>
#include <chrono>
#include <limits>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>

#include "pg_schema.hpp"
#include "pg_support.hpp"

namespace sagapool {
namespace {

using pg::ArrayLiteral;
using pg::Params;
using pg::ResultPtr;
using pg::Sql;
using Clock = std::chrono::steady_clock;

// Reconnect backoff: the first attempt after a loss is immediate, then 50 ms
// doubling up to 5 s between attempts while the server stays unreachable.
constexpr std::chrono::milliseconds kBackoffFirst{50};
constexpr std::chrono::milliseconds kBackoffMax{5000};
// How long opening a store waits for an unreachable server unless the URL
// sets connect_timeout (the per-attempt default connect() gives libpq too).
constexpr std::chrono::seconds kOpenWaitDefault{10};
// Bounds on waits (docs/postgres.md, "Timeouts"). A batch transaction holds
// its accounts' row locks from the planning read to COMMIT, so a worker
// frozen inside one (SIGSTOP, a frozen VM, a blocked log write) would stop
// every batch on those accounts for as long as it stays frozen: the server
// ends a session idle inside a batch transaction after kBatchIdleTimeout
// (the frozen worker's batch is rolled back and runs again when it wakes),
// and a statement of one after kBatchStatementTimeout. Any lock wait ends
// after kLockTimeout unless the server's configuration sets another bound;
// each is an error the caller retries. kLockTimeout > kBatchIdleTimeout:
// a batch waiting on a frozen one outlasts it instead of failing first.
constexpr std::string_view kLockTimeout = "10s";
constexpr std::string_view kBatchIdleTimeout = "5s";
constexpr std::string_view kBatchStatementTimeout = "60s";
// From this floor on, finished batches are listed in saga_outbox
// (migrations/0006_outbox.sql); how often a store below it looks again.
constexpr std::int64_t kOutboxFloor = 6;
constexpr std::chrono::seconds kFloorRecheck{10};
// Schema migrations (PgStore::migrate).
constexpr std::string_view kMigrationLockTimeout = "2s";
constexpr std::chrono::seconds kMigrationPatience{120};

// The most records one statement carries: bounds its size (at most ~45 MiB
// of parameters with 4 KiB of metadata per transfer). A call with more runs
// as several statements in one transaction (in_chunks): the worker hands a
// store whatever a backlog gives it (outcome flags after a broker stall,
// two releases per transfer), and that must never be an error.
constexpr std::size_t kStatementMax = 10'000;

std::int64_t clamp_limit(std::size_t limit) {
  return static_cast<std::int64_t>(std::min<std::size_t>(
      limit, static_cast<std::size_t>(std::numeric_limits<std::int64_t>::max())));
}

std::optional<LegStatus> parse_leg_status(std::string_view s) {
  static constexpr std::pair<std::string_view, LegStatus> kNames[] = {
      {"posted", LegStatus::posted},     {"already_posted", LegStatus::already_posted},
      {"refused", LegStatus::refused},   {"voided", LegStatus::voided},
      {"reversed", LegStatus::reversed}, {"credit_posted", LegStatus::credit_posted},
      {"released", LegStatus::released},
  };
  for (const auto& [name, status] : kNames) {
    if (name == s) return status;
  }
  return std::nullopt;
}

std::string_view leg_op_name(LegOp op) {
  switch (op) {
    case LegOp::debit: return "debit";
    case LegOp::credit: return "credit";
    case LegOp::cancel_debit: return "cancel_debit";
    case LegOp::cancel_credit: return "cancel_credit";
    case LegOp::release: return "release";
  }
  return "unknown";
}

bool parse_bool(std::string_view v) { return v == "t"; }

// Reads the 21 transfer columns (pg_schema.cpp, SAGA_TRANSFER_COLUMNS).
bool read_transfer(const PGresult* r, int row, TransferDoc& d) {
  using pg::value;
  d.id = value(r, row, 0);
  d.source = value(r, row, 1);
  d.destination = value(r, row, 2);
  std::int64_t hash = 0;
  bool ok = pg::parse_int(value(r, row, 3), d.amount);
  d.currency = value(r, row, 4);
  d.metadata = value(r, row, 5);
  ok = ok && pg::parse_int(value(r, row, 6), hash);
  d.payload_hash = std::bit_cast<std::uint64_t>(hash);
  const auto state = parse_transfer_state(value(r, row, 7));
  d.owner = value(r, row, 8);
  ok = ok && pg::parse_int(value(r, row, 9), d.epoch);
  ok = ok && pg::parse_int(value(r, row, 10), d.lease_until_ms);
  const auto reason =
      pg::is_null(r, row, 11) ? std::optional(Reason::none) : parse_reason(value(r, row, 11));
  ok = ok && pg::parse_int(value(r, row, 12), d.created_at_ms);
  ok = ok && pg::parse_int(value(r, row, 13), d.last_modified_ms);
  ok = ok && pg::parse_int(value(r, row, 14), d.requested_at_ms);
  d.finished_at_ms = 0;
  if (!pg::is_null(r, row, 15)) ok = ok && pg::parse_int(value(r, row, 15), d.finished_at_ms);
  ok = ok && pg::parse_int(value(r, row, 16), d.attempts);
  d.notified = parse_bool(value(r, row, 17));
  d.origin.topic = value(r, row, 18);
  ok = ok && pg::parse_int(value(r, row, 19), d.origin.partition);
  ok = ok && pg::parse_int(value(r, row, 20), d.origin.offset);
  if (!state || !reason) return false;
  d.state = *state;
  d.reason = *reason;
  return ok;
}

bool read_account(const PGresult* r, int row, Account& a) {
  a.id = pg::value(r, row, 0);
  a.currency = pg::value(r, row, 4);
  a.locked = parse_bool(pg::value(r, row, 5));
  return pg::parse_int(pg::value(r, row, 1), a.balance) &&
         pg::parse_int(pg::value(r, row, 2), a.opening_balance) &&
         pg::parse_int(pg::value(r, row, 3), a.min_balance) &&
         pg::parse_int(pg::value(r, row, 6), a.reserved);
}

bool read_posting(const PGresult* r, int row, Posting& p) {
  p.transfer_id = pg::value(r, row, 0);
  p.account_id = pg::value(r, row, 1);
  const auto kind = parse_posting_kind(pg::value(r, row, 2));
  if (!kind) return false;
  p.kind = *kind;
  return pg::parse_int(pg::value(r, row, 3), p.amount) &&
         pg::parse_int(pg::value(r, row, 4), p.at_ms);
}

class PgStore final : public Store {
 public:
  PgStore(std::string conninfo, std::string display)
      : conninfo_(std::move(conninfo)), display_(std::move(display)) {}

  const std::string& display_name() const noexcept override { return display_; }

  // At start-up a server that is down or restarting is retried with the
  // same capped backoff as a lost connection, for up to the URL's
  // connect_timeout (10 s unless given; 0 = no bound); a URL, password or
  // database that is wrong fails at once.
  Status open() {
    const std::optional<Clock::time_point> deadline = open_deadline();
    for (int attempt = 1;; ++attempt) {
      Status s = connect();
      if (s || s.kind() == ErrorKind::fatal) return s;
      auto wait = backoff_;
      if (deadline) {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - Clock::now());
        if (left.count() <= 0) {
          return Status::retry_stage(s.message() + " (gave up after " + std::to_string(attempt) +
                                     " attempts; the URL's connect_timeout bounds the wait)");
        }
        wait = std::min(wait, left);
      }
      spdlog::warn("{}; retrying in {} ms (attempt {})", s.message(), wait.count(), attempt);
      std::this_thread::sleep_for(wait);
    }
  }

  // ---- schema and topology ------------------------------------------------

  Status init_schema() override { return migrate(false); }
  Status contract_schema() override { return migrate(true); }

  // A migration runs beside the workers (the expand step of a rolling
  // upgrade): its table locks can lose a deadlock to a worker's batch, or
  // wait out kMigrationLockTimeout behind a long one. The whole transaction
  // is then repeated, with a growing pause, for up to kMigrationPatience.
  Status migrate(bool contract) {
    const auto deadline = Clock::now() + kMigrationPatience;
    std::chrono::milliseconds wait{250};
    for (int attempt = 1;; ++attempt) {
      Status s = migrate_once(contract);
      if (s.kind() != ErrorKind::retry_call || Clock::now() + wait > deadline) return s;
      spdlog::warn("{}; repeating the migration in {} ms (attempt {})", s.message(), wait.count(),
                   attempt);
      std::this_thread::sleep_for(wait);
      wait = std::min(wait * 2, std::chrono::milliseconds(4000));
    }
  }

  // init (contract = false): every expand step up to this build's version,
  // then this build's functions. A store made from nothing is contracted at
  // once. contract: the contract steps above the floor, then the floor
  // raised to this build's version.
  Status migrate_once(bool contract) {
    const char* op = contract ? "contract schema" : "init schema";
    if (scope_ != Scope::none) return fatal(std::string(op) + ": not possible inside a batch transaction");
    if (Status s = simple("BEGIN", op); !s) return s;
    Transaction tx(*this);
    if (Status s = simple("SELECT pg_advisory_xact_lock(" + std::to_string(pg::kSchemaLockKey) + ")",
                          std::string(op) + ": lock");
        !s)
      return s;
    // A table lock request queues every later batch behind it: a short
    // wait bounds how long the workers stall for each attempt.
    if (Status s = simple("SET LOCAL lock_timeout = '" + std::string(kMigrationLockTimeout) + "'",
                          std::string(op) + ": lock timeout");
        !s)
      return s;
    if (Status s = simple(std::string(pg::kCreateMeta), std::string(op) + ": meta table"); !s) return s;
    ResultPtr r;
    if (Status s = simple("SELECT schema_version, coalesce(schema_expanded, schema_version) FROM saga_meta",
                          std::string(op) + ": version", &r);
        !s)
      return s;
    const bool fresh = PQntuples(r.get()) == 0;
    std::int64_t floor = 0, expanded = 0;
    if (!fresh && (!pg::parse_int(pg::value(r.get(), 0, 0), floor) ||
                   !pg::parse_int(pg::value(r.get(), 0, 1), expanded))) {
      return fatal(std::string(op) + ": unreadable schema_version");
    }
    if (floor > kSchemaVersion || expanded > kSchemaVersion) {
      return fatal("schema version " + std::to_string(std::max(floor, expanded)) +
                   " is newer than this build's (" + std::to_string(kSchemaVersion) +
                   "); run a newer sagapool");
    }
    const auto steps = pg::migrations();
    if (contract) {
      if (fresh || expanded < kSchemaVersion) {
        return fatal("contract schema: the store is not at version " + std::to_string(kSchemaVersion) +
                     " yet; run `sagactl init` first");
      }
    } else {
      for (auto v = static_cast<std::size_t>(expanded); v < steps.size(); ++v) {
        if (steps[v].expand.empty()) continue;
        if (Status s = simple(std::string(steps[v].expand),
                              "init schema: migration to version " + std::to_string(v + 1));
            !s)
          return s;
        if (steps[v].one_step) floor = static_cast<std::int64_t>(v + 1);
      }
      // The functions are (re)installed every time: a store at the current
      // version gets this build's code too.
      if (Status s = simple(std::string(pg::functions()), "init schema: functions"); !s) return s;
    }
    if (contract || fresh) {
      for (auto v = static_cast<std::size_t>(floor); v < steps.size(); ++v) {
        if (steps[v].contract.empty()) continue;
        if (Status s = simple(std::string(steps[v].contract),
                              std::string(op) + ": contract of version " + std::to_string(v + 1));
            !s)
          return s;
      }
      floor = kSchemaVersion;
    }
    if (Status s = simple("INSERT INTO saga_meta (singleton, schema_version, schema_expanded) VALUES (true, " +
                              std::to_string(floor) + ", " + std::to_string(kSchemaVersion) +
                              ") ON CONFLICT (singleton) DO UPDATE SET schema_version = "
                              "EXCLUDED.schema_version, schema_expanded = EXCLUDED.schema_expanded",
                          std::string(op) + ": record version");
        !s)
      return s;
    if (Status s = tx.commit(); !s) return s;
    outbox_ = floor >= kOutboxFloor;
    // Plans prepared against the old schema are dropped with the statements.
    if (Status s = simple("DEALLOCATE ALL", op); !s) return s;
    prepared_.reset();
    return Status::ok();
  }

  Status read_topology(std::optional<Topology>& out) override {
    out.reset();
    ResultPtr r;
    if (Status s = simple("SELECT to_regclass('saga_meta') IS NOT NULL", "read topology", &r); !s)
      return s;
    if (!parse_bool(pg::value(r.get(), 0, 0))) return Status::ok();
    Params p;
    if (Status s = run(Sql::read_meta, p, r, "read topology"); !s) return s;
    if (PQntuples(r.get()) == 0 || pg::is_null(r.get(), 0, 1)) return Status::ok();
    Topology t;
    t.ledger_id = pg::value(r.get(), 0, 1);
    if (!pg::parse_int(pg::value(r.get(), 0, 0), t.schema_version) ||
        !pg::parse_int(pg::value(r.get(), 0, 4), t.schema_expanded) ||
        !pg::parse_int(pg::value(r.get(), 0, 2), t.shard_index) ||
        !pg::parse_int(pg::value(r.get(), 0, 3), t.shard_count)) {
      return fatal("read topology: unreadable saga_meta row");
    }
    out = std::move(t);
    return Status::ok();
  }

  Status write_topology(const Topology& t) override {
    Params p;
    p.text(t.ledger_id);
    p.int64(t.shard_index);
    p.int64(t.shard_count);
    ResultPtr r;
    if (Status s = run(Sql::write_topology, p, r, "write topology"); !s) return s;
    if (std::string_view(PQcmdTuples(r.get())) != "1") {
      return fatal("write topology: the schema is not initialised (run `sagactl init`)");
    }
    return Status::ok();
  }

  // ---- batch transactions (scopes) -------------------------------------------

  // One transaction around all the calls of a batch (store.hpp): one commit
  // instead of one per call. READ COMMITTED whatever the server's default:
  // the functions rely on each statement seeing what was committed before it
  // started (after a lock wait in particular). Inside a scope nothing
  // reconnects or retries on its own: a failed call, a lost connection or a
  // dead transaction fails every later call of the scope without touching
  // the server (so a call can never run outside the transaction, and never
  // half a batch is committed), and end_scope(false) rolls back.
  // Statements whose results nobody waits for (BEGIN, the outbox flags, a
  // walk's writes, decisions) are not sent on their own: they go in one
  // libpq pipeline with the next statement that is waited for (or with
  // COMMIT or PREPARE), saving a round trip each per batch. A failure of
  // one of them fails that call, and so the scope.
  bool supports_scope() const noexcept override { return true; }
  bool concurrent_scopes() const noexcept override { return true; }

  Status begin_scope() override {
    if (scope_ != Scope::none) return fatal("begin scope: a scope is already open");
    if (Status s = guard_reentry("begin scope"); !s) return s;
    if (Status s = ensure_connected(); !s) return s;
    rollback();  // a connection is idle between scopes; make sure
    if (!outbox_ && Clock::now() >= next_floor_check_) read_floor();
    if (conn_ == nullptr) {
      return Status::retry_stage("postgresql " + display_ + ": begin scope: connection lost");
    }
    scope_ = Scope::open;
    begin_unsent_ = true;
    queued_.clear();
    walk_moves_.clear();
    settle_deferred_ = false;
    scope_temp_ = false;
    return Status::ok();
  }

  // Whether finished batches go to the outbox (outbox_): once the floor is
  // 6, no build that reads only the flags runs on the store any more. Read
  // before a scope until it says so, as `migrate --contract` raises the
  // floor while the workers run. A failed reading leaves the flags, which
  // every build reads.
  void read_floor() {
    next_floor_check_ = Clock::now() + kFloorRecheck;
    ResultPtr r;
    std::int64_t floor = 0;
    if (simple("SELECT schema_version FROM saga_meta", "read schema floor", &r).is_ok() &&
        PQntuples(r.get()) == 1 && pg::parse_int(pg::value(r.get(), 0, 0), floor)) {
      outbox_ = floor >= kOutboxFloor;
    }
  }

  Status end_scope(bool commit) override {
    // A failure here marks the scope failed: rolled back below. Every scope
    // ends here, so this is the one place the kept transfers are dropped.
    if (commit && scope_ == Scope::open) {
      write_behind().ignore();
      queue_walk_moves();  // last before COMMIT: the walk's rows are locked only from here
    }
    walk_moves_.clear();
    kept_.clear();
    kept_index_.clear();
    scope_temp_ = false;
    const bool deferred = std::exchange(settle_deferred_, false);  // dropped by every early return
    const Scope was = scope_;
    scope_ = Scope::none;
    const bool nothing_sent = begin_unsent_;
    begin_unsent_ = false;
    if (was == Scope::none) {
      return commit ? fatal("end scope: no scope is open") : Status::ok();
    }
    if (!commit || was == Scope::failed) {
      queued_.clear();
      rollback();
      if (!commit) return Status::ok();
      return Status::retry_stage("postgresql " + display_ +
                                 ": a call inside the batch transaction failed; rolled back");
    }
    if (nothing_sent && queued_.empty()) return Status::ok();  // an empty transaction
    if (conn_ == nullptr || PQtransactionStatus(conn_.get()) !=
                                (nothing_sent ? PQTRANS_IDLE : PQTRANS_INTRANS)) {
      queued_.clear();
      rollback();
      return Status::retry_stage("postgresql " + display_ +
                                 ": the batch transaction was lost before COMMIT; rolled back");
    }
    // BEGIN if not sent yet, what is queued, a deferred walk's lock pass,
    // the scope's pending entries and COMMIT, in one round trip. A
    // connection lost during COMMIT leaves its outcome unknown: the caller
    // runs the batch again, which finds what did commit (duplicates, posted
    // legs) and repeats nothing.
    scope_ = Scope::open;
    begin_unsent_ = nothing_sent;
    settle_deferred_ = deferred;  // its lock pass rides with COMMIT
    Status s = queue_settle_apply();
    ResultPtr r;
    if (s) {
      s = run_pipelined(nullptr, nullptr, r, "commit batch transaction", OnUnique::fatal, kCommit);
    }
    scope_ = Scope::none;
    begin_unsent_ = false;
    settle_deferred_ = false;
    queued_.clear();
    if (!s) rollback();
    if (s) settle_at_once_ = false;  // the deferred walk, if any, stood
    return s;
  }

  Status now_ms(std::int64_t& out) override {
    Params p;
    ResultPtr r;
    if (Status s = run(Sql::now, p, r, "now"); !s) return s;
    if (!pg::parse_int(pg::value(r.get(), 0, 0), out)) return fatal("now: unreadable clock");
    return Status::ok();
  }

  // ---- transfers ------------------------------------------------------------

  Status insert_transfers(std::span<const NewTransfer> batch, std::string_view owner,
                          std::int64_t lease_ms, std::span<InsertResult> results) override {
    if (Status s = check_results(batch.size(), results.size(), "insert transfers"); !s) return s;
    return in_chunks(batch.size(), [&](std::size_t b, std::size_t n) {
      return insert_transfers_chunk(batch.subspan(b, n), owner, lease_ms, results.subspan(b, n));
    });
  }

  Status transition(std::span<const Transition> batch, std::int64_t lease_ms,
                    std::span<std::uint8_t> applied, std::int64_t* at_ms) override {
    if (Status s = check_results(batch.size(), applied.size(), "transition"); !s) return s;
    // Split over statements, every record gets the same time, as in one.
    std::optional<std::int64_t> now;
    if (batch.size() > kStatementMax) {
      if (Status s = now_ms(now.emplace()); !s) return s;
    }
    if (!kept_index_.empty()) {
      if (all_kept_from_initial(batch)) return write_kept(batch, lease_ms, now, applied, at_ms);
      if (Status s = write_behind(); !s) return s;
    }
    return in_chunks(batch.size(), [&](std::size_t b, std::size_t n) {
      return transition_chunk(batch.subspan(b, n), lease_ms, now, applied.subspan(b, n), at_ms);
    });
  }

  Status insert_transfers_chunk(std::span<const NewTransfer> batch, std::string_view owner,
                                std::int64_t lease_ms, std::span<InsertResult> results) {
    if (batch.empty()) return Status::ok();
    if (scope_ == Scope::open) return check_transfers_chunk(batch, owner, lease_ms, results);
    Params p;
    if (!add_payload_arrays(batch, p)) return nul_byte("insert transfers");
    ArrayLiteral requested, topic, partition, offset;
    for (const NewTransfer& t : batch) {
      requested.int64(t.requested_at_ms);
      topic.text(t.origin_topic);
      partition.int64(t.origin_partition);
      offset.int64(t.origin_offset);
    }
    for (ArrayLiteral* a : {&requested, &topic, &partition, &offset}) {
      if (!add_array(p, std::move(*a))) return nul_byte("insert transfers");
    }
    p.text(owner);
    p.int64(lease_ms);
    ResultPtr r;
    if (Status s = run(Sql::insert_transfers, p, r, "insert transfers", OnUnique::retry); !s)
      return s;
    if (Status s = check_rows(r.get(), batch.size(), "insert transfers"); !s) return s;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const std::string_view v = pg::value(r.get(), static_cast<int>(i), 0);
      if (v == "0")
        results[i] = InsertResult::inserted;
      else if (v == "1")
        results[i] = InsertResult::duplicate;
      else if (v == "2")
        results[i] = InsertResult::conflict;
      else if (v == "-1")
        return fatal("insert transfers: transfer " + std::string(batch[i].request.id) +
                     " vanished during the insert");
      else
        return fatal("insert transfers: unexpected result " + std::string(v));
    }
    return Status::ok();
  }

  Status transition_chunk(std::span<const Transition> batch, std::int64_t lease_ms,
                          std::optional<std::int64_t> now, std::span<std::uint8_t> applied,
                          std::int64_t* at_ms) {
    if (batch.empty()) return Status::ok();
    ArrayLiteral id, from, to, reason, owner, epoch;
    for (const Transition& t : batch) {
      id.text(t.id);
      from.text(to_string(t.from));
      to.text(to_string(t.to));
      reason.text(to_string(t.reason));
      owner.text(t.owner);
      epoch.int64(t.epoch);
    }
    Params p;
    for (ArrayLiteral* a : {&id, &from, &to, &reason, &owner, &epoch}) {
      if (!add_array(p, std::move(*a))) return nul_byte("transition");
    }
    p.int64(lease_ms);
    p.int64_or_null(now);
    ResultPtr r;
    if (Status s = run(Sql::transition, p, r, "transition"); !s) return s;
    if (Status s = check_rows(r.get(), batch.size(), "transition"); !s) return s;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const int row = static_cast<int>(i);
      applied[i] = static_cast<std::uint8_t>(!pg::is_null(r.get(), row, 0));
      if (applied[i] && at_ms != nullptr && !pg::parse_int(pg::value(r.get(), row, 0), *at_ms)) {
        return fatal("transition: unexpected result " + std::string(pg::value(r.get(), row, 0)));
      }
    }
    return Status::ok();
  }

  // ---- transfers written behind ---------------------------------------------
  // Inside a scope, insert_transfers checks the batch against what is stored
  // and keeps the new transfers here; transition() then writes each once, in
  // the state the batch leaves it in. A saga run whole in the batch never
  // stores `initial` only to overwrite it: one row version and one entry in
  // the recovery index instead of two of each, and none in the indexes of
  // unfinished work (bench/REPORT.md, "Transfers written once"). Any other
  // read or write of transfers inside the scope, and its COMMIT, first
  // writes what is kept (write_behind), as inserted.
  // The check does not wait for another batch inserting the same id, as an
  // insert would: that batch's settle or insert then fails on a unique key
  // (OnUnique::retry), and the batch, run again, finds a duplicate.

  // The requests' payloads, parameters $1-$7 of both the insert and the check.
  static bool add_payload_arrays(std::span<const NewTransfer> batch, Params& p) {
    ArrayLiteral id, source, dest, amount, currency, metadata, hash;
    for (const NewTransfer& t : batch) {
      id.text(t.request.id);
      source.text(t.request.from);
      dest.text(t.request.to);
      amount.int64(t.request.amount);
      currency.text(t.request.currency);
      metadata.text(t.request.metadata);
      hash.int64(std::bit_cast<std::int64_t>(t.payload_hash));
    }
    for (ArrayLiteral* a : {&id, &source, &dest, &amount, &currency, &metadata, &hash}) {
      if (!add_array(p, std::move(*a))) return false;
    }
    return true;
  }

  Status check_transfers_chunk(std::span<const NewTransfer> batch, std::string_view owner,
                               std::int64_t lease_ms, std::span<InsertResult> results) {
    Params p;
    if (!add_payload_arrays(batch, p)) return nul_byte("insert transfers");
    ResultPtr r;
    if (Status s = run(Sql::check_transfers, p, r, "insert transfers"); !s) return s;
    if (Status s = check_rows(r.get(), batch.size(), "insert transfers"); !s) return s;
    std::int64_t now = 0;
    if (!pg::parse_int(pg::value(r.get(), 0, 1), now)) return fatal("insert transfers: unreadable clock");
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const std::string_view v = pg::value(r.get(), static_cast<int>(i), 0);
      const NewTransfer& t = batch[i];
      if (v == "1") {
        results[i] = InsertResult::duplicate;
      } else if (v == "2") {
        results[i] = InsertResult::conflict;
      } else if (v != "0") {
        return fatal("insert transfers: unexpected result " + std::string(v));
      } else if (auto it = kept_index_.find(t.request.id); it != kept_index_.end()) {
        // Named earlier in this batch: compared with that one, as one by one.
        const KeptTransfer& k = kept_[it->second];
        const bool same = std::bit_cast<std::uint64_t>(k.hash) == t.payload_hash &&
                          k.source == t.request.from && k.destination == t.request.to &&
                          k.amount == t.request.amount && k.currency == t.request.currency &&
                          k.metadata == t.request.metadata;
        results[i] = same ? InsertResult::duplicate : InsertResult::conflict;
      } else {
        kept_index_.emplace(std::string(t.request.id), kept_.size());
        kept_.push_back({std::string(t.request.id), std::string(t.request.from),
                          std::string(t.request.to), std::string(t.request.currency),
                          std::string(t.request.metadata), std::string(t.origin_topic),
                          std::string(owner), t.request.amount,
                          std::bit_cast<std::int64_t>(t.payload_hash), t.requested_at_ms,
                          t.origin_partition, t.origin_offset, lease_ms, now});
        results[i] = InsertResult::inserted;
      }
    }
    return Status::ok();
  }

  // Every record is a kept transfer's first transition, from `initial` by
  // its inserter (the batch's engine coalesces what came between).
  bool all_kept_from_initial(std::span<const Transition> batch) {
    kept_seen_.assign(kept_.size(), 0);
    for (const Transition& t : batch) {
      const auto it = kept_index_.find(t.id);
      if (it == kept_index_.end() || t.from != TransferState::initial || t.epoch != 1 ||
          t.owner != kept_[it->second].owner || kept_seen_[it->second]++ != 0) {
        return false;
      }
    }
    return true;
  }

  Status write_kept(std::span<const Transition> batch, std::int64_t lease_ms,
                    std::optional<std::int64_t> now, std::span<std::uint8_t> applied,
                    std::int64_t* at_ms) {
    kept_writes_.clear();
    for (const Transition& t : batch) {
      kept_writes_.push_back({kept_index_.find(t.id)->second, t.to, t.reason, lease_ms});
    }
    if (Status s = write_kept_rows(now, at_ms); !s) return s;
    std::fill(applied.begin(), applied.begin() + static_cast<std::ptrdiff_t>(batch.size()), 1);
    return Status::ok();
  }

  // What is kept and not written yet, as insert_transfers would have stored it.
  Status write_behind() {
    if (kept_index_.empty()) return Status::ok();
    kept_writes_.clear();
    for (std::size_t i = 0; i < kept_.size(); ++i) {
      const auto it = kept_index_.find(kept_[i].id);
      if (it != kept_index_.end() && it->second == i) {
        kept_writes_.push_back({i, TransferState::initial, Reason::none, kept_[i].lease_ms});
      }
    }
    return write_kept_rows(std::nullopt, nullptr);
  }

  Status write_kept_rows(std::optional<std::int64_t> now, std::int64_t* at_ms) {
    for (std::size_t b = 0; b < kept_writes_.size(); b += kStatementMax) {
      const std::size_t n = std::min(kStatementMax, kept_writes_.size() - b);
      ArrayLiteral id, source, dest, amount, currency, metadata, hash, requested, topic, partition,
          offset, state, reason, owner, lease, created;
      for (std::size_t w = b; w < b + n; ++w) {
        const KeptWrite& kw = kept_writes_[w];
        const KeptTransfer& k = kept_[kw.row];
        id.text(k.id);
        source.text(k.source);
        dest.text(k.destination);
        amount.int64(k.amount);
        currency.text(k.currency);
        metadata.text(k.metadata);
        hash.int64(k.hash);
        requested.int64(k.requested_at_ms);
        topic.text(k.topic);
        partition.int64(k.partition);
        offset.int64(k.offset);
        state.text(to_string(kw.state));
        reason.text(to_string(kw.reason));
        owner.text(k.owner);
        lease.int64(kw.lease_ms);
        created.int64(k.created_at_ms);
      }
      Params p;
      for (ArrayLiteral* a : {&id, &source, &dest, &amount, &currency, &metadata, &hash, &requested,
                              &topic, &partition, &offset, &state, &reason, &owner, &lease, &created}) {
        if (!add_array(p, std::move(*a))) return nul_byte("write transfers");
      }
      p.int64_or_null(now);
      p.boolean(outbox_);
      ResultPtr r;
      if (Status s = run(Sql::insert_fresh, p, r, "write transfers", OnUnique::retry); !s) return s;
      std::int64_t time = 0, count = 0;
      if (PQntuples(r.get()) != 1 || !pg::parse_int(pg::value(r.get(), 0, 0), time) ||
          !pg::parse_int(pg::value(r.get(), 0, 1), count) || count != static_cast<std::int64_t>(n)) {
        return fatal("write transfers: unexpected result");
      }
      if (at_ms != nullptr) *at_ms = time;
      for (std::size_t w = b; w < b + n; ++w) kept_index_.erase(kept_[kept_writes_[w].row].id);
    }
    return Status::ok();
  }

  Status claim_expired(std::string_view owner, std::int64_t lease_ms, std::size_t limit,
                       std::vector<TransferDoc>& out) override {
    if (Status s = write_behind(); !s) return s;
    Params p;
    p.text(owner);
    p.int64(lease_ms);
    return fetch_limited(Sql::claim_expired, p, std::min(limit, kStatementMax), "claim expired", out);
  }

  Status take_over(std::string_view id, std::string_view owner, std::int64_t lease_ms,
                   std::optional<TransferDoc>& out) override {
    if (Status s = write_behind(); !s) return s;
    out.reset();
    Params p;
    p.text(id);
    p.text(owner);
    p.int64(lease_ms);
    ResultPtr r;
    if (Status s = run(Sql::take_over, p, r, "take over"); !s) return s;
    std::vector<TransferDoc> docs;
    if (Status s = read_rows(r.get(), docs, "take over"); !s) return s;
    if (!docs.empty()) {
      out = std::move(docs.front());
      return Status::ok();
    }
    // Finished (or missing): as it is. A statement of its own, so that it
    // sees a finish committed while the update waited on the row.
    return load_transfer(id, out);
  }

  Status mark_notified(std::span<const std::string_view> ids) override {
    if (Status s = write_behind(); !s) return s;
    return in_chunks(ids.size(), [&](std::size_t b, std::size_t n) {
      return mark_notified_chunk(ids.subspan(b, n));
    });
  }

  Status mark_notified_chunk(std::span<const std::string_view> ids) {
    if (ids.empty()) return Status::ok();
    ArrayLiteral a;
    for (std::string_view id : ids) a.text(id);
    Params p;
    if (!add_array(p, std::move(a))) return nul_byte("mark notified");
    if (scope_ == Scope::open) return enqueue(Sql::mark_notified, std::move(p), "mark notified");
    ResultPtr r;
    return run(Sql::mark_notified, p, r, "mark notified");
  }

  Status load_transfer(std::string_view id, std::optional<TransferDoc>& out) override {
    if (Status s = write_behind(); !s) return s;
    out.reset();
    Params p;
    p.text(id);
    std::vector<TransferDoc> docs;
    if (Status s = fetch(Sql::load_transfer, p, "load transfer", docs); !s) return s;
    if (!docs.empty()) out = std::move(docs.front());
    return Status::ok();
  }

  Status list_stale(std::int64_t before_ms, std::size_t limit,
                    std::vector<TransferDoc>& out) override {
    if (Status s = write_behind(); !s) return s;
    Params p;
    p.int64(before_ms);
    return fetch_limited(Sql::list_stale, p, limit, "list stale", out);
  }

  Status state_stats(StateStatsTable& out) override {
    if (Status s = write_behind(); !s) return s;
    out = {};
    // Read every scrape: it must walk the recovery index, never the table.
    // Until a store's first ANALYZE the planner guesses half the rows match
    // and reads the whole table instead (220 ms at 588,000 transfers). A
    // plain index scan, not a bitmap scan: it marks the entries of row
    // versions no one can see any more (each published outcome leaves one),
    // so the next reading skips them without visiting the table. SET LOCAL
    // lasts as long as the query string's implicit transaction; inside a
    // scope it would last to the scope's end, so there the plain statement.
    static const std::string sql =
        std::string("SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off; ") +
        pg::statement(Sql::state_stats).text;
    ResultPtr r;
    Params p;
    if (Status s = scope_ == Scope::none ? simple(sql, "state stats", &r)
                                         : run(Sql::state_stats, p, r, "state stats");
        !s) {
      return s;
    }
    for (int row = 0; row < PQntuples(r.get()); ++row) {
      const auto state = parse_transfer_state(pg::value(r.get(), row, 0));
      if (!state)
        return fatal("state stats: unknown state " + std::string(pg::value(r.get(), row, 0)));
      StateStats& s = out[static_cast<std::size_t>(*state)];
      if (!pg::parse_int(pg::value(r.get(), row, 1), s.count) ||
          !pg::parse_int(pg::value(r.get(), row, 2), s.oldest_ms) ||
          !pg::parse_int(pg::value(r.get(), row, 3), s.stuck)) {
        return fatal("state stats: unreadable row");
      }
    }
    return Status::ok();
  }

  Status scan_transfer_states(
      const std::function<void(std::string_view, TransferState, bool)>& fn) override {
    if (Status s = write_behind(); !s) return s;
    Params p;
    return scan(Sql::scan_transfer_states, p, "scan transfer states", [&](const PGresult* r) {
      const auto state = parse_transfer_state(pg::value(r, 0, 1));
      if (!state) return false;
      fn(pg::value(r, 0, 0), *state, parse_bool(pg::value(r, 0, 2)));
      return true;
    });
  }

  // ---- accounts and legs ------------------------------------------------------

  Status apply_legs(std::span<const LegRequest> batch, std::span<LegResult> results) override {
    if (Status s = check_results(batch.size(), results.size(), "apply legs"); !s) return s;
    return in_chunks(batch.size(), [&](std::size_t b, std::size_t n) {
      return apply_legs_chunk(batch.subspan(b, n), results.subspan(b, n));
    });
  }

  Status apply_legs_chunk(std::span<const LegRequest> batch, std::span<LegResult> results) {
    if (batch.empty()) return Status::ok();
    ArrayLiteral op, transfer, account, amount, currency;
    for (const LegRequest& l : batch) {
      if ((l.op == LegOp::debit || l.op == LegOp::credit) && l.amount <= 0) {
        return fatal("apply legs: " + std::string(leg_op_name(l.op)) + " of transfer " +
                     std::string(l.transfer_id) + " has a non-positive amount");
      }
      op.text(leg_op_name(l.op));
      transfer.text(l.transfer_id);
      account.text(l.account_id);
      amount.int64(l.amount);
      currency.text(l.currency);
    }
    Params p;
    for (ArrayLiteral* a : {&op, &transfer, &account, &amount, &currency}) {
      if (!add_array(p, std::move(*a))) return nul_byte("apply legs");
    }
    ResultPtr r;
    if (scope_ != Scope::none) scope_temp_ = true;  // saga_scope_pending
    if (Status s = run(Sql::apply_legs, p, r, "apply legs", OnUnique::retry); !s) return s;
    if (Status s = check_rows(r.get(), batch.size(), "apply legs"); !s) return s;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const int row = static_cast<int>(i);
      const auto status = parse_leg_status(pg::value(r.get(), row, 0));
      const auto reason = pg::is_null(r.get(), row, 1) ? std::optional(Reason::none)
                                                       : parse_reason(pg::value(r.get(), row, 1));
      if (!status || !reason) return fatal("apply legs: unexpected result row");
      results[i].status = *status;
      results[i].reason = *reason;
      results[i].account_currency = pg::value(r.get(), row, 2);
    }
    return Status::ok();
  }

  bool supports_settle_sagas() const noexcept override { return true; }

  // One statement locks its accounts in one order; a batch of more
  // transfers than a statement carries locks all of them first (the
  // planning read's global order), so chunks never wait on each other's
  // accounts in opposite orders across callers.
  Status settle_sagas(std::span<const SettleRequest> batch, std::span<SettleResult> results) override {
    if (Status s = check_results(batch.size(), results.size(), "settle"); !s) return s;
    if (scope_ == Scope::none) return fatal("settle: runs only inside a batch transaction");
    constexpr std::size_t kChunk = kStatementMax / 2;  // two accounts a transfer
    if (batch.size() > kChunk) {
      std::vector<std::string_view> ids;
      ids.reserve(2 * batch.size());
      for (const SettleRequest& t : batch) {
        ids.push_back(t.source);
        ids.push_back(t.destination);
      }
      std::vector<std::optional<Account>> ignored(ids.size());
      if (Status s = load_accounts(ids, ignored); !s) return s;
    }
    // One statement's walk may leave its lock pass to COMMIT (saga_settle_batch,
    // p_defer); several lock up front, above.
    const bool defer = batch.size() <= kChunk && !settle_at_once_;
    for (std::size_t b = 0; b < batch.size(); b += kChunk) {
      const std::size_t n = std::min(kChunk, batch.size() - b);
      if (Status s = settle_chunk(batch.subspan(b, n), results.subspan(b, n), defer); !s) return s;
    }
    return Status::ok();
  }

  Status settle_chunk(std::span<const SettleRequest> batch, std::span<SettleResult> results,
                      bool defer) {
    ArrayLiteral transfer, source, destination, amount, currency;
    for (const SettleRequest& t : batch) {
      if (t.amount <= 0) {
        return fatal("settle: transfer " + std::string(t.transfer_id) + " has a non-positive amount");
      }
      transfer.text(t.transfer_id);
      source.text(t.source);
      destination.text(t.destination);
      amount.int64(t.amount);
      currency.text(t.currency);
    }
    Params p;
    for (ArrayLiteral* a : {&transfer, &source, &destination, &amount, &currency}) {
      if (!add_array(p, std::move(*a))) return nul_byte("settle");
    }
    p.boolean(defer);
    ResultPtr r;
    // A posting or void already there: another batch took the same new
    // transfer and committed first (its id was checked before that, and
    // transfers are written behind). Run again, the batch finds it a
    // duplicate.
    scope_temp_ = true;  // saga_scope_settle, or its lookup
    if (Status s = run(Sql::settle, p, r, "settle", OnUnique::retry); !s) return s;
    if (defer) settle_deferred_ = settle_at_once_ = true;  // at once until this scope commits
    if (Status s = check_rows(r.get(), batch.size(), "settle"); !s) return s;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const int row = static_cast<int>(i);
      const std::string_view outcome = pg::value(r.get(), row, 0);
      const auto reason = pg::is_null(r.get(), row, 1) ? std::optional(Reason::none)
                                                       : parse_reason(pg::value(r.get(), row, 1));
      if ((outcome != "done" && outcome != "canceled") || !reason) {
        return fatal("settle: unexpected result row");
      }
      results[i].outcome = outcome == "done" ? TransferState::done : TransferState::canceled;
      results[i].reason = *reason;
      results[i].account_currency = pg::value(r.get(), row, 2);
    }
    return Status::ok();
  }

  Status create_accounts(std::span<const Account> accounts) override {
    if (accounts.empty()) return Status::ok();
    ArrayLiteral id, balance, min_balance, currency, locked;
    for (const Account& a : accounts) {
      id.text(a.id);
      balance.int64(a.balance);
      min_balance.int64(a.min_balance);
      currency.text(a.currency);
      locked.text(a.locked ? "t" : "f");
    }
    Params p;
    for (ArrayLiteral* a : {&id, &balance, &min_balance, &currency, &locked}) {
      if (!add_array(p, std::move(*a))) return nul_byte("create accounts");
    }
    ResultPtr r;
    if (Status s = run(Sql::create_accounts, p, r, "create accounts"); !s) return s;
    if (!pg::is_null(r.get(), 0, 0)) {
      return fatal("account " + std::string(pg::value(r.get(), 0, 0)) +
                   " already exists or is named twice; nothing was created");
    }
    return Status::ok();
  }

  Status load_account(std::string_view id, std::optional<Account>& out) override {
    out.reset();
    Params p;
    p.text(id);
    ResultPtr r;
    if (Status s = run(Sql::load_account, p, r, "load account"); !s) return s;
    if (PQntuples(r.get()) == 0) return Status::ok();
    Account a;
    if (!read_account(r.get(), 0, a)) return fatal("load account: unreadable row");
    out = std::move(a);
    return Status::ok();
  }

  // One snapshot of every account the batch names: one statement, or for
  // more than a statement carries, one transaction (a scope's, or a
  // read-only REPEATABLE READ one). Inside a scope the ids are locked in one
  // global order across the statements, as one statement would.
  Status load_accounts(std::span<const std::string_view> ids,
                       std::span<std::optional<Account>> out) override {
    return read_accounts_as(scope_ == Scope::none ? Sql::load_accounts : Sql::load_accounts_locked, ids, out);
  }

  Status read_accounts(std::span<const std::string_view> ids,
                       std::span<std::optional<Account>> out) override {
    return read_accounts_as(Sql::load_accounts, ids, out);
  }

  // `sql`: load_accounts, or inside a scope load_accounts_locked.
  Status read_accounts_as(Sql sql, std::span<const std::string_view> ids,
                          std::span<std::optional<Account>> out) {
    if (Status s = check_results(ids.size(), out.size(), "load accounts"); !s) return s;
    if (ids.size() <= kStatementMax) return load_accounts_chunk(sql, ids, out);
    std::vector<std::string_view> sorted(ids.begin(), ids.end());
    std::sort(sorted.begin(), sorted.end());
    sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
    std::vector<std::optional<Account>> found(sorted.size());
    std::optional<Transaction> tx;
    if (scope_ == Scope::none) {
      if (Status s = simple("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", "load accounts");
          !s)
        return s;
      tx.emplace(*this);
    }
    for (std::size_t b = 0; b < sorted.size(); b += kStatementMax) {
      const std::size_t n = std::min(kStatementMax, sorted.size() - b);
      if (Status s = load_accounts_chunk(sql, std::span(sorted).subspan(b, n),
                                         std::span(found).subspan(b, n));
          !s)
        return s;
    }
    if (tx) {
      if (Status s = tx->commit(); !s) return s;
    }
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const auto k = std::lower_bound(sorted.begin(), sorted.end(), ids[i]) - sorted.begin();
      out[i] = found[static_cast<std::size_t>(k)];
    }
    return Status::ok();
  }

  Status load_accounts_chunk(Sql sql, std::span<const std::string_view> ids,
                             std::span<std::optional<Account>> out) {
    for (std::size_t i = 0; i < ids.size(); ++i) out[i].reset();
    if (ids.empty()) return Status::ok();
    ArrayLiteral array;
    for (std::string_view id : ids) array.text(id);
    Params p;
    if (!add_array(p, std::move(array))) return nul_byte("load accounts");
    ResultPtr r;
    if (Status s = run(sql, p, r, "load accounts"); !s) return s;
    std::unordered_map<std::string_view, std::size_t> row_of;  // views into r
    for (int row = 0; row < PQntuples(r.get()); ++row) {
      row_of.emplace(pg::value(r.get(), row, 0), static_cast<std::size_t>(row));
    }
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const auto it = row_of.find(ids[i]);
      if (it == row_of.end()) continue;
      Account a;
      if (!read_account(r.get(), static_cast<int>(it->second), a)) {
        return fatal("load accounts: unreadable row");
      }
      out[i] = std::move(a);
    }
    return Status::ok();
  }

  Status set_locked(std::string_view id, bool locked, bool& found) override {
    Params p;
    p.text(id);
    p.boolean(locked);
    ResultPtr r;
    if (Status s = run(Sql::set_locked, p, r, "set locked"); !s) return s;
    found = std::string_view(PQcmdTuples(r.get())) == "1";
    return Status::ok();
  }

  Status postings_for_transfer(std::string_view transfer_id, std::vector<Posting>& out) override {
    Params p;
    p.text(transfer_id);
    return fetch(Sql::postings_for_transfer, p, "postings for transfer", out);
  }

  Status postings_for_account(std::string_view account_id, std::size_t limit,
                              std::vector<Posting>& out) override {
    Params p;
    p.text(account_id);
    return fetch_limited(Sql::postings_for_account, p, limit, "postings for account", out);
  }

  Status pending_for_account(std::string_view account_id,
                             std::vector<std::string>& transfer_ids) override {
    transfer_ids.clear();
    if (Status s = flush_scope_pending("pending for account"); !s) return s;
    Params p;
    p.text(account_id);
    ResultPtr r;
    if (Status s = run(Sql::pending_for_account, p, r, "pending for account"); !s) return s;
    for (int row = 0; row < PQntuples(r.get()); ++row) {
      transfer_ids.emplace_back(pg::value(r.get(), row, 0));
    }
    return Status::ok();
  }

  Status scan_accounts(const std::function<void(const Account&)>& fn) override {
    return scan_into<Account>(Sql::scan_accounts, "scan accounts", read_account, fn);
  }

  Status scan_postings(const std::function<void(const Posting&)>& fn) override {
    return scan_into<Posting>(Sql::scan_postings, "scan postings", read_posting, fn);
  }

  Status scan_pending(const std::function<void(const PendingEntry&)>& fn) override {
    if (Status s = flush_scope_pending("scan pending"); !s) return s;
    auto read = [](const PGresult* r, int row, PendingEntry& e) {
      e.account_id = pg::value(r, row, 0);
      e.transfer_id = pg::value(r, row, 1);
      return true;
    };
    return scan_into<PendingEntry>(Sql::scan_pending, "scan pending", read, fn);
  }

  // ---- the worker registry ---------------------------------------------------

  Status register_worker(const WorkerRecord& w) override {
    Params p;
    p.text(w.worker_id);
    p.text(w.build_version);
    p.text(w.git_revision);
    p.int64(w.schema_version);
    p.int64(w.lease_ms);
    ResultPtr r;
    return run(Sql::register_worker, p, r, "register worker");
  }

  Status deregister_worker(std::string_view worker_id) override {
    Params p;
    p.text(worker_id);
    ResultPtr r;
    return run(Sql::deregister_worker, p, r, "deregister worker");
  }

  Status list_workers(std::vector<WorkerRecord>& out) override {
    out.clear();
    Params p;
    ResultPtr r;
    if (Status s = run(Sql::list_workers, p, r, "list workers"); !s) return s;
    for (int row = 0; row < PQntuples(r.get()); ++row) {
      WorkerRecord& w = out.emplace_back();
      w.worker_id = pg::value(r.get(), row, 0);
      w.build_version = pg::value(r.get(), row, 1);
      w.git_revision = pg::value(r.get(), row, 2);
      if (!pg::parse_int(pg::value(r.get(), row, 3), w.schema_version) ||
          !pg::parse_int(pg::value(r.get(), row, 4), w.lease_ms) ||
          !pg::parse_int(pg::value(r.get(), row, 5), w.heartbeat_ms)) {
        return fatal("list workers: unreadable row");
      }
    }
    return Status::ok();
  }

  Status recent_owners(std::int64_t since_ms, std::vector<std::string>& out) override {
    if (Status s = write_behind(); !s) return s;
    out.clear();
    Params p;
    p.int64(since_ms);
    ResultPtr r;
    if (Status s = run(Sql::recent_owners, p, r, "recent owners"); !s) return s;
    for (int row = 0; row < PQntuples(r.get()); ++row) out.emplace_back(pg::value(r.get(), row, 0));
    return Status::ok();
  }

  // ---- batches across stores (two-phase commit) -------------------------------
  // store.hpp, TwoPhaseStore. A store other than the batch's first runs a
  // walk's scope: load_accounts (locks), write_walk (queued), then
  // prepare_scope, which sends the walk with PREPARE TRANSACTION in one
  // round trip. PREPARE refuses a transaction that used the session's
  // temporary tables, which only the one-store path does (its scope's
  // pending entries, a deferred settle): such a scope is refused here.

  bool supports_prepare() const noexcept override { return max_prepared_ > 0; }

  // The postings and voids are queued at once; the moves are kept until
  // the scope's PREPARE or COMMIT (or a statement that reads balances), so
  // the walk's accounts are locked only from there (walked first, locked
  // last, as saga_settle_batch). Split over statements (kStatementMax
  // records of each kind a statement), every record gets the same time.
  Status write_walk(std::span<const WalkPosting> postings, std::span<const WalkVoid> voids,
                    std::span<const BalanceMove> balances) override {
    if (scope_ == Scope::none) return fatal("write walk: runs only inside a batch transaction");
    const std::size_t n = std::max(postings.size(), voids.size());
    std::optional<std::int64_t> now;
    if (n > kStatementMax) {
      if (Status s = now_ms(now.emplace()); !s) return s;
    }
    const auto piece = [](auto all, std::size_t b) {
      const std::size_t from = std::min(b, all.size());
      return all.subspan(from, std::min(kStatementMax, all.size() - from));
    };
    for (std::size_t b = 0; b < n; b += kStatementMax) {
      ArrayLiteral tr, acc, kind, amount, void_tr, void_acc, void_kind;
      for (const WalkPosting& w : piece(postings, b)) {
        if (w.amount <= 0) {
          return fatal("write walk: a posting of transfer " + std::string(w.transfer_id) +
                       " has a non-positive amount");
        }
        tr.text(w.transfer_id);
        acc.text(w.account_id);
        kind.text(to_string(w.kind));
        amount.int64(w.amount);
      }
      for (const WalkVoid& v : piece(voids, b)) {
        void_tr.text(v.transfer_id);
        void_acc.text(v.account_id);
        void_kind.text(v.credit ? "credit" : "debit");
      }
      Params p;
      p.int64_or_null(now);
      for (ArrayLiteral* a : {&tr, &acc, &kind, &amount, &void_tr, &void_acc, &void_kind}) {
        if (!add_array(p, std::move(*a))) return nul_byte("write walk");
      }
      // A posting or void already there: another batch took the same new
      // transfer and committed first (as in settle); run again, the batch
      // finds it a duplicate.
      if (Status s = enqueue(Sql::write_walk, std::move(p), "write walk", OnUnique::retry); !s)
        return s;
    }
    if (balances.empty()) return Status::ok();
    if (Status s = ensure_prepared(Sql::walk_move); !s) return s;
    // In byte order of the ids: the server's lock order where ids collate
    // as "C", so saga_walk_move need not sort them; and one order across
    // the statements of a walk longer than one.
    move_order_.resize(balances.size());
    for (std::size_t i = 0; i < balances.size(); ++i) move_order_[i] = static_cast<std::uint32_t>(i);
    std::sort(move_order_.begin(), move_order_.end(), [&](std::uint32_t x, std::uint32_t y) {
      return balances[x].account_id < balances[y].account_id;
    });
    for (std::size_t b = 0; b < balances.size(); b += kStatementMax) {
      ArrayLiteral id, from, to, reserved, min, currency, locked, low, reserved_high, sum_high, refused;
      for (const std::uint32_t k : piece(std::span<const std::uint32_t>(move_order_), b)) {
        const BalanceMove& m = balances[k];
        id.text(m.account_id);
        from.int64(m.from);
        to.int64(m.to);
        reserved.int64(m.reserved);
        min.int64(m.min_balance);
        currency.text(m.currency);
        locked.boolean(m.locked);
        low.int64_or_null(m.low);
        reserved_high.int64_or_null(m.reserved_high);
        sum_high.int64_or_null(m.sum_high);
        refused.boolean(m.refused);
      }
      Params p;
      for (ArrayLiteral* a : {&id, &from, &to, &reserved, &min, &currency, &locked, &low, &reserved_high,
                              &sum_high, &refused}) {
        if (!add_array(p, std::move(*a))) return nul_byte("write walk");
      }
      walk_moves_.push_back(std::move(p));
    }
    return Status::ok();
  }

  // A walk's moves, kept by write_walk, go ahead of the statement queued
  // next that may read balances, or of PREPARE / COMMIT.
  void queue_walk_moves() {
    for (Params& p : walk_moves_) queued_.push_back({Sql::walk_move, std::move(p), "walk moves", OnUnique::fatal});
    walk_moves_.clear();
  }

  // Ends the scope as end_scope(true) would, with PREPARE TRANSACTION in
  // place of the pending entries' flush and COMMIT, and nothing written
  // behind: only a walk's scope. The gid is a literal (the statement takes
  // no parameters), checked and quoted.
  Status prepare_scope(std::string_view gid) override {
    static const std::string op = "prepare batch transaction";
    if (scope_ == Scope::none) return fatal(op + ": no scope is open");
    // Every return below ends the scope; a failure rolls it back.
    const auto refuse = [&](Status s) {
      end_scope(false).ignore();
      return s;
    };
    if (Status s = check_gid(gid, op); !s) return refuse(std::move(s));
    if (!supports_prepare()) {
      return refuse(
          fatal(op + ": the server's max_prepared_transactions is 0 (set it, and restart)"));
    }
    if (!kept_.empty() || settle_deferred_ || scope_temp_) {
      return refuse(fatal(op + ": only a walk's scope can be prepared; this one " +
                          (!kept_.empty() ? "inserted transfers"
                                          : "used the session's temporary tables (legs, settle)")));
    }
    if (scope_ == Scope::failed) {
      return refuse(Status::retry_stage(
          "postgresql " + display_ + ": a call inside the batch transaction failed; rolled back"));
    }
    const bool nothing_sent = begin_unsent_;
    if (nothing_sent && queued_.empty()) return refuse(Status::ok());  // nothing to prepare
    if (conn_ == nullptr || PQtransactionStatus(conn_.get()) !=
                                (nothing_sent ? PQTRANS_IDLE : PQTRANS_INTRANS)) {
      return refuse(Status::retry_stage(
          "postgresql " + display_ + ": the batch transaction was lost before PREPARE; rolled back"));
    }
    std::string prepare;
    if (Status s = gid_literal(gid, op, prepare); !s) return refuse(std::move(s));
    prepare.insert(0, "PREPARE TRANSACTION ");
    queue_walk_moves();  // last before PREPARE: the walk's rows are locked only from here
    const char* const ending[] = {prepare.c_str()};
    ResultPtr r;
    // A connection lost here leaves it unknown whether the transaction was
    // prepared: recovery finds it (list_prepared) if it was.
    Status s = run_pipelined(nullptr, nullptr, r, op, OnUnique::fatal, ending);
    scope_ = Scope::none;
    begin_unsent_ = false;
    queued_.clear();
    kept_.clear();
    kept_index_.clear();
    if (!s) rollback();  // a failed PREPARE has rolled back; a dead pipeline may not have
    return s;
  }

  // COMMIT / ROLLBACK PREPARED cannot run in a transaction: outside a scope.
  Status finish_prepared(std::string_view gid, bool commit) override {
    const std::string op = commit ? "commit prepared" : "roll back prepared";
    if (scope_ != Scope::none) return fatal(op + ": not possible inside a batch transaction");
    if (Status s = check_gid(gid, op); !s) return s;
    if (Status s = guard_reentry(op); !s) return s;
    if (Status s = ensure_connected(); !s) return s;
    std::string sql;
    if (Status s = gid_literal(gid, op, sql); !s) return s;
    sql.insert(0, commit ? "COMMIT PREPARED " : "ROLLBACK PREPARED ");
    ResultPtr r(PQexec(conn_.get(), sql.c_str()));
    if (PQresultStatus(r.get()) == PGRES_COMMAND_OK) return Status::ok();
    const std::string_view state = pg::sqlstate_of(r.get());
    // 42704: no such prepared transaction (finished already, or never
    // prepared). 55000: another session is finishing it right now.
    if (state == "42704") return Status::ok();
    if (state == "55000") {
      return Status::retry_call("postgresql " + display_ + ": " + op + ": " +
                                pg::describe(r.get(), conn_.get()));
    }
    return failure(r.get(), op, OnUnique::fatal);
  }

  Status list_prepared(std::string_view prefix, std::int64_t min_age_ms,
                       std::vector<std::string>& gids) override {
    gids.clear();
    Params p;
    p.text(prefix);
    p.int64(min_age_ms);
    ResultPtr r;
    if (Status s = run(Sql::list_prepared, p, r, "list prepared"); !s) return s;
    for (int row = 0; row < PQntuples(r.get()); ++row) {
      gids.emplace_back(pg::value(r.get(), row, 0));
    }
    return Status::ok();
  }

  Status prepared_stats(std::string_view prefix, PreparedStats& out) override {
    out = {};
    Params p;
    p.text(prefix);
    ResultPtr r;
    if (Status s = run(Sql::prepared_stats, p, r, "prepared stats"); !s) return s;
    if (PQntuples(r.get()) != 1 || !pg::parse_int(pg::value(r.get(), 0, 0), out.count) ||
        !pg::parse_int(pg::value(r.get(), 0, 1), out.oldest_ms)) {
      return fatal("prepared stats: unreadable row");
    }
    return Status::ok();
  }

  // Queued: executed with the scope's next statement waited for (the
  // worker's insert check), so before any other store prepares. A row
  // already there (an abort saga_decide recorded) fails the scope.
  Status record_decision(std::string_view gid) override {
    if (scope_ == Scope::none) {
      return fatal("record decision: runs only inside a batch transaction");
    }
    if (Status s = check_gid(gid, "record decision"); !s) return s;
    Params p;
    p.text(gid);
    return enqueue(Sql::record_decision, std::move(p), "record decision", OnUnique::retry);
  }

  Status decide(std::string_view gid, bool& committed) override {
    committed = false;
    if (scope_ != Scope::none) return fatal("decide: not possible inside a batch transaction");
    if (Status s = check_gid(gid, "decide"); !s) return s;
    Params p;
    p.text(gid);
    ResultPtr r;
    // A scope that recorded the gid and is still open is waited for; a lock
    // timeout is retry_call (failure).
    if (Status s = run(Sql::decide, p, r, "decide"); !s) return s;
    if (PQntuples(r.get()) != 1 || pg::is_null(r.get(), 0, 0)) {
      return fatal("decide: unexpected result");
    }
    committed = parse_bool(pg::value(r.get(), 0, 0));
    return Status::ok();
  }

  Status list_decisions(std::int64_t min_age_ms, std::size_t limit,
                        std::vector<std::string>& gids) override {
    gids.clear();
    if (limit == 0) return Status::ok();
    Params p;
    p.int64(min_age_ms);
    p.int64(clamp_limit(limit));
    ResultPtr r;
    if (Status s = run(Sql::list_decisions, p, r, "list decisions"); !s) return s;
    for (int row = 0; row < PQntuples(r.get()); ++row) {
      gids.emplace_back(pg::value(r.get(), row, 0));
    }
    return Status::ok();
  }

  Status forget_decisions(std::span<const std::string> gids) override {
    return in_chunks(gids.size(), [&](std::size_t b, std::size_t n) {
      if (n == 0) return Status::ok();
      ArrayLiteral a;
      for (const std::string& gid : gids.subspan(b, n)) a.text(gid);
      Params p;
      if (!add_array(p, std::move(a))) return nul_byte("forget decisions");
      if (scope_ == Scope::open) return enqueue(Sql::forget_decisions, std::move(p), "forget decisions");
      ResultPtr r;
      return run(Sql::forget_decisions, p, r, "forget decisions");
    });
  }

 private:
  enum class OnUnique : std::uint8_t { fatal, retry };

  // A prepared transaction's name: PostgreSQL takes less than 200 bytes.
  Status check_gid(std::string_view gid, const std::string& op) const {
    if (gid.empty() || gid.size() >= 200 || gid.find('\0') != std::string_view::npos) {
      return fatal(op + ": a transaction name must be 1 to 199 bytes, without NUL");
    }
    return Status::ok();
  }
  // `gid` as an SQL literal, quoted for this connection (needs one).
  Status gid_literal(std::string_view gid, const std::string& op, std::string& out) const {
    char* quoted = PQescapeLiteral(conn_.get(), gid.data(), gid.size());
    if (quoted == nullptr) {
      return fatal(op + ": cannot quote the transaction name: " + pg::describe(nullptr, conn_.get()));
    }
    out = quoted;
    PQfreemem(quoted);
    return Status::ok();
  }

  Status fatal(const std::string& message) const {
    return Status::fatal("postgresql " + display_ + ": " + message);
  }
  Status nul_byte(const char* op) const {
    return fatal(std::string(op) +
                 ": a value holds a NUL byte, which PostgreSQL text cannot store");
  }
  Status check_results(std::size_t n, std::size_t results, const char* op) const {
    if (results < n) return fatal(std::string(op) + ": the results span is shorter than the batch");
    return Status::ok();
  }
  // Runs `chunk(begin, count)` over [0, n) in pieces of at most
  // kStatementMax records, in order, in one transaction: the scope's, or one
  // opened here (a scope, so a failure anywhere rolls back all of it). Later
  // pieces see the earlier ones' writes, so the result is the one-by-one
  // result of the whole call, as for one statement.
  template <typename Chunk>
  Status in_chunks(std::size_t n, Chunk&& chunk) {
    if (n <= kStatementMax) return chunk(0, n);
    const bool own = scope_ == Scope::none;
    if (own) {
      if (Status s = begin_scope(); !s) return s;
    }
    for (std::size_t b = 0; b < n; b += kStatementMax) {
      if (Status s = chunk(b, std::min(kStatementMax, n - b)); !s) {
        if (own) end_scope(false).ignore();
        return s;
      }
    }
    return own ? end_scope(true) : Status::ok();
  }
  Status check_rows(const PGresult* r, std::size_t n, const char* op) const {
    if (static_cast<std::size_t>(PQntuples(r)) != n) {
      return fatal(std::string(op) + ": " + std::to_string(PQntuples(r)) + " results for " +
                   std::to_string(n) + " records");
    }
    return Status::ok();
  }
  static bool add_array(Params& p, ArrayLiteral&& a) {
    if (!a.ok()) return false;
    p.owned(std::move(a).finish());
    return true;
  }

  // Runs `sql` and replaces `out` with its rows.
  template <typename T>
  Status fetch(Sql sql, Params& p, const char* op, std::vector<T>& out) {
    out.clear();
    ResultPtr r;
    if (Status s = run(sql, p, r, op); !s) return s;
    return read_rows(r.get(), out, op);
  }

  // fetch() of at most `limit` rows: the statement's last parameter.
  template <typename T>
  Status fetch_limited(Sql sql, Params& p, std::size_t limit, const char* op, std::vector<T>& out) {
    out.clear();
    if (limit == 0) return Status::ok();
    p.int64(clamp_limit(limit));
    return fetch(sql, p, op, out);
  }

  Status read_rows(const PGresult* r, std::vector<TransferDoc>& out, const char* op) const {
    const int n = PQntuples(r);
    out.reserve(out.size() + static_cast<std::size_t>(n));
    for (int row = 0; row < n; ++row) {
      if (!read_transfer(r, row, out.emplace_back())) {
        return fatal(std::string(op) + ": transfer " + out.back().id + " has an unreadable row");
      }
    }
    return Status::ok();
  }

  Status read_rows(const PGresult* r, std::vector<Posting>& out, const char* op) const {
    const int n = PQntuples(r);
    for (int row = 0; row < n; ++row) {
      if (!read_posting(r, row, out.emplace_back())) {
        return fatal(std::string(op) + ": unreadable posting row");
      }
    }
    return Status::ok();
  }

  // ---- connection ---------------------------------------------------------------

  Status connect() {
    // Defaults first, so the URL can override them; the encoding last, so it
    // cannot (every string we send and read is UTF-8).
    const char* const keys[] = {
        "connect_timeout", "keepalives_idle", "keepalives_interval",       "keepalives_count",
        "dbname",          "client_encoding", "fallback_application_name", nullptr};
    const char* const values[] = {"10",   "30",       "10",   "3", conninfo_.c_str(),
                                  "UTF8", "sagapool", nullptr};
    pg::ConnPtr c(PQconnectdbParams(keys, values, 1));
    if (!c) return fatal("cannot connect: out of memory");
    if (PQstatus(c.get()) != CONNECTION_OK) {
      const std::string error = pg::describe(nullptr, c.get());
      backoff_ = backoff_.count() == 0 ? kBackoffFirst : std::min(backoff_ * 2, kBackoffMax);
      next_connect_at_ = Clock::now() + backoff_;
      last_connect_error_ = error;
      const std::string message = "postgresql " + display_ + ": cannot connect: " + error;
      return permanent_connect_failure(c.get(), error) ? Status::fatal(message)
                                                       : Status::retry_stage(message);
    }
    PQsetNoticeReceiver(c.get(), &PgStore::on_notice, this);
    // Lock waits bounded unless the server's configuration bounds them itself
    // (0: none). No JIT: a batch's statements carry arrays of thousands of
    // ids, so their estimated cost passes jit_above_cost, and the server
    // compiled them anew on every call, 8-18 % of its CPU at full load, for
    // statements that run in milliseconds (docs/postgres.md, "Speed").
    // In the same round trip, max_prepared_transactions (fixed at the
    // server's start): whether scopes can be prepared (supports_prepare).
    ResultPtr r(PQexec(c.get(), ("SELECT set_config('lock_timeout', '" + std::string(kLockTimeout) +
                                 "', false) WHERE current_setting('lock_timeout') = '0'; "
                                 "SET jit = off; "
                                 "SELECT current_setting('max_prepared_transactions')")
                                    .c_str()));
    std::int64_t max_prepared = 0;
    if (PQresultStatus(r.get()) != PGRES_TUPLES_OK || PQntuples(r.get()) != 1 ||
        !pg::parse_int(pg::value(r.get(), 0, 0), max_prepared)) {
      return Status::retry_stage("postgresql " + display_ + ": cannot set the session's settings: " +
                                 pg::describe(r.get(), c.get()));
    }
    max_prepared_ = max_prepared;
    conn_ = std::move(c);
    prepared_.reset();
    backoff_ = std::chrono::milliseconds(0);
    return Status::ok();
  }

  // The start-up wait: connect_timeout seconds from now (libpq's own
  // minimum of 2 applies), nullopt for 0 or less (libpq: wait indefinitely).
  std::optional<Clock::time_point> open_deadline() const {
    std::int64_t seconds = kOpenWaitDefault.count();
    if (const std::optional<std::string> v = pg::conninfo_value(conninfo_, "connect_timeout")) {
      if (!pg::parse_int(*v, seconds)) seconds = kOpenWaitDefault.count();
    }
    if (seconds <= 0) return std::nullopt;
    return Clock::now() + std::chrono::seconds(std::max<std::int64_t>(seconds, 2));
  }

  // Wrong credentials or a missing database do not heal by retrying. libpq
  // gives no SQLSTATE for a failed connection, so this reads its message.
  static bool permanent_connect_failure(PGconn* c, std::string_view error) {
    if (PQconnectionNeedsPassword(c) != 0) return true;
    for (std::string_view phrase :
         {"password authentication failed", "does not exist", "no pg_hba.conf entry",
          "authentication failed", "invalid connection option", "invalid URI"}) {
      if (error.find(phrase) != std::string_view::npos) return true;
    }
    return false;
  }

  Status ensure_connected() {
    if (conn_ && PQstatus(conn_.get()) == CONNECTION_OK) return Status::ok();
    conn_.reset();
    if (const auto now = Clock::now(); now < next_connect_at_) {
      const auto wait =
          std::chrono::duration_cast<std::chrono::milliseconds>(next_connect_at_ - now);
      return Status::retry_stage("postgresql " + display_ + ": unavailable (" +
                                 last_connect_error_ + "); next reconnect attempt in " +
                                 std::to_string(wait.count()) + " ms");
    }
    return connect();
  }

  static void on_notice(void* arg, const PGresult* r) {
    const auto* self = static_cast<const PgStore*>(arg);
    const char* severity = PQresultErrorField(r, PG_DIAG_SEVERITY_NONLOCALIZED);
    // NOTICE and below ("relation already exists, skipping" from an idempotent
    // init) are expected chatter; warnings are worth an operator's look.
    if (severity == nullptr || std::string_view(severity) != "WARNING") return;
    spdlog::warn("postgresql {}: {}", self->display_, pg::describe(r, nullptr));
  }

  // Every failed statement goes through here: the one place SQLSTATEs become
  // ErrorKinds (pg::classify).
  Status failure(const PGresult* r, const std::string& op, OnUnique on_unique) {
    const bool bad = !conn_ || PQstatus(conn_.get()) == CONNECTION_BAD;
    const std::string_view state = pg::sqlstate_of(r);
    std::string message =
        "postgresql " + display_ + ": " + op + ": " + pg::describe(r, conn_.get());
    pg::Failure failure = pg::classify(state, bad, on_unique == OnUnique::retry);
    // A definition changed under the call: a lost connection, or fatal.
    if (failure == pg::Failure::definition_changed) {
      failure = replan_allowed(message) ? pg::Failure::connection : pg::Failure::fatal;
    }
    if (scope_ != Scope::none) return scope_failure(failure, std::move(message));
    switch (failure) {
      case pg::Failure::connection: {
        spdlog::warn("{}; reconnecting", message);
        conn_.reset();
        backoff_ = std::chrono::milliseconds(0);
        next_connect_at_ = Clock::time_point();
        Status s = connect();
        if (s.kind() == ErrorKind::fatal) return s;
        // The call's transaction was rolled back, or committed if the loss
        // came after COMMIT reached the server: either way repeating it is
        // safe, every write being conditional and idempotent.
        if (s) return Status::retry_call(message + " (reconnected)");
        return Status::retry_stage(message + "; " + s.message());
      }
      case pg::Failure::retry_call: return Status::retry_call(message);
      case pg::Failure::retry_stage: return Status::retry_stage(message);
      case pg::Failure::already_applied:
        // A concurrent writer applied the same record first; repeating the
        // call reports it per record (duplicate, already_posted, ...).
        return Status::retry_call(message);
      case pg::Failure::definition_changed:  // translated above; never here
      case pg::Failure::fatal:
        if (state == "42P01" || state == "42883") {
          message += " (is the schema initialised? run `sagactl init`)";
        }
        return Status::fatal(message);
    }
    return Status::fatal(message);
  }

  // An expand that changed a row type under a waiting call: reconnect and
  // run again, once a minute; more often it is no expand but a schema this
  // build does not match, and stays fatal.
  bool replan_allowed(std::string& message) {
    constexpr auto kOncePer = std::chrono::minutes(1);
    const auto now = Clock::now();
    if (definition_changed_at_ != Clock::time_point() && now - definition_changed_at_ < kOncePer) {
      message += " (again within a minute: not an expand's passing change)";
      return false;
    }
    definition_changed_at_ = now;
    message += " (a definition changed under the call, as an expand does: it runs again on a "
               "fresh connection)";
    return true;
  }

  // Inside a scope the whole transaction is gone with any failure: nothing
  // is retried or reconnected here, the scope is marked failed (every later
  // call fails at once) and the caller rolls back and runs the batch again.
  Status scope_failure(pg::Failure failure, std::string message) {
    scope_ = Scope::failed;
    switch (failure) {
      case pg::Failure::connection:
        conn_.reset();  // the next call outside the scope reconnects
        backoff_ = std::chrono::milliseconds(0);
        next_connect_at_ = Clock::time_point();
        return Status::retry_stage(message + " (inside a batch transaction: nothing of it was "
                                             "committed)");
      case pg::Failure::retry_call:
      case pg::Failure::retry_stage:
      case pg::Failure::already_applied:
        return Status::retry_stage(message + " (the batch transaction is rolled back)");
      case pg::Failure::definition_changed:  // failure() translates it first
      case pg::Failure::fatal:
        if (message.find("SQLSTATE 42P01") != std::string::npos ||
            message.find("SQLSTATE 42883") != std::string::npos) {
          message += " (is the schema initialised? run `sagactl init`)";
        }
        return Status::fatal(message);
    }
    return Status::fatal(message);
  }

  // Before every statement: not from inside a scan, and inside a scope only
  // on the scope's own, healthy transaction (a connection re-established
  // since BEGIN would run the statement on its own, outside the batch).
  Status guard_reentry(const std::string& op) {
    if (in_scan_) {
      return fatal(op + ": called from inside a scan callback; the connection is busy streaming");
    }
    if (scope_ == Scope::failed) {
      return Status::retry_stage("postgresql " + display_ + ": " + op +
                                 ": the batch transaction failed earlier; end it first");
    }
    if (scope_ == Scope::open &&
        (conn_ == nullptr || PQstatus(conn_.get()) != CONNECTION_OK ||
         PQtransactionStatus(conn_.get()) != (begin_unsent_ ? PQTRANS_IDLE : PQTRANS_INTRANS))) {
      scope_ = Scope::failed;
      return Status::retry_stage("postgresql " + display_ + ": " + op +
                                 ": the batch transaction was lost (connection or server)");
    }
    return Status::ok();
  }

  // Ends whatever transaction the connection is in; a dead link has none.
  void rollback() {
    if (conn_ == nullptr || PQstatus(conn_.get()) != CONNECTION_OK) return;
    if (PQtransactionStatus(conn_.get()) == PQTRANS_IDLE) return;
    ResultPtr r(PQexec(conn_.get(), "ROLLBACK"));
    if (PQresultStatus(r.get()) != PGRES_COMMAND_OK) {
      // Cannot tell what state the session is in: start afresh.
      spdlog::warn("postgresql {}: rollback failed ({}); reconnecting", display_,
                   pg::describe(r.get(), conn_.get()));
      conn_.reset();
    }
  }

  Status ensure_prepared(Sql sql) {
    const auto index = static_cast<std::size_t>(sql);
    if (prepared_.test(index)) return Status::ok();
    const pg::Statement& st = pg::statement(sql);
    ResultPtr r(PQprepare(conn_.get(), st.name, st.text, 0, nullptr));
    if (PQresultStatus(r.get()) != PGRES_COMMAND_OK) {
      return failure(r.get(), std::string("prepare ") + st.name, OnUnique::fatal);
    }
    prepared_.set(index);
    return Status::ok();
  }

  // One prepared statement, one round trip (plus one to prepare it, the first
  // time on a connection).
  Status run(Sql sql, Params& p, ResultPtr& out, const std::string& op,
             OnUnique on_unique = OnUnique::fatal) {
    if (Status s = guard_reentry(op); !s) return s;
    if (!p.ok()) return nul_byte(op.c_str());
    if (Status s = ensure_connected(); !s) return s;
    if (Status s = ensure_prepared(sql); !s) return s;
    if (!reads_no_balance(sql)) {
      if (Status s = queue_settle_apply(); !s) return s;
    }
    if (scope_ == Scope::open && (begin_unsent_ || !queued_.empty())) {
      return run_pipelined(&sql, &p, out, op, on_unique);
    }
    const pg::Statement& st = pg::statement(sql);
    ResultPtr r(PQexecPrepared(conn_.get(), st.name, p.count(), p.values(), nullptr, nullptr, 0));
    const ExecStatusType status = PQresultStatus(r.get());
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
      return failure(r.get(), op, on_unique);
    }
    out = std::move(r);
    return Status::ok();
  }

  // A deferred walk (settle_sagas) has written its journal rows but not yet
  // moved or locked its accounts: its lock pass goes ahead of any statement
  // that could read or lock them, or else with COMMIT (end_scope). These
  // touch only transfers or decisions (and the clock); every other
  // statement, and any unprepared one, is sent after the lock pass.
  static bool reads_no_balance(Sql sql) {
    return sql == Sql::insert_fresh || sql == Sql::transition || sql == Sql::mark_notified ||
           sql == Sql::now || sql == Sql::record_decision || sql == Sql::forget_decisions;
  }
  Status queue_settle_apply() {
    queue_walk_moves();
    if (!settle_deferred_) return Status::ok();
    if (Status s = ensure_prepared(Sql::settle_apply); !s) return s;  // fails the scope
    settle_deferred_ = false;
    queued_.push_back({Sql::settle_apply, Params{}, "apply settle", OnUnique::fatal});
    return Status::ok();
  }

  // Reads of the pending list inside a scope must see the entries the scope
  // keeps aside (saga_apply_legs): they move to saga_pending first.
  Status flush_scope_pending(const char* op) {
    if (scope_ == Scope::none) return Status::ok();
    scope_temp_ = true;
    return simple("SELECT saga_flush_scope_pending()", op);
  }

  // Inside a scope: a statement whose result nobody waits for, sent ahead of
  // the next one that is waited for (or with COMMIT or PREPARE).
  Status enqueue(Sql sql, Params&& p, const char* op, OnUnique on_unique = OnUnique::fatal) {
    if (Status s = guard_reentry(op); !s) return s;
    if (!p.ok()) return nul_byte(op);
    if (Status s = ensure_prepared(sql); !s) return s;
    if (!reads_no_balance(sql)) {
      if (Status s = queue_settle_apply(); !s) return s;
    }
    if (queued_.size() >= kQueuedMax) {  // bound: send what is queued now
      ResultPtr r;
      if (Status s = run_pipelined(nullptr, nullptr, r, op, OnUnique::fatal); !s) return s;
    }
    queued_.push_back({sql, std::move(p), op, on_unique});
    return Status::ok();
  }

  // One round trip in pipeline mode: BEGIN if not sent yet, the queued
  // statements, then `sql` (its result goes to `out`) or the statements of
  // `ending` (kCommit, or PREPARE TRANSACTION) or nothing. The first
  // failure is reported as that statement's own; the server skips the rest
  // (the transaction is dead anyway). Anything unexpected on the wire drops
  // the connection: the scope fails and the batch runs again.
  Status run_pipelined(const Sql* sql, Params* p, ResultPtr& out, const std::string& op,
                       OnUnique on_unique, std::span<const char* const> ending = {}) {
    PGconn* c = conn_.get();
    auto lost = [&](const char* what) {
      const std::string message = "postgresql " + display_ + ": " + op + ": pipeline " + what +
                                  ": " + pg::describe(nullptr, c);
      conn_.reset();
      queued_.clear();
      begin_unsent_ = false;
      return scope_failure(pg::Failure::connection, message);
    };
    if (PQenterPipelineMode(c) == 0) return lost("not entered");
    int sent = 0;
    bool ok = true;
    auto send_text = [&](const char* text) {
      ok = ok && PQsendQueryParams(c, text, 0, nullptr, nullptr, nullptr, nullptr, 0) != 0;
      ++sent;
    };
    const int prologue = begin_unsent_ ? 2 : 0;
    if (begin_unsent_) {
      send_text("BEGIN ISOLATION LEVEL READ COMMITTED");
      // saga.scope: saga_apply_legs keeps the pending entries it adds in
      // this transaction aside until saga_flush_scope_pending (sent with
      // COMMIT). The bounds of a batch transaction: see kBatchIdleTimeout.
      send_text(batch_settings_.c_str());
    }
    for (Queued& q : queued_) {
      if (!ok) break;
      const pg::Statement& st = pg::statement(q.sql);
      ok = PQsendQueryPrepared(c, st.name, q.params.count(), q.params.values(), nullptr, nullptr,
                               0) != 0;
      ++sent;
    }
    if (ok && sql != nullptr) {
      const pg::Statement& st = pg::statement(*sql);
      ok = PQsendQueryPrepared(c, st.name, p->count(), p->values(), nullptr, nullptr, 0) != 0;
      ++sent;
    } else {
      for (const char* text : ending) send_text(text);
    }
    if (!ok || PQpipelineSync(c) == 0) return lost("send failed");
    ResultPtr error;
    int error_at = -1;
    for (int k = 0; k < sent; ++k) {
      ResultPtr r{PQgetResult(c)};
      if (!r) return lost("ended early");
      const ExecStatusType status = PQresultStatus(r.get());
      if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
        if (!error && status != PGRES_PIPELINE_ABORTED) {  // aborted: skipped after the error
          error = std::move(r);
          error_at = k;
        }
      } else if (k == sent - 1 && sql != nullptr) {
        out = std::move(r);
      }
      // A NULL ends each statement's results.
      if (ResultPtr end{PQgetResult(c)}) return lost("out of step");
    }
    ResultPtr sync{PQgetResult(c)};
    if (!sync || PQresultStatus(sync.get()) != PGRES_PIPELINE_SYNC) return lost("out of step");
    if (PQexitPipelineMode(c) == 0) return lost("not left");
    std::string failed_op = op;
    OnUnique failed_unique = error_at == sent - 1 && sql != nullptr ? on_unique : OnUnique::fatal;
    if (error_at >= prologue && error_at - prologue < static_cast<int>(queued_.size())) {
      const Queued& q = queued_[static_cast<std::size_t>(error_at - prologue)];
      failed_op = q.op;
      failed_unique = q.on_unique;
    } else if (error_at >= 0 && error_at < prologue) {
      failed_op = "begin scope";
    }
    begin_unsent_ = false;
    queued_.clear();
    if (error) return failure(error.get(), failed_op, failed_unique);
    return Status::ok();
  }

  // Inside a scope, what is not sent yet (BEGIN, queued statements) goes
  // ahead of a statement that does not ride in a pipeline.
  Status send_unsent(const std::string& op) {
    if (Status s = queue_settle_apply(); !s) return s;  // its statement may read anything
    if (scope_ != Scope::open || (!begin_unsent_ && queued_.empty())) return Status::ok();
    ResultPtr none;
    return run_pipelined(nullptr, nullptr, none, op, OnUnique::fatal);
  }

  // An unprepared statement (schema management and probes).
  Status simple(const std::string& sql, const std::string& op, ResultPtr* out = nullptr) {
    if (Status s = guard_reentry(op); !s) return s;
    if (Status s = ensure_connected(); !s) return s;
    if (Status s = send_unsent(op); !s) return s;
    ResultPtr r(PQexec(conn_.get(), sql.c_str()));
    const ExecStatusType status = PQresultStatus(r.get());
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
      return failure(r.get(), op, OnUnique::fatal);
    }
    if (out != nullptr) *out = std::move(r);
    return Status::ok();
  }

  // scan() of a parameterless statement, each row read into one reused T.
  template <typename T, typename Read>
  Status scan_into(Sql sql, const std::string& op, Read read, const std::function<void(const T&)>& fn) {
    Params p;
    T value;
    return scan(sql, p, op, [&](const PGresult* r) {
      if (!read(r, 0, value)) return false;
      fn(value);
      return true;
    });
  }

  // Streams rows one at a time (single-row mode): one statement, one
  // snapshot, memory bounded by one row. `row` returns false on a row it
  // cannot read. The connection is busy until the last row, so `row` must
  // not call this store (guarded).
  Status scan(Sql sql, Params& p, const std::string& op,
              const std::function<bool(const PGresult*)>& row) {
    if (Status s = guard_reentry(op); !s) return s;
    if (Status s = ensure_connected(); !s) return s;
    if (Status s = send_unsent(op); !s) return s;
    if (Status s = ensure_prepared(sql); !s) return s;
    const pg::Statement& st = pg::statement(sql);
    if (PQsendQueryPrepared(conn_.get(), st.name, p.count(), p.values(), nullptr, nullptr, 0) ==
        0) {
      return failure(nullptr, op, OnUnique::fatal);
    }
    ResultPtr error;
    bool unreadable = false;
    {
      Streaming streaming(*this);
      if (PQsetSingleRowMode(conn_.get()) == 0) return fatal(op + ": cannot stream rows");
      while (ResultPtr r{PQgetResult(conn_.get())}) {
        const ExecStatusType status = PQresultStatus(r.get());
        if (status == PGRES_SINGLE_TUPLE) {
          if (!error && !unreadable && !row(r.get())) unreadable = true;
        } else if (status != PGRES_TUPLES_OK && !error) {
          error = std::move(r);  // keep draining: the connection must go idle first
        }
      }
    }
    if (error) return failure(error.get(), op, OnUnique::fatal);
    if (unreadable) return fatal(op + ": unreadable row");
    return Status::ok();
  }

  // Marks the connection busy while a scan streams, and drains what is left
  // if the callback throws, so the connection is usable again.
  class Streaming {
   public:
    explicit Streaming(PgStore& s) : s_(s) { s_.in_scan_ = true; }
    ~Streaming() {
      while (ResultPtr r{PQgetResult(s_.conn_.get())}) {
        // Rows left by an exception in the callback: dropped.
      }
      s_.in_scan_ = false;
    }
    Streaming(const Streaming&) = delete;
    Streaming& operator=(const Streaming&) = delete;

   private:
    PgStore& s_;
  };

  // An explicit transaction (init_schema): rolled back unless committed.
  class Transaction {
   public:
    explicit Transaction(PgStore& s) : s_(s) {}
    ~Transaction() {
      if (open_ && s_.conn_ && PQtransactionStatus(s_.conn_.get()) != PQTRANS_IDLE) {
        ResultPtr r(PQexec(s_.conn_.get(), "ROLLBACK"));  // best effort: a dead link rolls back too
      }
    }
    Transaction(const Transaction&) = delete;
    Transaction& operator=(const Transaction&) = delete;
    Status commit() {
      open_ = false;
      return s_.simple("COMMIT", "commit");
    }

   private:
    PgStore& s_;
    bool open_ = true;
  };

  // Ends a scope that commits: the pending entries it kept aside, then COMMIT.
  static constexpr const char* kCommit[] = {"SELECT saga_flush_scope_pending()", "COMMIT"};
  const std::string batch_settings_ =
      "SELECT set_config('saga.scope', 'on', true), "
      "set_config('idle_in_transaction_session_timeout', '" +
      std::string(kBatchIdleTimeout) + "', true), set_config('statement_timeout', '" +
      std::string(kBatchStatementTimeout) + "', true)";
  std::string conninfo_;  // holds the password, if any: never printed
  std::string display_;
  pg::ConnPtr conn_;
  std::bitset<pg::kSqlCount> prepared_;
  std::chrono::milliseconds backoff_{0};
  Clock::time_point next_connect_at_{};
  Clock::time_point definition_changed_at_{};  // the last replan_allowed
  std::string last_connect_error_;
  bool in_scan_ = false;
  enum class Scope : std::uint8_t { none, open, failed };
  Scope scope_ = Scope::none;
  bool begin_unsent_ = false;  // scope open, BEGIN not yet sent
  bool outbox_ = false;        // read_floor
  Clock::time_point next_floor_check_{};
  struct Queued {
    Sql sql;
    Params params;
    const char* op;
    OnUnique on_unique = OnUnique::fatal;
  };
  // A batch queues one or two (its outbox flags; a walk, its decision).
  static constexpr std::size_t kQueuedMax = 4;
  std::vector<Queued> queued_;
  // A walk of the open scope waits for its lock pass (saga_settle_apply).
  bool settle_deferred_ = false;
  std::vector<Params> walk_moves_;  // write_walk's, until PREPARE / COMMIT
  std::vector<std::uint32_t> move_order_;  // write_walk's moves by id
  // The open scope ran a call that uses the session's temporary tables
  // (saga_scope_pending, saga_scope_settle): it cannot be prepared.
  bool scope_temp_ = false;
  // The server's max_prepared_transactions, read on connecting (connect).
  std::int64_t max_prepared_ = 0;
  // A scope with a deferred walk did not commit (its walk may not have
  // stood): the next walk takes its locks at once.
  bool settle_at_once_ = false;
  // Transfers inserted in the open scope, not written yet (write_behind).
  struct KeptTransfer {
    std::string id, source, destination, currency, metadata, topic, owner;
    std::int64_t amount = 0, hash = 0, requested_at_ms = 0, partition = 0, offset = 0, lease_ms = 0,
                 created_at_ms = 0;
  };
  struct KeptWrite {
    std::size_t row;  // in kept_
    TransferState state;
    Reason reason;
    std::int64_t lease_ms;
  };
  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view v) const noexcept { return std::hash<std::string_view>{}(v); }
  };
  std::vector<KeptTransfer> kept_;  // in insert order
  std::unordered_map<std::string, std::size_t, StringHash, std::equal_to<>> kept_index_;  // unwritten
  std::vector<KeptWrite> kept_writes_;
  std::vector<std::uint8_t> kept_seen_;
};

}  // namespace

Status open_pg_store(std::string_view url, std::unique_ptr<Store>& out) {
  std::string conninfo(url);
  std::optional<std::string> display = pg::redacted_display_name(conninfo);
  if (!display) {
    return Status::fatal(
        "cannot parse the PostgreSQL store URL (a libpq URI or key=value list); it is not "
        "repeated here because it may hold a password");
  }
  auto store = std::make_unique<PgStore>(std::move(conninfo), std::move(*display));
  if (Status s = store->open(); !s) return s;
  out = std::move(store);
  return Status::ok();
}

}  // namespace sagapool
