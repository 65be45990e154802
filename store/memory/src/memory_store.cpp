// The in-memory store: every method mirrors the SQLite backend's statement
// by statement (same conditions, same order of checks, same results), on
// ordered maps instead of tables.
#include "sagapool/memory_store.hpp"

#include <algorithm>
#include <chrono>

namespace sagapool::sim {

std::int64_t WallClock::now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

namespace {

// "Never moves backwards": `to` lies ahead of `from` on the saga's graph, one
// legal edge away, or several when a batch writes only the final state of a
// transfer inserted in the same transaction.
bool moves_forward(TransferState from, TransferState to) {
  bool seen[kTransferStateCount] = {};
  TransferState queue[kTransferStateCount] = {from};
  std::size_t head = 0;
  std::size_t tail = 1;
  seen[static_cast<std::size_t>(from)] = true;
  while (head < tail) {
    const TransferState s = queue[head++];
    for (int n = 0; n < kTransferStateCount; ++n) {
      const auto next = static_cast<TransferState>(n);
      if (!is_legal_transition(s, next) || seen[n]) continue;
      if (next == to) return true;
      seen[n] = true;
      queue[tail++] = next;
    }
  }
  return false;
}

}  // namespace

class MemoryStore final : public Store {
 public:
  explicit MemoryStore(std::shared_ptr<MemoryDb> db)
      : db_(std::move(db)), name_("memory:" + db_->options_.name) {}

  ~MemoryStore() override {
    std::lock_guard lock(db_->mu_);
    if (db_->scope_owner_ == this) rollback(db_->scope_undo_);  // died mid-transaction
    if (db_->scope_owner_ == this) db_->scope_owner_ = nullptr;
  }

  const std::string& display_name() const noexcept override { return name_; }

  Status init_schema() override {
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(false); !s) return s;
    if (std::max(db_->schema_version_, db_->schema_expanded_) > kSchemaVersion) {
      return Status::fatal(name_ + " has schema version " + std::to_string(db_->schema_version_) +
                           ", newer than this program knows (" + std::to_string(kSchemaVersion) + ")");
    }
    if (!db_->initialised_) db_->schema_version_ = kSchemaVersion;  // nothing older ran on it
    db_->initialised_ = true;
    db_->schema_expanded_ = kSchemaVersion;
    return Status::ok();
  }

  // The memory store has nothing to drop: the contract raises the floor.
  Status contract_schema() override {
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    if (db_->schema_expanded_ < kSchemaVersion) {
      return Status::fatal(name_ + " is not at schema version " + std::to_string(kSchemaVersion) +
                           " yet; run `sagactl init` first");
    }
    db_->schema_version_ = kSchemaVersion;
    return Status::ok();
  }

  Status read_topology(std::optional<Topology>& out) override {
    std::lock_guard lock(db_->mu_);
    out.reset();
    if (Status s = gate(false); !s) return s;
    if (!db_->initialised_ || !db_->topology_) return Status::ok();
    out = *db_->topology_;
    out->schema_version = db_->schema_version_;
    out->schema_expanded = db_->schema_expanded_;
    return Status::ok();
  }

  Status write_topology(const Topology& t) override {
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    Tx tx(*this);
    auto old = db_->topology_;
    tx.log([db = db_.get(), old] { db->topology_ = old; });
    db_->topology_ = t;
    return tx.commit();
  }

  Status now_ms(std::int64_t& out) override {
    std::lock_guard lock(db_->mu_);
    out = db_->clock_->now_ms();
    return Status::ok();
  }

  bool supports_scope() const noexcept override { return db_->options_.scopes; }

  Status begin_scope() override {
    if (!db_->options_.scopes) return Store::begin_scope();
    std::lock_guard lock(db_->mu_);
    if (db_->scope_owner_ == this) {
      return Status::fatal("cannot start a transaction within a transaction");
    }
    if (Status s = gate(false); !s) return s;
    db_->scope_owner_ = this;
    db_->scope_undo_.clear();
    return Status::ok();
  }

  Status end_scope(bool commit) override {
    std::lock_guard lock(db_->mu_);
    if (db_->scope_owner_ != this) {
      return commit ? Status::fatal("cannot commit - no transaction is active") : Status::ok();
    }
    if (!commit) rollback(db_->scope_undo_);
    db_->scope_undo_.clear();
    db_->scope_owner_ = nullptr;
    return Status::ok();
  }

