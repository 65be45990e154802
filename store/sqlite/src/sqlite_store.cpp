// SQLite backend of the store interface: the embedded default.
//
// One connection per Store; WAL mode so readers never block the writer;
// every batch call is one BEGIN IMMEDIATE transaction (one fsync with
// synchronous=FULL), so a batch is atomic and applies its records in input
// order. The store's clock is this host's clock: every process sharing the
// file runs on the same host.
#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <tuple>
#include <unordered_set>

#include "embedded_sql.hpp"
#include "own_outbox.hpp"
#include "scope_table.hpp"
#include "sagapool/sqlite_store.hpp"
#include "sqlite_util.hpp"

namespace sagapool {
namespace {

// The schema (sql/schema.sql, sql/migrations/) and every statement
// (sql/statements.sql), embedded at build time.
const NamedSql& sql_file() {
  static const NamedSql file{sqlite_embedded::sql_statements};
  return file;
}

std::int64_t wall_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// From this floor on, a batch lists its finished transfers in the outbox
// (sql/schema.sql); below it, builds of version 6 may share the file, and
// they read only the flags.
constexpr int kOutboxFloor = 7;
// How often a store below that floor reads it again, so that running
// workers switch over after `sagactl migrate --contract`.
constexpr std::int64_t kFloorRecheckMs = 10'000;

// `ids` as a JSON array of strings.
void write_json_array(std::string& out, std::span<const std::string_view> ids) {
  out.assign(1, '[');
  for (std::string_view id : ids) {
    if (out.size() > 1) out += ',';
    out += '"';
    for (const char c : id) {
      if (c == '"' || c == '\\') {
        out += '\\';
        out += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        constexpr char kHex[] = "0123456789abcdef";
        out += "\\u00";
        out += kHex[(c >> 4) & 0xf];
        out += kHex[c & 0xf];
      } else {
        out += c;
      }
    }
    out += '"';
  }
  out += ']';
}

std::string_view leg_kind_name(LegOp op) {
  return op == LegOp::debit || op == LegOp::cancel_debit ? "debit" : "credit";
}

class SqliteStore final : public Store {
 public:
  SqliteStore(std::string path, SqlitePtr db) : name_("sqlite:" + path), db_(std::move(db)) {}

  const std::string& display_name() const noexcept override { return name_; }

  // No memory map and a 32 MiB page cache: a mapped 1 GiB file counted up to
  // 455 MiB of a worker's RSS in a 1,000,000-transfer run (634 MiB in all),
  // for no speed (17.4-18.1k transfers/s without it against 15.7-17.0k);
  // with two workers on one file each batch starts with a stale cache anyway.
  // The busy handler comes first: switching a file to WAL takes an exclusive
  // lock, and a second worker starting at the same moment would otherwise
  // fail at once.
  Status configure() {
    sqlite3_busy_handler(db_.get(), &SqliteStore::on_busy, const_cast<int*>(&kBusyLimitMs));
    for (const char* pragma : {"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL",
                               "PRAGMA foreign_keys=OFF", "PRAGMA temp_store=MEMORY",
                               "PRAGMA cache_size=-32768", "PRAGMA mmap_size=0",
                               "PRAGMA journal_size_limit=67108864"}) {
      if (Status s = exec(pragma); !s) return s;
    }
    sqlite3_wal_hook(db_.get(), &SqliteStore::on_wal_commit, this);  // replaces wal_autocheckpoint
    return Status::ok();
  }

  // SQLite's own autocheckpoint is PASSIVE: it copies what no reader still
  // needs, and the log starts over only if a writer finds it all copied with
  // no reader in it. Under back-to-back commits and any overlapping reads
  // (a scrape, an audit, a progress query) that never happens, and the log
  // grew past 7 GB in a 1,000,000-transfer run; every page not in it is then
  // looked for in each of its hash tables (14.2-14.8k transfers/s, against
  // 17.0-17.9k with the log bounded).
  // Past kRestartFrames a RESTART checkpoint also waits, at most
  // kRestartWaitMs with writers held, for the readers already in the log, so
  // that the next commit starts it over (cut to journal_size_limit).
  // A wait can time out with no reader slower than 50 ms: about 1 in 25
  // under CPU and fsync load here. So one that times out is tried again
  // after 32 MiB more, then 64, then every 128 MiB: a reader that holds
  // the log for long costs a wait per 128 MiB, a passing one 32 MiB.
  static constexpr int kCheckpointFrames = 8192;  // 32 MiB: SQLite's default x 8
  static constexpr int kRestartFrames = 32768;    // 128 MiB
  static constexpr int kRestartWaitMs = 250;

  static int on_wal_commit(void* self, sqlite3* db, const char* schema, int frames) {
    auto& store = *static_cast<SqliteStore*>(self);
    if (frames < kCheckpointFrames) {
      store.restart_at_frames_ = kRestartFrames;
      store.restart_retry_frames_ = kCheckpointFrames;
      return SQLITE_OK;
    }
    if (frames < store.restart_at_frames_) {
      sqlite3_wal_checkpoint_v2(db, schema, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
      return SQLITE_OK;
    }
    sqlite3_busy_handler(db, &SqliteStore::on_busy, const_cast<int*>(&kRestartWaitMs));
    const int rc = sqlite3_wal_checkpoint_v2(db, schema, SQLITE_CHECKPOINT_RESTART, nullptr, nullptr);
    sqlite3_busy_handler(db, &SqliteStore::on_busy, const_cast<int*>(&kBusyLimitMs));
    if (rc == SQLITE_OK) {
      store.restart_at_frames_ = kRestartFrames;
      store.restart_retry_frames_ = kCheckpointFrames;
    } else {
      store.restart_at_frames_ = frames + store.restart_retry_frames_;
      store.restart_retry_frames_ = std::min(2 * store.restart_retry_frames_, kRestartFrames);
    }
    return SQLITE_OK;  // a checkpoint that could not finish is no error of the commit
  }

  // Several worker processes share the file. SQLite's default busy handler
  // sleeps for milliseconds, far longer than a batch holds the write lock;
  // wait in short steps instead, for at most `limit_ms` in all (kBusyLimitMs,
  // or kRestartWaitMs while a RESTART checkpoint waits for readers).
  static constexpr int kBusyLimitMs = 10'000;
  static int on_busy(void* limit_ms, int count) {
    constexpr int kStepUs = 200;
    if (count * kStepUs / 1000 >= *static_cast<const int*>(limit_ms)) return 0;
    std::this_thread::sleep_for(std::chrono::microseconds(count < 20 ? 20 : kStepUs));
    return 1;
  }

  // Version 3's expand step (the workers table) is in schema.sql, with
  // nothing for its contract step to drop. Version 4's (the posting chain) is
  // in migrations/: the columns on init, the links and the index's drop on
  // contract.
  Status init_schema() override { return migrate(false); }
  Status contract_schema() override { return migrate(true); }

  // See Store::init_schema and Store::contract_schema.
  Status migrate(bool contract) {
    Tx tx(*this);
    if (Status s = tx.begin(); !s) return s;
    int floor = 0, expanded = 0;
    if (Status s = read_versions(floor, expanded); !s) return s;
    if (floor > kSchemaVersion || expanded > kSchemaVersion) {
      return Status::fatal(name_ + " has schema version " + std::to_string(std::max(floor, expanded)) +
                           ", newer than this program knows (" + std::to_string(kSchemaVersion) + ")");
    }
    const bool fresh = floor == 0;
    if (contract) {
      if (fresh || expanded < kSchemaVersion) {
        return Status::fatal(name_ + " is not at schema version " + std::to_string(kSchemaVersion) +
                             " yet; run `sagactl init` first");
      }
      if (Status s = link_postings(); !s) return s;
      floor = kSchemaVersion;
    } else {
      if (Status s = exec(std::string(sqlite_embedded::sql_schema)); !s) return s;
      bool upgraded = false;
      if (Status s = upgrade_to_reservation(upgraded); !s) return s;
      if (upgraded) floor = 2;  // version 2 is one step: version-1 writers break on it
      if (Status s = expand_posting_chain(); !s) return s;
      if (fresh) floor = kSchemaVersion;
    }
    Stmt* st = nullptr;
    if (Status s = prepare("write_meta", st); !s) return s;
    for (const auto& [key, value] : {std::pair{"schema_version", floor},
                                     std::pair{"schema_expanded", int{kSchemaVersion}}}) {
      bind_arg(st, 1, std::string_view(key));
      bind_arg(st, 2, std::to_string(value));
      if (Status s = step_done(st, "write schema version"); !s) return s;
    }
    return tx.commit();
  }

  // 0, 0 on a store never initialised; expanded = floor on one from before
  // version 3.
  Status read_versions(int& floor, int& expanded) {
    floor = expanded = 0;
    if (Status s = has_table("meta", out_bool_); !s || !out_bool_) return s;
    Stmt* st = nullptr;
    if (Status s = prepare("read_meta", st); !s) return s;
    bool has_expanded = false;
    for (;;) {
      const int rc = sqlite3_step(st->get());
      if (rc == SQLITE_DONE) break;
      if (rc != SQLITE_ROW) return error(rc, "read schema version");
      const std::string key = column_text(st->get(), 0);
      if (key == "schema_version") floor = sqlite3_column_int(st->get(), 1);
      if (key == "schema_expanded") expanded = sqlite3_column_int(st->get(), 1), has_expanded = true;
    }
    sqlite3_reset(st->get());
    if (!has_expanded) expanded = floor;
    return Status::ok();
  }

  // A store made by schema version 1 has no reservation columns: version 2's
  // migration adds and fills them. Checked first, so a second `init` changes
  // nothing.
  Status upgrade_to_reservation(bool& upgraded) {
    upgraded = false;
    if (Status s = schema_has("has_reserved_column", nullptr, out_bool_); !s || out_bool_) return s;
    upgraded = true;
    return exec(std::string(sqlite_embedded::sql_migrations_0002_reservation));
  }

  // Version 4's expand step, on a store whose accounts have no chain head.
  Status expand_posting_chain() {
    if (Status s = schema_has("has_chain_columns", nullptr, out_bool_); !s || out_bool_) return s;
    return exec(std::string(sqlite_embedded::sql_migrations_0004_posting_chain));
  }

  // Version 4's contract step, on a store that still has postings_account
  // (one made before version 4); a store made at 4 never had it.
  Status link_postings() {
    if (Status s = has_index("postings_account", out_bool_); !s || !out_bool_) return s;
    return exec(std::string(sqlite_embedded::sql_migrations_0004_contract));
  }

  Status read_topology(std::optional<Topology>& out) override {
    out.reset();
    if (Status s = has_table("meta", out_bool_); !s) return s;
    if (!out_bool_) return Status::ok();
    Stmt* st = nullptr;
    if (Status s = prepare("read_meta", st); !s) return s;
    Topology t;
    int found = 0;
    bool expanded = false;
    for (;;) {
      const int rc = sqlite3_step(st->get());
      if (rc == SQLITE_DONE) break;
      if (rc != SQLITE_ROW) return error(rc, "read topology");
      const std::string key = column_text(st->get(), 0);
      const std::string value = column_text(st->get(), 1);
      const int number = sqlite3_column_int(st->get(), 1);
      if (key == "ledger_id") t.ledger_id = value, ++found;
      else if (key == "shard_index") t.shard_index = number, ++found;
      else if (key == "shard_count") t.shard_count = number, ++found;
      else if (key == "schema_version") t.schema_version = number;
      else if (key == "schema_expanded") t.schema_expanded = number, expanded = true;
    }
    sqlite3_reset(st->get());
    if (!expanded) t.schema_expanded = t.schema_version;  // a store from before version 3
    if (found == 3) out = t;
    return Status::ok();
  }

  Status write_topology(const Topology& t) override {
    Tx tx(*this);
    if (Status s = tx.begin(); !s) return s;
    Stmt* st = nullptr;
    if (Status s = prepare("write_meta", st); !s) return s;
    const std::pair<const char*, std::string> rows[] = {
        {"ledger_id", t.ledger_id},
        {"shard_index", std::to_string(t.shard_index)},
        {"shard_count", std::to_string(t.shard_count)}};
    for (const auto& [k, v] : rows) {
      bind_arg(st, 1, k);
      bind_arg(st, 2, v);
      if (Status s = step_done(st, "write topology"); !s) return s;
    }
    return tx.commit();
  }

  bool supports_scope() const noexcept override { return true; }

  Status begin_scope() override {
    if (Status s = exec("BEGIN IMMEDIATE"); !s) return s;
    in_scope_ = true;
    // A floor that cannot be read leaves the outbox off until the next try:
    // the batch itself goes on.
    if (const std::int64_t now = wall_now_ms(); !outbox_ && now >= next_floor_check_ms_) {
      int floor = 0, expanded = 0;
      outbox_ = read_versions(floor, expanded).is_ok() && floor >= kOutboxFloor;
      next_floor_check_ms_ = now + kFloorRecheckMs;
    }
    return Status::ok();
  }

  Status end_scope(bool commit) override {
    Status s = commit ? write_behind() : Status::ok();
    in_scope_ = false;
    scope_accounts_.clear();
    scope_fresh_.clear();
    if (s && commit) s = exec("COMMIT");
    if (s && commit) {
      own_outbox_.commit();
      return s;
    }
    own_outbox_.rollback();
    if (!s) return s;  // the caller rolls back with end_scope(false)
    // SQLite may already have rolled back on some errors.
    if (sqlite3_get_autocommit(db_.get()) == 0) return exec("ROLLBACK");
    return Status::ok();
  }

  Status now_ms(std::int64_t& out) override {
    out = wall_now_ms();
    return Status::ok();
  }

  // ---- transfers ----------------------------------------------------------

  Status insert_transfers(std::span<const NewTransfer> batch, std::string_view owner,
                          std::int64_t lease_ms, std::span<InsertResult> results) override {
    Tx tx(*this);
    if (Status s = tx.begin(); !s) return s;
    Stmt* ins = nullptr;
    Stmt* get = nullptr;
    if (Status s = prepare("insert_transfer", ins); !s) return s;
    if (Status s = prepare("transfer_payload", get); !s) return s;
    const std::int64_t now = wall_now_ms();
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const NewTransfer& t = batch[i];
      const RequestView& r = t.request;
      if (in_scope_) {  // the row is written when the scope ends
        if (const FreshTransfer* kept = scope_fresh_.find(r.id)) {
          const FreshTransfer& f = *kept;
          results[i] = same_request(t, f.payload_hash, f.source, f.destination, f.amount,
                                    f.currency, f.metadata)
                           ? InsertResult::duplicate
                           : InsertResult::conflict;
          continue;
        }
        bind_arg(get, 1, r.id);
        const int rc = sqlite3_step(get->get());
        if (rc == SQLITE_ROW) {
          results[i] = same_stored_request(get->get(), t) ? InsertResult::duplicate : InsertResult::conflict;
        }
        sqlite3_reset(get->get());
        if (rc == SQLITE_ROW) continue;
        if (rc != SQLITE_DONE) return error(rc, "read transfer");
        scope_fresh_.insert(r.id).reset(t, owner, now, lease_ms);
        results[i] = InsertResult::inserted;
        continue;
      }
      bind_arg(ins, 1, r.id);
      bind_arg(ins, 2, r.from);
      bind_arg(ins, 3, r.to);
      bind_arg(ins, 4, r.amount);
      bind_arg(ins, 5, r.currency);
      bind_arg(ins, 6, r.metadata);
      bind_arg(ins, 7, static_cast<std::int64_t>(t.payload_hash));
      bind_arg(ins, 8, owner);
      bind_arg(ins, 9, now + lease_ms);
      bind_arg(ins, 10, now);
      bind_arg(ins, 11, t.requested_at_ms);
      bind_arg(ins, 12, t.origin_topic);
      bind_arg(ins, 13, static_cast<std::int64_t>(t.origin_partition));
      bind_arg(ins, 14, t.origin_offset);
      if (Status s = step_done(ins, "insert transfer"); !s) return s;
      if (sqlite3_changes(db_.get()) == 1) {
        results[i] = InsertResult::inserted;
        continue;
      }
      bind_arg(get, 1, r.id);
      if (sqlite3_step(get->get()) != SQLITE_ROW) {
        sqlite3_reset(get->get());
        return Status::fatal("transfer " + std::string(r.id) + " vanished during insert");
      }
      const bool same = same_stored_request(get->get(), t);
      sqlite3_reset(get->get());
      results[i] = same ? InsertResult::duplicate : InsertResult::conflict;
    }
    return tx.commit();
  }