  // ---- two-phase commit (MemoryOptions::prepare) --------------------------

  bool supports_prepare() const noexcept override { return db_->options_.scopes && db_->options_.prepare; }

  Status write_walk(std::span<const WalkPosting> postings, std::span<const WalkVoid> voids,
                    std::span<const BalanceMove> balances) override {
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    if (db_->scope_owner_ != this) return Status::fatal(name_ + ": write_walk outside a transaction");
    MemoryDb* db = db_.get();
    Tx tx(*this);
    const std::int64_t now = db->clock_->now_ms();
    for (const WalkPosting& p : postings) {
      LegKey key{std::string(p.transfer_id), std::string(p.account_id), p.kind};
      if (db->postings_.count(key) != 0 || !db->accounts_.contains(key.account_id)) {
        return Status::fatal(name_ + ": write_walk: posting of transfer " + key.transfer_id +
                             " on account " + key.account_id + " exists or has no account");
      }
      MemoryDb::PostingRow row;
      row.posting = {key.transfer_id, key.account_id, p.kind, p.amount, now};
      row.seq = ++db->posting_seq_;
      db->postings_.emplace(key, std::move(row));
      tx.log([db, key] { db->postings_.erase(key); });
    }
    for (const WalkVoid& v : voids) {
      LegKey key{std::string(v.transfer_id), std::string(v.account_id),
                 v.credit ? PostingKind::credit : PostingKind::debit};
      if (!db->voids_.insert(key).second) {
        return Status::fatal(name_ + ": write_walk: leg of transfer " + key.transfer_id + " voided already");
      }
      tx.log([db, key] { db->voids_.erase(key); });
    }
    for (const BalanceMove& m : balances) {
      const auto it = db->accounts_.find(m.account_id);
      if (it == db->accounts_.end() || !move_stands(it->second, m)) {
        return Status::retry_stage(name_ + ": write_walk: account " + std::string(m.account_id) +
                                   " no longer gives the walk's verdicts; the batch runs again");
      }
      save_account(tx, it->first);
      it->second.balance += m.to - m.from;
    }
    return tx.commit();
  }

  // saga_settle_move's condition (store/postgres/sql/functions.sql).
  static bool move_stands(const Account& a, const BalanceMove& m) {
    if (a.locked != m.locked || a.currency != m.currency || a.min_balance != m.min_balance) return false;
    if (a.balance == m.from && a.reserved == m.reserved) return true;
    __extension__ typedef __int128 Wide;
    constexpr Wide kMax = INT64_MAX;
    const Wide moved = static_cast<Wide>(a.balance) - m.from;
    const Wide grew = static_cast<Wide>(a.reserved) - m.reserved;
    return !m.refused && (!m.low || *m.low + moved >= a.min_balance) &&
           (!m.reserved_high || *m.reserved_high + grew <= kMax) &&
           (!m.sum_high || *m.sum_high + moved + grew <= kMax);
  }

  Status prepare_scope(std::string_view gid) override {
    std::lock_guard lock(db_->mu_);
    if (!supports_prepare()) return Status::fatal(name_ + ": cannot prepare a transaction");
    if (db_->scope_owner_ != this) return Status::fatal(name_ + ": prepare: no transaction is active");
    db_->scope_owner_ = nullptr;
    db_->prepared_gid_ = std::string(gid);
    db_->prepared_at_ms_ = db_->clock_->now_ms();
    db_->prepared_undo_ = std::move(db_->scope_undo_);
    db_->scope_undo_.clear();
    return Status::ok();
  }

  Status finish_prepared(std::string_view gid, bool commit) override {
    std::lock_guard lock(db_->mu_);
    if (!db_->prepared_gid_ || *db_->prepared_gid_ != gid) return Status::ok();  // finished already
    if (!commit) rollback(db_->prepared_undo_);
    db_->prepared_undo_.clear();
    db_->prepared_gid_.reset();
    return Status::ok();
  }