  static bool same_request(const NewTransfer& t, std::int64_t payload_hash, std::string_view from,
                           std::string_view to, std::int64_t amount, std::string_view currency,
                           std::string_view metadata) {
    const RequestView& r = t.request;
    return static_cast<std::uint64_t>(payload_hash) == t.payload_hash && from == r.from &&
           to == r.to && amount == r.amount && currency == r.currency && metadata == r.metadata;
  }
  // `g` is on a row of "SELECT payload_hash, source, destination, amount,
  // currency, metadata".
  static bool same_stored_request(sqlite3_stmt* g, const NewTransfer& t) {
    return same_request(t, sqlite3_column_int64(g, 0), column_view(g, 1), column_view(g, 2),
                        sqlite3_column_int64(g, 3), column_view(g, 4), column_view(g, 5));
  }

  Status transition(std::span<const Transition> batch, std::int64_t lease_ms,
                    std::span<std::uint8_t> applied, std::int64_t* at_ms) override {
    Tx tx(*this);
    if (Status s = tx.begin(); !s) return s;
    Stmt* st = nullptr;
    if (Status s = prepare("transition", st); !s) return s;
    const std::int64_t now = wall_now_ms();
    if (at_ms != nullptr) *at_ms = now;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const Transition& t = batch[i];
      if (FreshTransfer* f = fresh(t.id)) {
        const bool ok = f->state == t.from && f->owner == t.owner && f->epoch == t.epoch;
        applied[i] = static_cast<std::uint8_t>(ok);
        if (ok) {
          f->state = t.to;
          f->reason = t.reason;
          f->last_modified = now;
          f->lease_until = now + lease_ms;
          if (is_terminal(t.to)) f->finished_at = now;
        }
        continue;
      }
      bind_arg(st, 1, to_string(t.to));
      bind_arg(st, 2, to_string(t.reason));
      bind_arg(st, 3, now);
      bind_arg(st, 4, now + lease_ms);
      bind_arg(st, 5, t.id);
      bind_arg(st, 6, to_string(t.from));
      bind_arg(st, 7, static_cast<std::int64_t>(is_terminal(t.to)));
      bind_arg(st, 8, t.owner);
      bind_arg(st, 9, t.epoch);
      if (Status s = step_done(st, "transition"); !s) return s;
      applied[i] = static_cast<std::uint8_t>(sqlite3_changes(db_.get()) == 1);
    }
    return tx.commit();
  }

  Status claim_expired(std::string_view owner, std::int64_t lease_ms, std::size_t limit,
                       std::vector<TransferDoc>& out) override {
    if (Status s = write_behind(); !s) return s;
    out.clear();
    Tx tx(*this);
    if (Status s = tx.begin(); !s) return s;
    const std::int64_t now = wall_now_ms();
    if (Status s = release_expired_outbox(now); !s) return s;
    Stmt* st = nullptr;
    if (Status s = prepare("claim_expired", st); !s) return s;
    bind_arg(st, 1, owner);
    bind_arg(st, 2, now);
    bind_arg(st, 3, lease_ms);
    bind_arg(st, 4, static_cast<std::int64_t>(limit));
    if (Status s = read_docs(st, out, "claim expired"); !s) return s;
    return tx.commit();
  }

  // Outbox rows whose lease ended (their worker stopped before Kafka
  // confirmed the outcomes) become per-row flags again, unpublished under
  // that lease, for the claim that follows.
  Status release_expired_outbox(std::int64_t now) {
    Stmt* st = nullptr;
    if (Status s = prepare("expired_outbox", st); !s) return s;
    bind_arg(st, 1, now);
    expired_.clear();
    for (;;) {
      const int rc = sqlite3_step(st->get());
      if (rc == SQLITE_DONE) break;
      if (rc != SQLITE_ROW) return error(rc, "read outbox");
      expired_.emplace_back(sqlite3_column_int64(st->get(), 0), sqlite3_column_int64(st->get(), 1));
    }
    sqlite3_reset(st->get());
    for (const auto& [seq, lease_until] : expired_) {
      if (Status s = prepare("release_outbox", st); !s) return s;
      bind_arg(st, 1, seq);
      bind_arg(st, 2, lease_until);
      if (Status s = step_done(st, "release outbox"); !s) return s;
      if (Status s = prepare("delete_outbox", st); !s) return s;
      bind_arg(st, 1, seq);
      if (Status s = step_done(st, "delete outbox"); !s) return s;
    }
    return Status::ok();
  }

  Status take_over(std::string_view id, std::string_view owner, std::int64_t lease_ms,
                   std::optional<TransferDoc>& out) override {
    if (Status s = write_behind(); !s) return s;
    out.reset();
    Tx tx(*this);
    if (Status s = tx.begin(); !s) return s;
    Stmt* st = nullptr;
    if (Status s = prepare("take_over", st); !s) return s;
    bind_arg(st, 1, owner);
    bind_arg(st, 2, wall_now_ms() + lease_ms);
    bind_arg(st, 3, id);
    std::vector<TransferDoc> docs;
    if (Status s = read_docs(st, docs, "take over"); !s) return s;
    if (!docs.empty()) {
      out = std::move(docs.front());
    } else if (Status s = load_transfer(id, out); !s) {  // finished (or missing): as it is
      return s;
    }
    return tx.commit();
  }

  Status mark_notified(std::span<const std::string_view> ids) override {
    if (Status s = write_behind(); !s) return s;
    if (ids.empty()) return Status::ok();
    Tx tx(*this);
    if (Status s = tx.begin(); !s) return s;
    Stmt* st = nullptr;
    if (Status s = prepare("mark_notified", st); !s) return s;
    for (std::string_view id : ids) {
      if (own_outbox_.deliver(id)) continue;
      bind_arg(st, 1, id);
      if (Status s = step_done(st, "mark notified"); !s) return s;
    }
    if (Status s = own_outbox_.write_touched([&](OwnOutbox::Row& row) { return write_outbox_row(row); });
        !s) {
      return s;
    }
    return tx.commit();
  }

  // What `row` lists now: rewritten, or deleted once it lists nothing. If
  // recovery released it meanwhile (this worker was paused past its lease),
  // its ids are flagged unpublished on their rows: the delivered ones are
  // flagged published again there.
  Status write_outbox_row(OwnOutbox::Row& row) {
    Stmt* st = nullptr;
    if (row.left == 0) {
      if (Status s = prepare("delete_outbox", st); !s) return s;
      bind_arg(st, 1, row.seq);
    } else {
      outbox_done_.clear();
      outbox_canceled_.clear();
      for (const auto& e : row.entries) {
        if (!e.delivered) (e.canceled ? outbox_canceled_ : outbox_done_).push_back(row.id(e));
      }
      write_json_array(json_done_, outbox_done_);
      write_json_array(json_canceled_, outbox_canceled_);
      if (Status s = prepare("rewrite_outbox", st); !s) return s;
      bind_arg(st, 1, row.seq);
      bind_arg(st, 2, std::string_view(json_done_));
      bind_arg(st, 3, std::string_view(json_canceled_));
    }
    if (Status s = step_done(st, "write outbox"); !s) return s;
    if (sqlite3_changes(db_.get()) == 1) return Status::ok();
    if (Status s = prepare("mark_notified", st); !s) return s;
    for (const auto& e : row.entries) {
      if (!e.delivered) continue;
      bind_arg(st, 1, row.id(e));
      if (Status s = step_done(st, "mark notified"); !s) return s;
    }
    row.left = 0;
    return Status::ok();
  }

  // The row and the outbox in one snapshot, as recovery may release the
  // outbox row in between.
  Status load_transfer(std::string_view id, std::optional<TransferDoc>& out) override {
    if (Status s = write_behind(); !s) return s;
    out.reset();
    Tx tx(*this, Tx::kRead);
    if (Status s = tx.begin(); !s) return s;
    Stmt* st = nullptr;
    if (Status s = prepare("load_transfer", st); !s) return s;
    bind_arg(st, 1, id);
    std::vector<TransferDoc> docs;
    if (Status s = read_docs(st, docs, "load transfer"); !s) return s;
    if (docs.empty()) return tx.commit();
    out = std::move(docs.front());
    if (!out->notified) return tx.commit();
    if (Status s = prepare("outbox_lists", st); !s) return s;  // then not published yet
    bind_arg(st, 1, id);
    const int rc = sqlite3_step(st->get());
    if (rc == SQLITE_ROW && sqlite3_column_int(st->get(), 0) != 0) out->notified = false;
    sqlite3_reset(st->get());
    if (rc != SQLITE_ROW) return error(rc, "read outbox");
    return tx.commit();
  }

  Status list_stale(std::int64_t before_ms, std::size_t limit,
                    std::vector<TransferDoc>& out) override {
    if (Status s = write_behind(); !s) return s;
    out.clear();
    Stmt* st = nullptr;
    if (Status s = prepare("list_stale", st); !s) return s;
    bind_arg(st, 1, before_ms);
    bind_arg(st, 2, static_cast<std::int64_t>(limit));
    return read_docs(st, out, "list stale");
  }

  Status state_stats(StateStatsTable& out) override {
    if (Status s = write_behind(); !s) return s;
    out = {};
    Stmt* st = nullptr;
    if (Status s = prepare("state_stats", st); !s) return s;
    bind_arg(st, 1, wall_now_ms());
    for (;;) {
      const int rc = sqlite3_step(st->get());
      if (rc == SQLITE_DONE) break;
      if (rc != SQLITE_ROW) return error(rc, "state stats");
      const auto state = parse_transfer_state(column_view(st->get(), 0));
      if (!state) continue;
      StateStats& s = out[static_cast<std::size_t>(*state)];
      s.count = sqlite3_column_int64(st->get(), 1);
      s.oldest_ms = sqlite3_column_int64(st->get(), 2);
      s.stuck = sqlite3_column_int64(st->get(), 3);
    }
    sqlite3_reset(st->get());
    return Status::ok();
  }

  Status scan_transfer_states(
      const std::function<void(std::string_view, TransferState, bool)>& fn) override {
    if (Status s = write_behind(); !s) return s;
    Tx tx(*this, Tx::kRead);  // the outbox and the rows in one snapshot
    if (Status s = tx.begin(); !s) return s;
    Stmt* st = nullptr;
    std::unordered_set<std::string, StringHash, std::equal_to<>> listed;  // in the outbox: unpublished
    if (Status s = prepare("outbox_ids", st); !s) return s;
    for (;;) {
      const int rc = sqlite3_step(st->get());
      if (rc == SQLITE_DONE) break;
      if (rc != SQLITE_ROW) return error(rc, "read outbox");
      listed.insert(column_text(st->get(), 0));
    }
    sqlite3_reset(st->get());
    if (Status s = prepare("scan_transfer_states", st); !s) return s;
    for (;;) {
      const int rc = sqlite3_step(st->get());
      if (rc == SQLITE_DONE) break;
      if (rc != SQLITE_ROW) return error(rc, "scan transfers");
      const auto state = parse_transfer_state(column_view(st->get(), 1));
      if (!state) {
        sqlite3_reset(st->get());
        return Status::fatal("transfer with unknown state: " + column_text(st->get(), 0));
      }
      const std::string_view id = column_view(st->get(), 0);
      fn(id, *state, sqlite3_column_int(st->get(), 2) != 0 && !listed.contains(id));
    }
    sqlite3_reset(st->get());
    return tx.commit();
  }

  // ---- accounts and legs --------------------------------------------------

  Status apply_legs(std::span<const LegRequest> batch, std::span<LegResult> results) override {
    Tx tx(*this);
    if (Status s = tx.begin(); !s) return s;
    Legs legs;
    if (Status s = prepare_legs(legs); !s) return s;
    const std::int64_t now = wall_now_ms();
    for (std::size_t i = 0; i < batch.size(); ++i) {
      if (batch[i].amount <= 0 && (batch[i].op == LegOp::debit || batch[i].op == LegOp::credit)) {
        return Status::fatal("leg of transfer " + std::string(batch[i].transfer_id) +
                             " has a non-positive amount");
      }
      if (Status s = apply_leg(legs, batch[i], now, results[i]); !s) return s;
    }
    return tx.commit();
  }

  Status create_accounts(std::span<const Account> accounts) override {
    if (Status s = write_behind(); !s) return s;
    scope_accounts_.clear();
    Tx tx(*this);
    if (Status s = tx.begin(); !s) return s;
    Stmt* st = nullptr;
    if (Status s = prepare("create_account", st); !s) return s;
    for (const Account& a : accounts) {
      bind_arg(st, 1, a.id);
      bind_arg(st, 2, a.balance);
      bind_arg(st, 3, a.min_balance);
      bind_arg(st, 4, a.currency);
      bind_arg(st, 5, static_cast<std::int64_t>(a.locked));
      if (Status s = step_done(st, "create account"); !s) return s;
      if (sqlite3_changes(db_.get()) != 1) {
        return Status::fatal("account " + a.id + " already exists; nothing was created");
      }
    }
    return tx.commit();
  }

  Status load_account(std::string_view id, std::optional<Account>& out) override {
    out.reset();
    if (Status s = write_behind(); !s) return s;
    return read_account(id, out);
  }

  Status read_account(std::string_view id, std::optional<Account>& out) {
    out.reset();
    Stmt* st = nullptr;
    if (Status s = prepare("load_account", st); !s) return s;
    bind_arg(st, 1, id);
    return scan_account_rows(st, [&](const Account& a) { out = a; });
  }

  Status load_accounts(std::span<const std::string_view> ids,
                       std::span<std::optional<Account>> out) override {
    Tx tx(*this, Tx::kRead);  // one read snapshot for the whole batch
    if (Status s = tx.begin(); !s) return s;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      out[i].reset();
      if (!in_scope_) {
        if (Status s = read_account(ids[i], out[i]); !s) return s;
        continue;
      }
      ScopeAccount* a = nullptr;
      if (Status s = scope_account(ids[i], a); !s) return s;
      if (a->exists) out[i] = a->row;
    }
    return tx.commit();
  }

  Status set_locked(std::string_view id, bool locked, bool& found) override {
    if (Status s = write_behind(); !s) return s;
    scope_accounts_.clear();
    Stmt* st = nullptr;
    if (Status s = prepare("set_locked", st); !s) return s;
    bind_arg(st, 1, static_cast<std::int64_t>(locked));
    bind_arg(st, 2, id);
    if (Status s = step_done(st, "set locked"); !s) return s;
    found = sqlite3_changes(db_.get()) == 1;
    return Status::ok();
  }

  Status postings_for_transfer(std::string_view transfer_id, std::vector<Posting>& out) override {
    out.clear();
    Stmt* st = nullptr;
    if (Status s = prepare("postings_for_transfer", st); !s) return s;
    bind_arg(st, 1, transfer_id);
    return scan_posting_rows(st, [&](const Posting& p) { out.push_back(p); });
  }

  Status postings_for_account(std::string_view account_id, std::size_t limit,
                              std::vector<Posting>& out) override {
    out.clear();
    if (Status s = write_behind(); !s) return s;
    // Until the contract links every posting, the chain may skip some.
    if (Status s = has_index("postings_account", out_bool_); !s) return s;
    Stmt* st = nullptr;
    if (Status s = prepare(out_bool_ ? "postings_for_account_by_time" : "postings_for_account", st);
        !s)
      return s;
    bind_arg(st, 1, account_id);
    bind_arg(st, 2, static_cast<std::int64_t>(limit));
    return scan_posting_rows(st, [&](const Posting& p) { out.push_back(p); });
  }

  Status pending_for_account(std::string_view account_id,
                             std::vector<std::string>& transfer_ids) override {
    transfer_ids.clear();
    if (Status s = write_behind(); !s) return s;
    Stmt* st = nullptr;
    if (Status s = prepare("pending_for_account", st); !s) return s;
    bind_arg(st, 1, account_id);
    for (;;) {
      const int rc = sqlite3_step(st->get());
      if (rc == SQLITE_DONE) break;
      if (rc != SQLITE_ROW) return error(rc, "pending for account");
      transfer_ids.push_back(column_text(st->get(), 0));
    }
    sqlite3_reset(st->get());
    return Status::ok();
  }

  // ---- the worker registry ---------------------------------------------------

  Status register_worker(const WorkerRecord& w) override {
    Stmt* st = nullptr;
    if (Status s = prepare("register_worker", st); !s) return s;
    bind_arg(st, 1, std::string_view(w.worker_id));
    bind_arg(st, 2, std::string_view(w.build_version));
    bind_arg(st, 3, std::string_view(w.git_revision));
    bind_arg(st, 4, static_cast<std::int64_t>(w.schema_version));
    bind_arg(st, 5, w.lease_ms);
    bind_arg(st, 6, wall_now_ms());
    return step_done(st, "register worker");
  }