  Status list_prepared(std::string_view prefix, std::int64_t min_age_ms, std::vector<std::string>& gids) override {
    std::lock_guard lock(db_->mu_);
    gids.clear();
    if (db_->prepared_gid_ && db_->prepared_gid_->starts_with(prefix) &&
        db_->prepared_at_ms_ + min_age_ms <= db_->clock_->now_ms()) {
      gids.push_back(*db_->prepared_gid_);
    }
    return Status::ok();
  }

  Status prepared_stats(std::string_view prefix, PreparedStats& out) override {
    std::lock_guard lock(db_->mu_);
    out = {};
    if (db_->prepared_gid_ && db_->prepared_gid_->starts_with(prefix)) out = {1, db_->prepared_at_ms_};
    return Status::ok();
  }

  Status record_decision(std::string_view gid) override {
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    if (db_->scope_owner_ != this) return Status::fatal(name_ + ": record_decision outside a transaction");
    MemoryDb* db = db_.get();
    const auto [it, inserted] = db->decisions_.try_emplace(std::string(gid));
    if (!inserted) return Status::retry_stage(name_ + ": transaction " + std::string(gid) + " was decided already");
    it->second = {true, db->clock_->now_ms()};
    db->scope_undo_.push_back([db, key = it->first] { db->decisions_.erase(key); });
    return Status::ok();
  }

  // A scope of another connection that recorded `gid` holds the database's
  // lock, so it is waited for as gate() makes every call wait (retry_call).
  Status decide(std::string_view gid, bool& committed) override {
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    if (db_->scope_owner_ == this) return Status::fatal(name_ + ": decide inside a transaction");
    const auto [it, inserted] = db_->decisions_.try_emplace(std::string(gid));
    if (inserted) it->second = {false, db_->clock_->now_ms()};
    committed = it->second.committed;
    return Status::ok();
  }

  Status list_decisions(std::int64_t min_age_ms, std::size_t limit, std::vector<std::string>& gids) override {
    std::lock_guard lock(db_->mu_);
    gids.clear();
    if (Status s = gate(); !s) return s;
    std::vector<std::pair<std::int64_t, std::string>> aged;
    for (const auto& [gid, d] : db_->decisions_) {
      if (d.at_ms + min_age_ms <= db_->clock_->now_ms()) aged.emplace_back(d.at_ms, gid);
    }
    std::sort(aged.begin(), aged.end());
    for (std::size_t i = 0; i < aged.size() && i < limit; ++i) gids.push_back(std::move(aged[i].second));
    return Status::ok();
  }

  Status forget_decisions(std::span<const std::string> gids) override {
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    MemoryDb* db = db_.get();
    Tx tx(*this);
    for (const std::string& gid : gids) {
      const auto it = db->decisions_.find(gid);
      if (it == db->decisions_.end()) continue;
      tx.log([db, gid, d = it->second] { db->decisions_[gid] = d; });
      db->decisions_.erase(it);
    }
    return tx.commit();
  }

  // ---- transfers ----------------------------------------------------------