  Status deregister_worker(std::string_view worker_id) override {
    Stmt* st = nullptr;
    if (Status s = prepare("deregister_worker", st); !s) return s;
    bind_arg(st, 1, worker_id);
    return step_done(st, "deregister worker");
  }

  Status list_workers(std::vector<WorkerRecord>& out) override {
    out.clear();
    Stmt* st = nullptr;
    if (Status s = prepare("list_workers", st); !s) return s;
    for (;;) {
      const int rc = sqlite3_step(st->get());
      if (rc == SQLITE_DONE) break;
      if (rc != SQLITE_ROW) return error(rc, "list workers");
      WorkerRecord& w = out.emplace_back();
      w.worker_id = column_text(st->get(), 0);
      w.build_version = column_text(st->get(), 1);
      w.git_revision = column_text(st->get(), 2);
      w.schema_version = sqlite3_column_int(st->get(), 3);
      w.lease_ms = sqlite3_column_int64(st->get(), 4);
      w.heartbeat_ms = sqlite3_column_int64(st->get(), 5);
    }
    sqlite3_reset(st->get());
    return Status::ok();
  }

  Status recent_owners(std::int64_t since_ms, std::vector<std::string>& out) override {
    out.clear();
    if (Status s = write_behind(); !s) return s;
    Stmt* st = nullptr;
    if (Status s = prepare("recent_owners", st); !s) return s;
    bind_arg(st, 1, since_ms);
    for (;;) {
      const int rc = sqlite3_step(st->get());
      if (rc == SQLITE_DONE) break;
      if (rc != SQLITE_ROW) return error(rc, "recent owners");
      out.push_back(column_text(st->get(), 0));
    }
    sqlite3_reset(st->get());
    return Status::ok();
  }

  Status scan_accounts(const std::function<void(const Account&)>& fn) override {
    if (Status s = write_behind(); !s) return s;
    Stmt* st = nullptr;
    if (Status s = prepare("scan_accounts", st); !s) return s;
    return scan_account_rows(st, fn);
  }

  Status scan_postings(const std::function<void(const Posting&)>& fn) override {
    Stmt* st = nullptr;
    if (Status s = prepare("scan_postings", st); !s) return s;
    return scan_posting_rows(st, fn);
  }

  Status scan_pending(const std::function<void(const PendingEntry&)>& fn) override {
    if (Status s = write_behind(); !s) return s;
    Stmt* st = nullptr;
    if (Status s = prepare("scan_pending", st); !s) return s;
    PendingEntry e;
    for (;;) {
      const int rc = sqlite3_step(st->get());
      if (rc == SQLITE_DONE) break;
      if (rc != SQLITE_ROW) return error(rc, "scan pending");
      e.account_id = column_text(st->get(), 0);
      e.transfer_id = column_text(st->get(), 1);
      fn(e);
    }
    sqlite3_reset(st->get());
    return Status::ok();
  }

 private:
  // Statements used by apply_legs, prepared once and cached.
  struct Legs {
    Stmt* probe;         // void?, posting?, account row
    Stmt* insert_posting;
    Stmt* set_balance;
    Stmt* add_pending;
    Stmt* drop_pending;  // returns what the entry reserved
    Stmt* unreserve;
    Stmt* insert_void;
    Stmt* has_posting;
  };

  Status prepare_legs(Legs& l) {
    const std::pair<Stmt**, const char*> stmts[] = {
        {&l.probe, "leg_probe"},         {&l.insert_posting, "insert_posting"},
        {&l.set_balance, "set_balance"}, {&l.add_pending, "add_pending"},
        {&l.drop_pending, "drop_pending"}, {&l.unreserve, "unreserve"},
        {&l.insert_void, "insert_void"}, {&l.has_posting, "posting_amount"},
    };
    for (const auto& [slot, name] : stmts) {
      if (Status s = prepare(name, *slot); !s) return s;
    }
    return Status::ok();
  }

  struct Probe {
    bool voided = false;
    bool posted = false;
    bool account_exists = false;
    std::int64_t balance = 0;
    std::int64_t min_balance = 0;
    bool locked = false;
    std::int64_t reserved = 0;
    std::string last_transfer, last_kind;  // the chain's head; out of a scope only
  };

  Status probe_leg(Legs& l, const LegRequest& req, PostingKind kind, Probe& p,
                   std::string& currency) {
    if (in_scope_) return probe_leg_in_scope(l, req, kind, p, currency);
    sqlite3_stmt* st = l.probe->get();
    bind_arg(l.probe, 1, req.transfer_id);
    bind_arg(l.probe, 2, req.account_id);
    bind_arg(l.probe, 3, to_string(kind));
    const int rc = sqlite3_step(st);
    if (rc != SQLITE_ROW) {
      sqlite3_reset(st);
      return error(rc, "probe leg");
    }
    p.voided = sqlite3_column_int(st, 0) != 0;
    p.posted = sqlite3_column_int(st, 1) != 0;
    p.account_exists = sqlite3_column_int(st, 2) != 0;
    p.balance = sqlite3_column_int64(st, 3);
    p.min_balance = sqlite3_column_int64(st, 4);
    currency.assign(column_view(st, 5));
    p.locked = sqlite3_column_int(st, 6) != 0;
    p.reserved = sqlite3_column_int64(st, 7);
    p.last_transfer.assign(column_view(st, 8));
    p.last_kind.assign(column_view(st, 9));
    sqlite3_reset(st);
    return Status::ok();
  }

  // The posting goes on its account's chain: it links to the head `p` read
  // (or the scope's), and becomes the head.
  Status post(Legs& l, const LegRequest& req, PostingKind kind, std::int64_t new_balance,
              std::int64_t now, bool pending, const Probe& p) {
    ScopeAccount* a = nullptr;
    if (in_scope_) {
      if (Status s = scope_account(req.account_id, a); !s) return s;
    }
    bind_arg(l.insert_posting, 1, req.transfer_id);
    bind_arg(l.insert_posting, 2, req.account_id);
    bind_arg(l.insert_posting, 3, to_string(kind));
    bind_arg(l.insert_posting, 4, req.amount);
    bind_arg(l.insert_posting, 5, now);
    bind_arg(l.insert_posting, 6, std::string_view(a ? a->last_transfer : p.last_transfer));
    bind_arg(l.insert_posting, 7, std::string_view(a ? a->last_kind : p.last_kind));
    if (Status s = step_done(l.insert_posting, "insert posting"); !s) return s;
    // A debit reserves its amount for its reversal; dropping the entry (the
    // reversal) gives back what the entry held.
    const std::int64_t reserve = kind == PostingKind::debit ? req.amount : 0;
    std::int64_t released = 0;
    if (a != nullptr) {
      a->row.balance = new_balance;
      a->last_transfer.assign(req.transfer_id);
      a->last_kind.assign(to_string(kind));
      a->dirty = true;
      if (FreshTransfer* f = fresh(req.transfer_id)) {
        f->marks |= mark_of(kind);
        if (pending) {
          a->row.reserved += hold(*f, req.account_id, reserve);
        } else {
          a->row.reserved -= release_mark(*f, req.account_id);
        }
        return Status::ok();
      }
      if (pending) {
        if (Status s = add_pending(l, req, reserve); !s) return s;
      } else if (Status s = drop_pending(l, req, released); !s) {
        return s;
      }
      a->row.reserved += reserve - released;
      return Status::ok();
    }
    if (pending) {
      if (Status s = add_pending(l, req, reserve); !s) return s;
    } else if (Status s = drop_pending(l, req, released); !s) {
      return s;
    }
    bind_arg(l.set_balance, 1, new_balance);
    bind_arg(l.set_balance, 2, req.account_id);
    bind_arg(l.set_balance, 3, reserve - released);
    bind_arg(l.set_balance, 4, req.transfer_id);
    bind_arg(l.set_balance, 5, to_string(kind));
    return step_done(l.set_balance, "update balance");
  }

  Status add_pending(Legs& l, const LegRequest& req, std::int64_t reserve) {
    bind_arg(l.add_pending, 1, req.account_id);
    bind_arg(l.add_pending, 2, req.transfer_id);
    bind_arg(l.add_pending, 3, reserve);
    return step_done(l.add_pending, "pending entry");
  }

  // Drops the entry; `released` := what it reserved (0 if it was not there).
  Status drop_pending(Legs& l, const LegRequest& req, std::int64_t& released) {
    bind_arg(l.drop_pending, 1, req.account_id);
    bind_arg(l.drop_pending, 2, req.transfer_id);
    const int rc = sqlite3_step(l.drop_pending->get());
    released = rc == SQLITE_ROW ? sqlite3_column_int64(l.drop_pending->get(), 0) : 0;
    sqlite3_reset(l.drop_pending->get());
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return error(rc, "drop pending entry");
    return Status::ok();
  }

  // A release: the entry and what it reserved go; idempotent, since only a
  // present entry gives anything back.
  Status release_entry(Legs& l, const LegRequest& req) {
    std::int64_t released = 0;
    if (FreshTransfer* f = fresh(req.transfer_id)) {
      released = release_mark(*f, req.account_id);
    } else if (Status s = drop_pending(l, req, released); !s) {
      return s;
    }
    if (released == 0) return Status::ok();
    if (in_scope_) {
      ScopeAccount* a = nullptr;
      if (Status s = scope_account(req.account_id, a); !s) return s;
      a->row.reserved -= released;
      a->dirty = true;
      return Status::ok();
    }
    bind_arg(l.unreserve, 1, released);
    bind_arg(l.unreserve, 2, req.account_id);
    return step_done(l.unreserve, "release reservation");
  }

  Status insert_void(Legs& l, const LegRequest& req) {
    if (FreshTransfer* f = fresh(req.transfer_id)) {
      f->marks |= req.op == LegOp::cancel_debit ? kDebitVoided : kCreditVoided;
    }
    bind_arg(l.insert_void, 1, req.transfer_id);
    bind_arg(l.insert_void, 2, req.account_id);
    bind_arg(l.insert_void, 3, leg_kind_name(req.op));
    return step_done(l.insert_void, "void leg");
  }

  Status apply_leg(Legs& l, const LegRequest& req, std::int64_t now, LegResult& out) {
    out.reason = Reason::none;
    out.account_currency.clear();
    Probe p;
    switch (req.op) {
      case LegOp::debit:
      case LegOp::credit: {
        const bool debit = req.op == LegOp::debit;
        if (Status s = probe_leg(l, req, debit ? PostingKind::debit : PostingKind::credit, p,
                                 out.account_currency);
            !s)
          return s;
        if (p.voided) return out.status = LegStatus::voided, Status::ok();
        if (p.posted) return out.status = LegStatus::already_posted, Status::ok();
        out.status = LegStatus::refused;
        if (!p.account_exists) return out.reason = Reason::unknown_account, Status::ok();
        if (p.locked) return out.reason = Reason::account_locked, Status::ok();
        if (!req.currency.empty() && !out.account_currency.empty() &&
            req.currency != out.account_currency) {
          return out.reason = Reason::currency_mismatch, Status::ok();
        }
        std::int64_t next = 0;
        std::int64_t room = 0;  // debit: reserved after; credit: balance + reserved after
        if (debit) {
          if (__builtin_sub_overflow(p.balance, req.amount, &next) || next < p.min_balance) {
            return out.reason = Reason::insufficient_funds, Status::ok();
          }
          if (__builtin_add_overflow(p.reserved, req.amount, &room)) {
            return out.reason = Reason::overflow, Status::ok();
          }
        } else if (__builtin_add_overflow(p.balance, req.amount, &next) ||
                   __builtin_add_overflow(next, p.reserved, &room)) {
          return out.reason = Reason::overflow, Status::ok();
        }
        if (Status s = post(l, req, debit ? PostingKind::debit : PostingKind::credit, next, now,
                            true, p);
            !s)
          return s;
        out.status = LegStatus::posted;
        return Status::ok();
      }
      case LegOp::cancel_debit: {
        if (Status s = probe_leg(l, req, PostingKind::debit, p, out.account_currency); !s) return s;
        if (!p.posted) {
          out.status = LegStatus::voided;
          return insert_void(l, req);
        }
        out.status = LegStatus::reversed;
        bool reversed = false;
        if (Status s = has_posting(l, req, PostingKind::reverse_debit, reversed); !s) return s;
        if (reversed) return Status::ok();
        // The debit's reservation keeps room for this; it can only be missing
        // if the entry was released first, which the engine never does.
        std::int64_t next = 0;
        if (__builtin_add_overflow(p.balance, req.amount, &next)) {
          return Status::fatal("reversing debit of transfer " + std::string(req.transfer_id) +
                               " would overflow account " + std::string(req.account_id));
        }
        return post(l, req, PostingKind::reverse_debit, next, now, false, p);
      }
      case LegOp::cancel_credit: {
        bool credited = false;
        if (Status s = has_posting(l, req, PostingKind::credit, credited); !s) return s;
        if (credited) return out.status = LegStatus::credit_posted, Status::ok();
        out.status = LegStatus::voided;
        return insert_void(l, req);
      }
      case LegOp::release: {
        out.status = LegStatus::released;
        return release_entry(l, req);
      }
    }
    return Status::fatal("unknown leg operation");
  }

  Status has_posting(Legs& l, const LegRequest& req, PostingKind kind, bool& found) {
    if (const FreshTransfer* f = fresh(req.transfer_id)) {
      found = (f->marks & mark_of(kind)) != 0;
      return Status::ok();
    }
    bind_arg(l.has_posting, 1, req.transfer_id);
    bind_arg(l.has_posting, 2, req.account_id);
    bind_arg(l.has_posting, 3, to_string(kind));
    const int rc = sqlite3_step(l.has_posting->get());
    sqlite3_reset(l.has_posting->get());
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return error(rc, "read posting");
    found = rc == SQLITE_ROW;
    return Status::ok();
  }

  Status read_docs(Stmt* st, std::vector<TransferDoc>& out, const char* what) {
    for (;;) {
      const int rc = sqlite3_step(st->get());
      if (rc == SQLITE_DONE) break;
      if (rc != SQLITE_ROW) return error(rc, what);
      sqlite3_stmt* s = st->get();
      TransferDoc& d = out.emplace_back();
      d.id = column_text(s, 0);
      d.source = column_text(s, 1);
      d.destination = column_text(s, 2);
      d.amount = sqlite3_column_int64(s, 3);
      d.currency = column_text(s, 4);
      d.metadata = column_text(s, 5);
      d.payload_hash = static_cast<std::uint64_t>(sqlite3_column_int64(s, 6));
      const auto state = parse_transfer_state(column_view(s, 7));
      const auto reason = parse_reason(column_view(s, 11));
      if (!state || !reason) {
        sqlite3_reset(s);
        return Status::fatal("transfer " + d.id + " has an unknown state or reason");
      }
      d.state = *state;
      d.owner = column_text(s, 8);
      d.epoch = sqlite3_column_int64(s, 9);
      d.lease_until_ms = sqlite3_column_int64(s, 10);
      d.reason = *reason;
      d.created_at_ms = sqlite3_column_int64(s, 12);
      d.last_modified_ms = sqlite3_column_int64(s, 13);
      d.requested_at_ms = sqlite3_column_int64(s, 14);
      d.finished_at_ms = sqlite3_column_int64(s, 15);
      d.attempts = sqlite3_column_int(s, 16);
      d.notified = sqlite3_column_int(s, 17) != 0;
      d.origin.topic = column_text(s, 18);
      d.origin.partition = sqlite3_column_int(s, 19);
      d.origin.offset = sqlite3_column_int64(s, 20);
    }
    sqlite3_reset(st->get());
    return Status::ok();
  }

  // The first seven columns of every account read (load_account,
  // scan_accounts), assigned in place so a reused Account keeps its
  // strings' capacity.
  static void read_account_columns(sqlite3_stmt* s, Account& a) {
    a.id.assign(column_view(s, 0));
    a.balance = sqlite3_column_int64(s, 1);
    a.opening_balance = sqlite3_column_int64(s, 2);
    a.min_balance = sqlite3_column_int64(s, 3);
    a.currency.assign(column_view(s, 4));
    a.locked = sqlite3_column_int(s, 5) != 0;
    a.reserved = sqlite3_column_int64(s, 6);
  }

  Status scan_account_rows(Stmt* st, const std::function<void(const Account&)>& fn) {
    Account a;
    for (;;) {
      const int rc = sqlite3_step(st->get());
      if (rc == SQLITE_DONE) break;
      if (rc != SQLITE_ROW) return error(rc, "read accounts");
      read_account_columns(st->get(), a);
      fn(a);
    }
    sqlite3_reset(st->get());
    return Status::ok();
  }