  Status insert_transfers(std::span<const NewTransfer> batch, std::string_view owner,
                          std::int64_t lease_ms, std::span<InsertResult> results) override {
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    Tx tx(*this);
    const std::int64_t now = db_->clock_->now_ms();
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const NewTransfer& t = batch[i];
      const RequestView& r = t.request;
      const auto it = db_->transfers_.find(r.id);
      if (it == db_->transfers_.end()) {
        TransferDoc d;
        d.id.assign(r.id);
        d.source.assign(r.from);
        d.destination.assign(r.to);
        d.amount = r.amount;
        d.currency.assign(r.currency);
        d.metadata.assign(r.metadata);
        d.payload_hash = t.payload_hash;
        d.state = TransferState::initial;
        d.owner.assign(owner);
        d.epoch = 1;
        d.lease_until_ms = now + lease_ms;
        d.reason = Reason::none;
        d.created_at_ms = now;
        d.last_modified_ms = now;
        d.requested_at_ms = t.requested_at_ms;
        d.finished_at_ms = 0;
        d.attempts = 0;
        d.notified = false;
        d.origin.topic.assign(t.origin_topic);
        d.origin.partition = t.origin_partition;
        d.origin.offset = t.origin_offset;
        save_transfer(tx, d.id);
        db_->transfers_.emplace(d.id, std::move(d));
        results[i] = InsertResult::inserted;
        continue;
      }
      const TransferDoc& d = it->second;
      const bool same = d.payload_hash == t.payload_hash && d.source == r.from &&
                        d.destination == r.to && d.amount == r.amount && d.currency == r.currency &&
                        d.metadata == r.metadata;
      results[i] = same ? InsertResult::duplicate : InsertResult::conflict;
    }
    return tx.commit();
  }

  Status transition(std::span<const Transition> batch, std::int64_t lease_ms,
                    std::span<std::uint8_t> applied, std::int64_t* at_ms) override {
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    Tx tx(*this);
    const std::int64_t now = db_->clock_->now_ms();
    if (at_ms != nullptr) *at_ms = now;
    for (std::size_t i = 0; i < batch.size(); ++i) {
      const Transition& t = batch[i];
      const auto it = db_->transfers_.find(t.id);
      applied[i] = 0;
      if (it == db_->transfers_.end()) continue;
      TransferDoc& d = it->second;
      if (d.state != t.from || d.owner != t.owner || d.epoch != t.epoch) continue;
      save_transfer(tx, d.id);
      if (!moves_forward(d.state, t.to)) {
        db_->illegal_.push_back(d.id + ": " + std::string(to_string(d.state)) + " -> " +
                                std::string(to_string(t.to)) + " by " + d.owner + "@" +
                                std::to_string(d.epoch));
      }
      ++db_->transitions_;
      tx.log([db = db_.get()] { --db->transitions_; });
      d.state = t.to;
      d.reason = t.reason;
      d.last_modified_ms = now;
      d.lease_until_ms = now + lease_ms;
      if (is_terminal(t.to)) {
        d.finished_at_ms = now;
        d.notified = false;
      }
      applied[i] = 1;
    }
    return tx.commit();
  }

  Status claim_expired(std::string_view owner, std::int64_t lease_ms, std::size_t limit,
                       std::vector<TransferDoc>& out) override {
    out.clear();
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    Tx tx(*this);
    const std::int64_t now = db_->clock_->now_ms();
    std::vector<TransferDoc*> due;
    for (auto& [id, d] : db_->transfers_) {
      if ((!is_terminal(d.state) || !d.notified) && d.lease_until_ms < now) due.push_back(&d);
    }
    std::sort(due.begin(), due.end(), [](const TransferDoc* a, const TransferDoc* b) {
      return std::tie(a->lease_until_ms, a->id) < std::tie(b->lease_until_ms, b->id);
    });
    if (due.size() > limit) due.resize(limit);
    for (TransferDoc* d : due) {
      save_transfer(tx, d->id);
      d->owner.assign(owner);
      ++d->epoch;
      ++d->attempts;
      d->lease_until_ms = now + lease_ms;
      out.push_back(*d);
    }
    return tx.commit();
  }

  Status take_over(std::string_view id, std::string_view owner, std::int64_t lease_ms,
                   std::optional<TransferDoc>& out) override {
    out.reset();
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    Tx tx(*this);
    const auto it = db_->transfers_.find(id);
    if (it == db_->transfers_.end()) return tx.commit();
    TransferDoc& d = it->second;
    if (is_terminal(d.state)) {  // finished: as it is
      out = d;
      return tx.commit();
    }
    save_transfer(tx, d.id);
    d.owner.assign(owner);
    ++d.epoch;
    ++d.attempts;
    d.lease_until_ms = db_->clock_->now_ms() + lease_ms;
    out = d;
    return tx.commit();
  }

  Status mark_notified(std::span<const std::string_view> ids) override {
    if (ids.empty()) return Status::ok();
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    Tx tx(*this);
    for (std::string_view id : ids) {
      const auto it = db_->transfers_.find(id);
      if (it == db_->transfers_.end()) continue;
      TransferDoc& d = it->second;
      if (d.notified || !is_terminal(d.state)) continue;
      save_transfer(tx, d.id);
      d.notified = true;
    }
    return tx.commit();
  }

  Status load_transfer(std::string_view id, std::optional<TransferDoc>& out) override {
    out.reset();
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    const auto it = db_->transfers_.find(id);
    if (it != db_->transfers_.end()) out = it->second;
    return Status::ok();
  }

  Status list_stale(std::int64_t before_ms, std::size_t limit,
                    std::vector<TransferDoc>& out) override {
    out.clear();
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    std::vector<const TransferDoc*> stale;
    for (const auto& [id, d] : db_->transfers_) {
      if (!is_terminal(d.state) && d.last_modified_ms < before_ms) stale.push_back(&d);
    }
    std::sort(stale.begin(), stale.end(), [](const TransferDoc* a, const TransferDoc* b) {
      return std::tie(a->last_modified_ms, a->id) < std::tie(b->last_modified_ms, b->id);
    });
    if (stale.size() > limit) stale.resize(limit);
    for (const TransferDoc* d : stale) out.push_back(*d);
    return Status::ok();
  }

  Status state_stats(StateStatsTable& out) override {
    out = {};
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    const std::int64_t now = db_->clock_->now_ms();
    for (const auto& [id, d] : db_->transfers_) {
      if (is_terminal(d.state) && d.notified) continue;
      StateStats& s = out[static_cast<std::size_t>(d.state)];
      const std::int64_t since = is_terminal(d.state) ? d.finished_at_ms : d.created_at_ms;
      s.oldest_ms = s.count == 0 ? since : std::min(s.oldest_ms, since);
      ++s.count;
      if (d.lease_until_ms < now) ++s.stuck;
    }
    return Status::ok();
  }

  Status scan_transfer_states(
      const std::function<void(std::string_view, TransferState, bool)>& fn) override {
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    for (const auto& [id, d] : db_->transfers_) fn(id, d.state, d.notified);
    return Status::ok();
  }

  // ---- accounts and legs --------------------------------------------------

  Status apply_legs(std::span<const LegRequest> batch, std::span<LegResult> results) override {
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    Tx tx(*this);
    const std::int64_t now = db_->clock_->now_ms();
    for (std::size_t i = 0; i < batch.size(); ++i) {
      if (batch[i].amount <= 0 && (batch[i].op == LegOp::debit || batch[i].op == LegOp::credit)) {
        return Status::fatal("leg of transfer " + std::string(batch[i].transfer_id) +
                             " has a non-positive amount");
      }
      if (Status s = apply_leg(tx, batch[i], now, results[i]); !s) return s;
    }
    return tx.commit();
  }

  Status create_accounts(std::span<const Account> accounts) override {
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    Tx tx(*this);
    for (const Account& a : accounts) {
      if (db_->accounts_.count(a.id) != 0) {
        return Status::fatal("account " + a.id + " already exists; nothing was created");
      }
      save_account(tx, a.id);
      Account row = a;
      row.opening_balance = a.balance;
      row.reserved = 0;  // nothing pending yet, as the SQL backends' default
      db_->accounts_.emplace(a.id, std::move(row));
    }
    return tx.commit();
  }

  Status load_account(std::string_view id, std::optional<Account>& out) override {
    out.reset();
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    const auto it = db_->accounts_.find(id);
    if (it != db_->accounts_.end()) out = it->second;
    return Status::ok();
  }

  Status load_accounts(std::span<const std::string_view> ids,
                       std::span<std::optional<Account>> out) override {
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    for (std::size_t i = 0; i < ids.size(); ++i) {
      const auto it = db_->accounts_.find(ids[i]);
      if (it == db_->accounts_.end()) out[i].reset();
      else out[i] = it->second;
    }
    return Status::ok();
  }

  Status set_locked(std::string_view id, bool locked, bool& found) override {
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    Tx tx(*this);
    const auto it = db_->accounts_.find(id);
    found = it != db_->accounts_.end();
    if (found) {
      save_account(tx, it->first);
      it->second.locked = locked;
    }
    return tx.commit();
  }

  Status postings_for_transfer(std::string_view transfer_id, std::vector<Posting>& out) override {
    out.clear();
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    for (auto it = db_->postings_.lower_bound(LegKey{std::string(transfer_id), "", PostingKind::debit});
         it != db_->postings_.end() && it->first.transfer_id == transfer_id; ++it) {
      out.push_back(it->second.posting);
    }
    // ORDER BY at, kind (the kind's name, as the SQL backends store it).
    std::stable_sort(out.begin(), out.end(), [](const Posting& a, const Posting& b) {
      return std::make_tuple(a.at_ms, to_string(a.kind)) < std::make_tuple(b.at_ms, to_string(b.kind));
    });
    return Status::ok();
  }

  Status postings_for_account(std::string_view account_id, std::size_t limit,
                              std::vector<Posting>& out) override {
    out.clear();
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    std::vector<const MemoryDb::PostingRow*> rows;
    for (const auto& [key, row] : db_->postings_) {
      if (key.account_id == account_id) rows.push_back(&row);
    }
    std::sort(rows.begin(), rows.end(), [](const MemoryDb::PostingRow* a, const MemoryDb::PostingRow* b) {
      return std::tie(a->posting.at_ms, a->seq) > std::tie(b->posting.at_ms, b->seq);  // newest first
    });
    if (rows.size() > limit) rows.resize(limit);
    for (const MemoryDb::PostingRow* r : rows) out.push_back(r->posting);
    return Status::ok();
  }

  Status pending_for_account(std::string_view account_id,
                             std::vector<std::string>& transfer_ids) override {
    transfer_ids.clear();
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    for (auto it = db_->pending_.lower_bound(std::make_pair(std::string(account_id), std::string()));
         it != db_->pending_.end() && it->first.first == account_id; ++it) {
      transfer_ids.push_back(it->first.second);
    }
    return Status::ok();
  }

  Status scan_accounts(const std::function<void(const Account&)>& fn) override {
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    for (const auto& [id, a] : db_->accounts_) fn(a);
    return Status::ok();
  }

  Status scan_postings(const std::function<void(const Posting&)>& fn) override {
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    for (const auto& [key, row] : db_->postings_) fn(row.posting);
    return Status::ok();
  }

  Status register_worker(const WorkerRecord& w) override {
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    WorkerRecord& row = db_->workers_[w.worker_id];
    row = w;
    row.heartbeat_ms = db_->clock_->now_ms();
    return Status::ok();
  }

  Status deregister_worker(std::string_view worker_id) override {
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    if (auto it = db_->workers_.find(worker_id); it != db_->workers_.end()) db_->workers_.erase(it);
    return Status::ok();
  }

  Status list_workers(std::vector<WorkerRecord>& out) override {
    std::lock_guard lock(db_->mu_);
    out.clear();
    if (Status s = gate(); !s) return s;
    for (const auto& [id, w] : db_->workers_) out.push_back(w);
    return Status::ok();
  }

  Status recent_owners(std::int64_t since_ms, std::vector<std::string>& out) override {
    std::lock_guard lock(db_->mu_);
    out.clear();
    if (Status s = gate(); !s) return s;
    std::set<std::string> owners;
    for (const auto& [id, d] : db_->transfers_) {
      if (d.lease_until_ms >= since_ms) owners.insert(d.owner);
    }
    out.assign(owners.begin(), owners.end());
    return Status::ok();
  }

  Status scan_pending(const std::function<void(const PendingEntry&)>& fn) override {
    std::lock_guard lock(db_->mu_);
    if (Status s = gate(); !s) return s;
    PendingEntry e;
    for (const auto& entry : db_->pending_) {
      e.account_id = entry.first.first;
      e.transfer_id = entry.first.second;
      fn(e);
    }
    return Status::ok();
  }

 private:
  using UndoLog = std::vector<std::function<void()>>;

  // One call's writes: rolled back unless committed, as one SQLite
  // transaction. Inside a scope the scope's log is used instead, and a
  // failed call leaves its writes for end_scope(false) to undo, as SQLite
  // does inside a transaction the caller opened.
  class Tx {
   public:
    explicit Tx(MemoryStore& s) : s_(s), scoped_(s.db_->scope_owner_ == &s) {}
    ~Tx() {
      if (!committed_ && !scoped_) rollback(local_);
    }
    Tx(const Tx&) = delete;
    Tx& operator=(const Tx&) = delete;
    void log(std::function<void()> undo) {
      (scoped_ ? s_.db_->scope_undo_ : local_).push_back(std::move(undo));
    }
    Status commit() {
      committed_ = true;
      local_.clear();
      return Status::ok();
    }

   private:
    MemoryStore& s_;
    bool scoped_;
    bool committed_ = false;
    UndoLog local_;
  };

  static void rollback(UndoLog& log) {
    for (auto it = log.rbegin(); it != log.rend(); ++it) (*it)();
    log.clear();
  }

  // Every call but now_ms: the database must exist (init_schema) unless
  // `needs_schema` is false, and no other connection may hold a scope.
  Status gate(bool needs_schema = true) const {
    if (db_->scope_owner_ != nullptr && db_->scope_owner_ != this) {
      return Status::retry_call(name_ + ": database is locked (another connection holds a transaction)");
    }
    if (db_->prepared_gid_) {
      return Status::retry_call(name_ + ": database is locked (a prepared transaction holds it)");
    }
    if (needs_schema && !db_->initialised_) {
      return Status::fatal(name_ + ": no such table (the schema was never created)");
    }
    return Status::ok();
  }

  void save_transfer(Tx& tx, const std::string& id) {
    MemoryDb* db = db_.get();
    const auto it = db->transfers_.find(id);
    if (it == db->transfers_.end()) {
      tx.log([db, id] { db->transfers_.erase(id); });
    } else {
      tx.log([db, id, old = it->second] { db->transfers_[id] = old; });
    }
  }

  void save_account(Tx& tx, const std::string& id) {
    MemoryDb* db = db_.get();
    const auto it = db->accounts_.find(id);
    if (it == db->accounts_.end()) {
      tx.log([db, id] { db->accounts_.erase(id); });
    } else {
      tx.log([db, id, old = it->second] { db->accounts_[id] = old; });
    }
  }

  // The entry keeps what it reserved on the account (added to an entry
  // already there), so dropping it gives back exactly that, once.
  void add_pending(Tx& tx, std::string account, std::string transfer, std::int64_t reserve) {
    MemoryDb* db = db_.get();
    auto key = std::make_pair(std::move(account), std::move(transfer));
    const auto [it, inserted] = db->pending_.emplace(key, 0);
    const std::int64_t old = it->second;
    it->second += reserve;
    if (inserted) {
      tx.log([db, key] { db->pending_.erase(key); });
    } else {
      tx.log([db, key, old] { db->pending_[key] = old; });
    }
  }

  // Returns what the dropped entry reserved (0 if there was none).
  std::int64_t drop_pending(Tx& tx, std::string account, std::string transfer) {
    MemoryDb* db = db_.get();
    auto key = std::make_pair(std::move(account), std::move(transfer));
    const auto it = db->pending_.find(key);
    if (it == db->pending_.end()) return 0;
    const std::int64_t reserve = it->second;
    db->pending_.erase(it);
    tx.log([db, key, reserve] { db->pending_.emplace(key, reserve); });
    return reserve;
  }

  // Gives back what a dropped pending entry reserved (SQLite's `unreserve`).
  void unreserve(Tx& tx, const LegRequest& req, std::int64_t reserve) {
    if (reserve == 0) return;
    const auto acct = db_->accounts_.find(req.account_id);
    if (acct == db_->accounts_.end()) return;
    save_account(tx, acct->first);
    acct->second.reserved -= reserve;
  }

  void add_void(Tx& tx, const LegRequest& req, PostingKind kind) {
    MemoryDb* db = db_.get();
    LegKey key{std::string(req.transfer_id), std::string(req.account_id), kind};
    if (db->voids_.insert(key).second) tx.log([db, key] { db->voids_.erase(key); });
  }

  bool has_posting(const LegRequest& req, PostingKind kind) const {
    return db_->postings_.count(LegKey{std::string(req.transfer_id), std::string(req.account_id), kind}) != 0;
  }

  // The posting, the balance, the pending entry and the reservation together
  // (SQLite's `post`): a debit reserves its amount, a reversal gives back
  // what its pending entry reserved.
  void post(Tx& tx, const LegRequest& req, PostingKind kind, std::int64_t new_balance,
            std::int64_t now, bool pending) {
    MemoryDb* db = db_.get();
    LegKey key{std::string(req.transfer_id), std::string(req.account_id), kind};
    MemoryDb::PostingRow row;
    row.posting = {key.transfer_id, key.account_id, kind, req.amount, now};
    row.seq = ++db->posting_seq_;
    db->postings_.emplace(key, std::move(row));
    tx.log([db, key] { db->postings_.erase(key); });
    const std::int64_t reserve = kind == PostingKind::debit ? req.amount : 0;
    std::int64_t released = 0;
    if (pending) {
      add_pending(tx, std::string(req.account_id), std::string(req.transfer_id), reserve);
    } else {
      released = drop_pending(tx, std::string(req.account_id), std::string(req.transfer_id));
    }
    const auto acct = db->accounts_.find(req.account_id);
    if (acct != db->accounts_.end()) {
      save_account(tx, acct->first);
      acct->second.balance = new_balance;
      acct->second.reserved += reserve - released;
    }
  }

  Status apply_leg(Tx& tx, const LegRequest& req, std::int64_t now, LegResult& out) {
    out.reason = Reason::none;
    out.account_currency.clear();
    const auto acct = db_->accounts_.find(req.account_id);
    const Account* a = acct == db_->accounts_.end() ? nullptr : &acct->second;
    switch (req.op) {
      case LegOp::debit:
      case LegOp::credit: {
        const bool debit = req.op == LegOp::debit;
        const PostingKind kind = debit ? PostingKind::debit : PostingKind::credit;
        if (a != nullptr) out.account_currency = a->currency;
        const LegKey key{std::string(req.transfer_id), std::string(req.account_id), kind};
        if (db_->voids_.count(key) != 0) return out.status = LegStatus::voided, Status::ok();
        if (db_->postings_.count(key) != 0) return out.status = LegStatus::already_posted, Status::ok();
        out.status = LegStatus::refused;
        if (a == nullptr) return out.reason = Reason::unknown_account, Status::ok();
        if (a->locked) return out.reason = Reason::account_locked, Status::ok();
        if (!req.currency.empty() && !a->currency.empty() && req.currency != a->currency) {
          return out.reason = Reason::currency_mismatch, Status::ok();
        }
        std::int64_t next = 0;
        std::int64_t room = 0;  // debit: reserved after; credit: balance + reserved after
        if (debit) {
          if (__builtin_sub_overflow(a->balance, req.amount, &next) || next < a->min_balance) {
            return out.reason = Reason::insufficient_funds, Status::ok();
          }
          if (__builtin_add_overflow(a->reserved, req.amount, &room)) {
            return out.reason = Reason::overflow, Status::ok();
          }
        } else if (__builtin_add_overflow(a->balance, req.amount, &next) ||
                   __builtin_add_overflow(next, a->reserved, &room)) {
          return out.reason = Reason::overflow, Status::ok();
        }
        post(tx, req, kind, next, now, true);
        out.status = LegStatus::posted;
        return Status::ok();
      }
      case LegOp::cancel_debit: {
        if (a != nullptr) out.account_currency = a->currency;
        if (!has_posting(req, PostingKind::debit)) {
          out.status = LegStatus::voided;
          add_void(tx, req, PostingKind::debit);
          return Status::ok();
        }
        out.status = LegStatus::reversed;
        if (has_posting(req, PostingKind::reverse_debit)) return Status::ok();
        // The debit's reservation keeps room for this; it can only be missing
        // if the entry was released first, which the engine never does.
        std::int64_t next = 0;
        if (__builtin_add_overflow(a != nullptr ? a->balance : 0, req.amount, &next)) {
          return Status::fatal("reversing debit of transfer " + std::string(req.transfer_id) +
                               " would overflow account " + std::string(req.account_id));
        }
        post(tx, req, PostingKind::reverse_debit, next, now, false);
        return Status::ok();
      }
      case LegOp::cancel_credit: {
        if (has_posting(req, PostingKind::credit)) return out.status = LegStatus::credit_posted, Status::ok();
        out.status = LegStatus::voided;
        add_void(tx, req, PostingKind::credit);
        return Status::ok();
      }
      case LegOp::release: {
        unreserve(tx, req, drop_pending(tx, std::string(req.account_id), std::string(req.transfer_id)));
        out.status = LegStatus::released;
        return Status::ok();
      }
    }
    return Status::fatal("unknown leg operation");
  }

  std::shared_ptr<MemoryDb> db_;
  std::string name_;
};

std::shared_ptr<MemoryDb> make_memory_db(std::shared_ptr<StoreClock> clock, MemoryOptions options) {
  return std::make_shared<MemoryDb>(std::move(clock), std::move(options));
}

std::unique_ptr<Store> connect(const std::shared_ptr<MemoryDb>& db) {
  return std::make_unique<MemoryStore>(db);
}

}  // namespace sagapool::sim