  Status scan_posting_rows(Stmt* st, const std::function<void(const Posting&)>& fn) {
    Posting p;
    for (;;) {
      const int rc = sqlite3_step(st->get());
      if (rc == SQLITE_DONE) break;
      if (rc != SQLITE_ROW) return error(rc, "read postings");
      sqlite3_stmt* s = st->get();
      const auto kind = parse_posting_kind(column_view(s, 2));
      if (!kind) {
        sqlite3_reset(s);
        return Status::fatal("posting with unknown kind for transfer " + column_text(s, 0));
      }
      p.transfer_id = column_text(s, 0);
      p.account_id = column_text(s, 1);
      p.kind = *kind;
      p.amount = sqlite3_column_int64(s, 3);
      p.at_ms = sqlite3_column_int64(s, 4);
      fn(p);
    }
    sqlite3_reset(st->get());
    return Status::ok();
  }

  Status has_table(const char* name, bool& out) { return schema_has("has_table", name, out); }
  Status has_index(const char* name, bool& out) { return schema_has("has_index", name, out); }
  // Whether the schema query `statement` (bound to `name`, if given) finds a row.
  Status schema_has(std::string_view statement, const char* name, bool& out) {
    Stmt* st = nullptr;
    if (Status s = prepare(statement, st); !s) return s;
    if (name != nullptr) bind_arg(st, 1, std::string_view(name));
    const int rc = sqlite3_step(st->get());
    sqlite3_reset(st->get());
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return error(rc, "read schema");
    out = rc == SQLITE_ROW;
    return Status::ok();
  }

  // A statement of sql/statements.sql by name, prepared once per connection.
  Status prepare(std::string_view name, Stmt*& out) {
    return statements_.get(db_.get(), name, sql_file(), out);
  }

  Status exec(const std::string& sql) {
    char* err = nullptr;
    const int rc = sqlite3_exec(db_.get(), sql.c_str(), nullptr, nullptr, &err);
    const std::string message = err ? err : "";
    sqlite3_free(err);
    if (rc != SQLITE_OK) return map_sqlite_error(rc, message + " (in: " + sql.substr(0, 60) + ")");
    return Status::ok();
  }

  Status step_done(Stmt* st, const char* what) {
    const int rc = sqlite3_step(st->get());
    sqlite3_reset(st->get());
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) return error(rc, what);
    return Status::ok();
  }

  Status error(int rc, const char* what) {
    return map_sqlite_error(rc, std::string(what) + ": " + sqlite3_errmsg(db_.get()));
  }

  // ---- write-behind inside a scope -----------------------------------------
  // A scope holds the write lock (BEGIN IMMEDIATE), so nobody else writes
  // until it ends: each account row is read once and written once per scope.
  // A transfer inserted in the scope (fresh) is kept here and its row written
  // once, in its last state, when the scope ends; it cannot have journal rows
  // from before, so its legs are known from marks kept here, and its pending
  // entries, mostly added and released in the same scope, are written only
  // if still held at the end. Postings are written as they happen. Any other
  // read or write of transfers first writes everything kept (write_behind).
  struct ScopeAccount {
    bool exists = false;
    bool dirty = false;
    Account row;
    std::string last_transfer, last_kind;  // the head of its postings' chain
  };
  static constexpr std::uint8_t kDebitPosted = 1, kCreditPosted = 2, kReversed = 4,
                                kDebitVoided = 8, kCreditVoided = 16, kSourcePending = 32,
                                kDestinationPending = 64;
  struct FreshTransfer {
    std::string source, destination, currency, metadata, owner, origin_topic;
    std::int64_t amount = 0, payload_hash = 0, epoch = 1, lease_until = 0, created_at = 0,
                 last_modified = 0, requested_at = 0, finished_at = 0, origin_offset = 0;
    std::int32_t origin_partition = 0;
    TransferState state = TransferState::initial;
    Reason reason = Reason::none;
    std::uint8_t marks = 0;
    std::int64_t held_source = 0, held_destination = 0;  // reserved by its pending marks

    // An entry reused from an earlier batch keeps only its strings'
    // capacity: every other field starts from its default, so a field added
    // later cannot carry one transfer's value into the next.
    void reset(const NewTransfer& t, std::string_view owner_id, std::int64_t now, std::int64_t lease_ms) {
      FreshTransfer blank;
      for (auto member : {&FreshTransfer::source, &FreshTransfer::destination, &FreshTransfer::currency,
                          &FreshTransfer::metadata, &FreshTransfer::owner, &FreshTransfer::origin_topic}) {
        std::swap(this->*member, blank.*member);
      }
      *this = std::move(blank);
      const RequestView& r = t.request;
      source.assign(r.from);
      destination.assign(r.to);
      currency.assign(r.currency);
      metadata.assign(r.metadata);
      owner.assign(owner_id);
      origin_topic.assign(t.origin_topic);
      amount = r.amount;
      payload_hash = static_cast<std::int64_t>(t.payload_hash);
      lease_until = now + lease_ms;
      created_at = last_modified = now;
      requested_at = t.requested_at_ms;
      origin_offset = t.origin_offset;
      origin_partition = t.origin_partition;
    }
  };

  static std::uint8_t mark_of(PostingKind kind) {
    switch (kind) {
      case PostingKind::debit: return kDebitPosted;
      case PostingKind::credit: return kCreditPosted;
      case PostingKind::reverse_debit: return kReversed;
    }
    return 0;
  }
  static std::uint8_t pending_mark(const FreshTransfer& f, std::string_view account) {
    if (account == f.source) return kSourcePending;
    if (account == f.destination) return kDestinationPending;
    return 0;
  }

  static std::int64_t* held(FreshTransfer& f, std::string_view account) {
    if (account == f.source) return &f.held_source;
    if (account == f.destination) return &f.held_destination;
    return nullptr;
  }

  // Marks the pending entry held; returns what it newly reserves (nothing
  // on an account that is neither end: no entry is kept there).
  static std::int64_t hold(FreshTransfer& f, std::string_view account, std::int64_t reserve) {
    std::int64_t* h = held(f, account);
    if (h == nullptr) return 0;
    f.marks |= pending_mark(f, account);
    *h += reserve;
    return reserve;
  }

  // Drops the pending mark; returns what it reserved.
  static std::int64_t release_mark(FreshTransfer& f, std::string_view account) {
    f.marks = static_cast<std::uint8_t>(f.marks & ~pending_mark(f, account));
    std::int64_t* h = held(f, account);
    if (h == nullptr) return 0;
    const std::int64_t released = *h;
    *h = 0;
    return released;
  }

  FreshTransfer* fresh(std::string_view transfer_id) {
    return in_scope_ ? scope_fresh_.find(transfer_id) : nullptr;
  }

  Status scope_account(std::string_view id, ScopeAccount*& out) {
    if ((out = scope_accounts_.find(id)) != nullptr) return Status::ok();
    Stmt* st = nullptr;
    if (Status s = prepare("load_account", st); !s) return s;
    bind_arg(st, 1, id);
    sqlite3_stmt* row = st->get();
    const int rc = sqlite3_step(row);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) {
      Status failed = error(rc, "read accounts");
      sqlite3_reset(row);
      return failed;
    }
    ScopeAccount& a = scope_accounts_.insert(id);
    out = &a;
    a.exists = rc == SQLITE_ROW;
    a.dirty = false;
    if (a.exists) {
      read_account_columns(row, a.row);
      a.last_transfer.assign(column_view(row, 7));
      a.last_kind.assign(column_view(row, 8));
    } else {
      a.row = Account{};
      a.last_transfer.clear();
      a.last_kind.clear();
    }
    sqlite3_reset(row);
    return Status::ok();
  }

  Status probe_leg_in_scope(Legs& l, const LegRequest& req, PostingKind kind, Probe& p,
                            std::string& currency) {
    if (const FreshTransfer* f = fresh(req.transfer_id)) {
      p.voided = (f->marks & (kind == PostingKind::debit ? kDebitVoided : kCreditVoided)) != 0;
      p.posted = (f->marks & mark_of(kind)) != 0;
    } else {
      bool posted = false;
      if (Status s = has_posting(l, req, kind, posted); !s) return s;
      p.posted = posted;
      bool voided = false;
      if (Status s = has_void(req, kind, voided); !s) return s;
      p.voided = voided;
    }
    ScopeAccount* a = nullptr;
    if (Status s = scope_account(req.account_id, a); !s) return s;
    p.account_exists = a->exists;
    p.balance = a->row.balance;
    p.min_balance = a->row.min_balance;
    p.locked = a->row.locked;
    p.reserved = a->row.reserved;
    currency.assign(a->row.currency);
    return Status::ok();
  }

  Status has_void(const LegRequest& req, PostingKind kind, bool& found) {
    Stmt* st = nullptr;
    if (Status s = prepare("leg_voided", st); !s) return s;
    bind_arg(st, 1, req.transfer_id);
    bind_arg(st, 2, req.account_id);
    bind_arg(st, 3, to_string(kind));
    const int rc = sqlite3_step(st->get());
    sqlite3_reset(st->get());
    if (rc != SQLITE_ROW && rc != SQLITE_DONE) return error(rc, "read leg void");
    found = rc == SQLITE_ROW;
    return Status::ok();
  }

  // Writes what the scope kept in memory: balances, and pending entries of
  // fresh transfers still held. Idempotent; a no-op outside a scope.
  Status write_behind() {
    if (!in_scope_) return Status::ok();
    Stmt* bal = nullptr;
    Stmt* pend = nullptr;
    if (Status s = prepare("write_account", bal); !s) return s;
    if (Status s = prepare("add_pending", pend); !s) return s;
    for (auto& [id, a] : scope_accounts_) {
      if (!a.dirty) continue;
      bind_arg(bal, 1, a.row.balance);
      bind_arg(bal, 2, id);
      bind_arg(bal, 3, a.row.reserved);
      bind_arg(bal, 4, std::string_view(a.last_transfer));
      bind_arg(bal, 5, std::string_view(a.last_kind));
      if (Status s = step_done(bal, "update balance"); !s) return s;
      a.dirty = false;
    }
    Stmt* row = nullptr;
    if (Status s = prepare("insert_fresh_transfer", row); !s) return s;
    outbox_done_.clear();
    outbox_canceled_.clear();
    std::int64_t outbox_lease = 0, outbox_finished = 0;
    for (auto& [id, f] : scope_fresh_) {
      const bool listed = outbox_ && is_terminal(f.state);
      if (listed) {
        (f.state == TransferState::done ? outbox_done_ : outbox_canceled_).push_back(id);
        outbox_lease = std::max(outbox_lease, f.lease_until);
        outbox_finished = outbox_finished == 0 ? f.finished_at : std::min(outbox_finished, f.finished_at);
      }
      bind_arg(row, 1, std::string_view(id));
      bind_arg(row, 2, std::string_view(f.source));
      bind_arg(row, 3, std::string_view(f.destination));
      bind_arg(row, 4, f.amount);
      bind_arg(row, 5, std::string_view(f.currency));
      bind_arg(row, 6, std::string_view(f.metadata));
      bind_arg(row, 7, f.payload_hash);
      bind_arg(row, 8, to_string(f.state));
      bind_arg(row, 9, std::string_view(f.owner));
      bind_arg(row, 10, f.epoch);
      bind_arg(row, 11, f.lease_until);
      bind_arg(row, 12, to_string(f.reason));
      bind_arg(row, 13, f.created_at);
      bind_arg(row, 14, f.last_modified);
      bind_arg(row, 15, f.requested_at);
      bind_arg(row, 16, f.finished_at);
      bind_arg(row, 17, std::string_view(f.origin_topic));
      bind_arg(row, 18, static_cast<std::int64_t>(f.origin_partition));
      bind_arg(row, 19, f.origin_offset);
      bind_arg(row, 20, static_cast<std::int64_t>(listed));
      if (Status s = step_done(row, "insert transfer"); !s) return s;
      for (const auto& [mark, account, reserve] :
           {std::tuple{kSourcePending, &f.source, f.held_source},
            std::tuple{kDestinationPending, &f.destination, f.held_destination}}) {
        if ((f.marks & mark) == 0) continue;
        bind_arg(pend, 1, std::string_view(*account));
        bind_arg(pend, 2, std::string_view(id));
        bind_arg(pend, 3, reserve);
        if (Status s = step_done(pend, "pending entry"); !s) return s;
      }
    }
    if (!outbox_done_.empty() || !outbox_canceled_.empty()) {
      if (Status s = insert_outbox(outbox_lease, outbox_finished); !s) return s;
    }
    // They are rows now: later transitions and releases must go to the table.
    scope_fresh_.clear();
    return Status::ok();
  }

  // One row listing outbox_done_ and outbox_canceled_, which this
  // connection remembers once the transaction commits.
  Status insert_outbox(std::int64_t lease_until, std::int64_t finished_at) {
    write_json_array(json_done_, outbox_done_);
    write_json_array(json_canceled_, outbox_canceled_);
    Stmt* st = nullptr;
    if (Status s = prepare("insert_outbox", st); !s) return s;
    bind_arg(st, 1, lease_until);
    bind_arg(st, 2, finished_at);
    bind_arg(st, 3, std::string_view(json_done_));
    bind_arg(st, 4, std::string_view(json_canceled_));
    if (Status s = step_done(st, "insert outbox"); !s) return s;
    own_outbox_.add_uncommitted(sqlite3_last_insert_rowid(db_.get()), outbox_done_, outbox_canceled_);
    return Status::ok();
  }

  // BEGIN IMMEDIATE takes the write lock up front, so two writers never
  // deadlock on a lock upgrade; rolled back unless committed.
  class Tx {
   public:
    static constexpr const char* kRead = "BEGIN";  // one snapshot, no write lock
    explicit Tx(SqliteStore& s, const char* begin = "BEGIN IMMEDIATE") : s_(s), begin_(begin) {}
    ~Tx() {
      if (open_) s_.exec("ROLLBACK").ignore();
    }
    Status begin() {
      // Inside a scope its transaction is used; a read inside another call's
      // transaction (take_over's of a finished transfer) uses that one.
      if (s_.in_scope_) return Status::ok();
      if (begin_ == kRead && sqlite3_get_autocommit(s_.db_.get()) == 0) return Status::ok();
      Status s = s_.exec(begin_);
      open_ = s.is_ok();
      return s;
    }
    Status commit() {
      if (!open_) return Status::ok();
      Status s = s_.exec("COMMIT");
      if (s) open_ = false;
      return s;
    }

   private:
    SqliteStore& s_;
    const char* begin_;
    bool open_ = false;
  };

  std::string name_;
  SqlitePtr db_;
  int restart_at_frames_ = kRestartFrames;  // see on_wal_commit
  int restart_retry_frames_ = kCheckpointFrames;
  StatementCache statements_;
  bool in_scope_ = false;
  bool out_bool_ = false;
  bool outbox_ = false;  // the floor is kOutboxFloor or more
  std::int64_t next_floor_check_ms_ = 0;
  OwnOutbox own_outbox_;
  std::vector<std::string_view> outbox_done_, outbox_canceled_;  // a row's ids, reused
  std::string json_done_, json_canceled_;
  std::vector<std::pair<std::int64_t, std::int64_t>> expired_;  // outbox rows: seq, lease
  struct StringHash {  // scan_transfer_states' set, looked up by string_view
    using is_transparent = void;
    std::size_t operator()(std::string_view v) const noexcept { return std::hash<std::string_view>{}(v); }
  };
  ScopeTable<ScopeAccount> scope_accounts_;
  ScopeTable<FreshTransfer> scope_fresh_;
};

}  // namespace

Status open_sqlite_store(std::string_view path, std::unique_ptr<Store>& out) {
  // Memory statistics take a global mutex on every allocation; we never read
  // them. Must precede sqlite3_initialize, hence once, before the first open.
  static const bool configured = [] {
    sqlite3_config(SQLITE_CONFIG_MEMSTATUS, 0);
    return true;
  }();
  (void)configured;
  sqlite3* raw = nullptr;
  const std::string p(path);
  const int rc = sqlite3_open_v2(p.c_str(), &raw,
                                 SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                                 nullptr);
  SqlitePtr db(raw);
  if (rc != SQLITE_OK) {
    return Status::fatal("cannot open sqlite:" + p + ": " +
                         (raw ? sqlite3_errmsg(raw) : sqlite3_errstr(rc)));
  }
  auto store = std::make_unique<SqliteStore>(p, std::move(db));
  if (Status s = store->configure(); !s) {
    return Status::fatal("cannot use sqlite:" + p + ": " + s.message());
  }
  out = std::move(store);
  return Status::ok();
}

}  // namespace sagapool
