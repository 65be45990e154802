#include "sagapool/saga_engine.hpp"

#include <algorithm>
#include <array>
#include <thread>

#include "sagapool/failpoints.hpp"
#include "sagapool/log.hpp"

namespace sagapool {

void SagaItem::assign(const TransferDoc& doc) {
  id = doc.id;
  source = doc.source;
  destination = doc.destination;
  currency = doc.currency;
  requested_currency = doc.currency;
  metadata = doc.metadata;
  amount = doc.amount;
  epoch = doc.epoch;
  requested_at_ms = doc.requested_at_ms;
  finished_at_ms = doc.finished_at_ms;
  state = doc.state;
  reason = doc.reason;
  dropped = false;
  fresh = false;
  settled = false;
}

// The legs bound for one shard in one stage, with the item each belongs to.
struct SagaEngine::ShardBatch {
  std::vector<LegRequest> legs;
  std::vector<std::size_t> item;
  std::vector<LegResult> results;
  bool failed = false;

  void clear() {
    legs.clear();
    item.clear();
    failed = false;
  }
};

namespace {

using Clock = std::chrono::steady_clock;

// A leg result the engine did not ask for means the store broke its contract.
Status unexpected(const LegRequest& leg, LegStatus status) {
  return Status::fatal("store returned leg status " + std::to_string(static_cast<int>(status)) +
                       " for leg " + std::to_string(static_cast<int>(leg.op)) + " of transfer " +
                       std::string(leg.transfer_id));
}

}  // namespace

SagaEngine::SagaEngine(Ledger& ledger, Options options, SagaObserver* observer)
    : ledger_(ledger), options_(std::move(options)), observer_(observer) {
  if (observer_ == nullptr) observer_ = &null_observer_;
  shards_.resize(ledger_.shard_count());
  walk_.resize(ledger_.shard_count());
  followups_.resize(ledger_.shard_count());
  snapshot_ids_.resize(ledger_.shard_count());
  snapshot_slots_.resize(ledger_.shard_count());
}

SagaEngine::~SagaEngine() = default;

template <typename Call>
Status SagaEngine::with_retries_unscoped(std::string_view op, Call&& call) {
  for (int attempt = 0;; ++attempt) {
    Status s = call();
    if (s) return s;
    observer_->on_store_error(op, s);
    if (s.kind() != ErrorKind::retry_call || attempt >= options_.call_retries) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(1000, 10 << attempt)));
  }
}

template <typename Call>
Status SagaEngine::with_retries(std::string_view op, Call&& call) {
  for (int attempt = 0;; ++attempt) {
    Status s = call();
    if (s) return s;
    observer_->on_store_error(op, s);
    if (s.kind() != ErrorKind::retry_call || attempt >= options_.call_retries || scoped_) {
      store_failed_ = true;
      return s;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(1000, 10 << attempt)));
  }
}

Status SagaEngine::run(std::vector<SagaItem>& items) {
  // One store: the whole batch is one transaction there (one commit instead
  // of one per stage). Several stores: each stage commits on its own shard
  // (the worker runs what lies wholly on the first in its insert's
  // transaction: split_first_store).
  if (ledger_.shard_count() != 1 || !ledger_.shard(0).supports_scope()) return run_rounds(items);
  StageStore& store = ledger_.shard(0);
  Status s = with_retries_unscoped("begin", [&] { return store.begin_scope(); });
  if (s) s = run_in_scope(items);
  if (s) s = store.end_scope(true);
  if (!s) {
    // Nothing of this run is in the store: leave every item to recovery.
    observer_->on_store_error("commit", s);
    store.end_scope(false).ignore();
    for (SagaItem& it : items) it.dropped = true;
    return s.kind() == ErrorKind::fatal ? s : Status::ok();
  }
  return s;
}

Status SagaEngine::run_in_scope(std::vector<SagaItem>& items) {
  if (ledger_.shard_count() > 1) {
    for (const SagaItem& it : items) {
      if (ledger_.shard_index(it.source) != 0 || ledger_.shard_index(it.destination) != 0) {
        return Status::fatal("engine: transfer " + it.id +
                             " has an account on another store, so it cannot run in the first store's transaction");
      }
    }
  }
  scoped_ = true;
  store_failed_ = false;
  Status s = run_rounds(items);
  scoped_ = false;
  if (s && store_failed_) {
    s = Status::retry_stage("a store call failed inside the batch transaction");
  }
  return s;
}

Status SagaEngine::run_across(std::vector<SagaItem>& items) {
  for (const SagaItem& it : items) {
    if (!it.fresh) return Status::fatal("engine: transfer " + it.id + " was not inserted in this batch's transaction");
  }
  across_ = true;
  scoped_ = true;
  store_failed_ = false;
  Status s = run_rounds(items);
  scoped_ = false;
  across_ = false;
  if (s && store_failed_) {
    s = Status::retry_stage("a store call failed inside the batch's transactions");
  }
  return s;
}

void SagaEngine::split_first_store(std::vector<SagaItem>& items, std::vector<SagaItem>& rest) {
  rest.clear();
  stays_.assign(items.size(), 0);
  for (std::size_t i = 0; i < items.size(); ++i) {
    const SagaItem& it = items[i];
    const std::string_view source = it.source;
    const std::string_view destination = it.destination;
    if (ledger_.shard_index(source) == 0 && ledger_.shard_index(destination) == 0 &&
        !held_.contains(source) && !held_.contains(destination)) {
      stays_[i] = 1;
    } else {
      held_.insert(source);
      held_.insert(destination);
    }
  }
  held_.clear();  // views into the items, which move now
  std::size_t kept = 0;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!stays_[i]) {
      rest.push_back(std::move(items[i]));
    } else if (kept++ != i) {
      items[kept - 1] = std::move(items[i]);
    }
  }
  items.resize(kept);
}

Status SagaEngine::run_rounds(std::vector<SagaItem>& items) {
  // A roll-forward (canceling -> applied) needs one more round; nothing else
  // does, so the bound is never reached by a healthy batch.
  constexpr int kMaxRounds = 4;
  stored_.clear();
  for (const SagaItem& it : items) stored_.push_back(it.state);
  for (int round = 0; round < kMaxRounds; ++round) {
    Status s = step_initial(items);
    if (s) s = step_legs(items);
    if (s) s = step_compensate_and_release(items);
    if (!s) {
      transitions_.clear();  // never carried into another run
      return s;
    }
    bool open = false;
    for (const SagaItem& it : items) open |= !it.dropped && !is_terminal(it.state);
    if (!open) break;
  }
  return flush_coalesced(items);
}

Status SagaEngine::flush_coalesced(std::vector<SagaItem>& items) {
  // Fresh items that stopped short of a terminal state still need their
  // state written (their terminal transitions were written as they happened).
  if (!scoped_) return Status::ok();
  transition_batch_.clear();
  for (std::size_t i = 0; i < items.size(); ++i) {
    const SagaItem& it = items[i];
    if (it.fresh && !it.dropped && !is_terminal(it.state) && it.state != stored_[i]) {
      transition_batch_.push_back({it.id, stored_[i], it.state, it.reason, options_.owner, it.epoch});
    }
  }
  if (transition_batch_.empty()) return Status::ok();
  applied_.assign(transition_batch_.size(), 0);
  Status s = with_retries("transition", [&] {
    return ledger_.transfers().transition(transition_batch_, options_.lease_ms, applied_);
  });
  if (s) {
    for (std::uint8_t a : applied_) {
      if (!a) return Status::retry_stage("a transfer inserted in this transaction changed hands");
    }
  }
  return s;
}

Status SagaEngine::step_initial(std::vector<SagaItem>& items) {
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!items[i].dropped && items[i].state == TransferState::initial) {
      transitions_.push_back({i, TransferState::pending, Reason::none});
    }
  }
  return write_transitions(items, "claim");
}

Status SagaEngine::run_legs(std::vector<ShardBatch>& shards, const char* stage) {
  const auto started = Clock::now();
  bool any = false;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    ShardBatch& b = shards[s];
    if (b.legs.empty()) continue;
    any = true;
    b.results.resize(b.legs.size());
    Status st = with_retries(stage, [&] {
      if (Status fp = SAGA_FAILPOINT("before_", stage); !fp) return fp;
      Status r = ledger_.shard(s).apply_legs(b.legs, b.results);
      if (!r) return r;
      return SAGA_FAILPOINT("after_", stage);
    });
    if (st.kind() == ErrorKind::fatal) return st;
    b.failed = !st.is_ok();
  }
  if (any) observer_->on_stage(stage, Clock::now() - started);
  return Status::ok();
}

Status SagaEngine::step_legs(std::vector<SagaItem>& items) {
  pending_.clear();
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!items[i].dropped && items[i].state == TransferState::pending) pending_.push_back(i);
  }
  // Transfers inserted in this transaction can run whole in one call, in
  // batch order, where the store offers it: no plan, no waves.
  if (scoped_ && !pending_.empty() && (across_ || ledger_.shard(0).supports_settle_sagas()) &&
      std::all_of(pending_.begin(), pending_.end(), [&](std::size_t i) { return items[i].fresh; })) {
    return settle_pending(items);
  }
  // Waves: each wave posts its debits, then its credits, in batch order. A
  // transfer whose legs could come out differently than if the batch ran
  // one transfer at a time (its debit needs a credit, reversal or release of
  // this wave; its credit would see reservations one by one had released)
  // is deferred to the next wave, with every later transfer sharing an
  // account with it, so the batch gives the one-by-one result.
  while (!pending_.empty()) {
    if (Status s = load_snapshot(items); !s) return s;
    plan_wave(items);
    if (Status s = post_wave(items); !s) return s;
    pending_.swap(deferred_);
    if (!pending_.empty()) {
      // Reversals of this wave must land before the next wave's debits.
      if (Status s = step_compensate_and_release(items); !s) return s;
    }
  }
  return Status::ok();
}

Status SagaEngine::settle_pending(std::vector<SagaItem>& items) {
  settle_batch_.clear();
  for (std::size_t i : pending_) {
    const SagaItem& it = items[i];
    settle_batch_.push_back({it.id, it.source, it.destination, it.amount, it.currency});
  }
  settle_results_.resize(settle_batch_.size());
  const auto started = Clock::now();
  Status st = across_ ? walk_across(items) : with_retries("settle", [&] {
    if (Status fp = SAGA_FAILPOINT("before_settle"); !fp) return fp;
    Status r = ledger_.shard(0).settle_sagas(settle_batch_, settle_results_);
    if (!r) return r;
    return SAGA_FAILPOINT("after_settle");
  });
  if (st.kind() == ErrorKind::fatal) return st;
  if (!st) {  // the scope fails as a whole
    for (std::size_t i : pending_) items[i].dropped = true;
    pending_.clear();
    return Status::ok();
  }
  observer_->on_stage("settle", Clock::now() - started);
  // The transitions the stages would have queued: pending -> applied |
  // canceling here, -> done | canceled at the finish.
  for (std::size_t k = 0; k < pending_.size(); ++k) {
    SagaItem& it = items[pending_[k]];
    const SettleResult& r = settle_results_[k];
    if (it.currency.empty()) it.currency = r.account_currency;
    it.settled = true;
    if (r.outcome == TransferState::done) {
      transitions_.push_back({pending_[k], TransferState::applied, Reason::none});
    } else if (r.outcome == TransferState::canceled && r.reason != Reason::none) {
      transitions_.push_back({pending_[k], TransferState::canceling, r.reason});
    } else {
      return Status::fatal("store settled transfer " + it.id + " as " + std::string(to_string(r.outcome)) +
                           " (" + std::string(to_string(r.reason)) + ")");
    }
  }
  pending_.clear();
  return write_transitions(items, "apply");
}

// saga_settle_batch's walk (store/postgres/sql/functions.sql) over the
// accounts of every store: the same checks in the same order, so a batch
// across stores ends as it would one transfer at a time on one store. The
// debit reserves its amount until its saga ends, as its pending entry
// would, so reservations end where they began and only balances move.
// Walked first, locked last, as there: the accounts are read unlocked and
// each store locks them with the walk's moves, which stand only where the
// rows as locked give the walk's verdicts (BalanceMove); an id with no row
// (its bucket must be held before a verdict of "unknown account"), or a
// batch run again after moves that did not stand, reads them locked.
Status SagaEngine::walk_across(std::vector<SagaItem>& items) {
  bool lock = std::exchange(lock_next_walk_, false);
  const bool cached = walks_uncached_ == 0;
  if (walks_uncached_ > 0) --walks_uncached_;
  for (;;) {
    if (Status s = load_snapshot(items, lock, cached); !s) return s;
    if (pending_.empty()) return Status::retry_stage("the accounts could not be read");  // dropped by load_snapshot
    if (lock || std::all_of(snaps_.begin(), snaps_.end(), [](const AccountSnap& a) { return a.exists; })) break;
    lock = true;
  }
  for (AccountSnap& a : snaps_) {
    a.write_balance = a.balance;
    a.write_reserved = a.reserved;
    a.low.reset();
    a.reserved_high.reset();
    a.sum_high.reset();
    a.refused = false;
  }
  for (WalkWrites& w : walk_) {
    w.postings.clear();
    w.voids.clear();
    w.balances.clear();
  }
  constexpr WideAmount kMax = INT64_MAX;
  for (std::size_t k = 0; k < settle_batch_.size(); ++k) {
    const SettleRequest& r = settle_batch_[k];
    SettleResult& out = settle_results_[k];
    out = SettleResult{};
    AccountSnap& src = snaps_[item_slots_[k].source];  // settle_batch_[k] is pending_[k]'s
    AccountSnap& dst = snaps_[item_slots_[k].destination];
    WalkWrites& at_src = walk_[src.shard];
    WalkWrites& at_dst = walk_[dst.shard];
    Reason reason = Reason::none;
    if (!src.exists) {
      reason = Reason::unknown_account;
    } else if (src.locked) {
      reason = Reason::account_locked;
    } else if (!r.currency.empty() && !src.currency.empty() && src.currency != r.currency) {
      reason = Reason::currency_mismatch;
    } else if (static_cast<WideAmount>(src.write_balance) - r.amount < src.min_balance) {
      reason = Reason::insufficient_funds;
      src.refused = true;
    } else if (src.write_reserved + r.amount > kMax) {
      reason = Reason::overflow;
      src.refused = true;
    }
    if (reason != Reason::none) {  // compensation voids the credit, then the debit that never posted
      out.reason = reason;
      at_dst.voids.push_back({r.transfer_id, r.destination, true});
      at_src.voids.push_back({r.transfer_id, r.source, false});
      continue;
    }
    out.account_currency = src.currency;
    const std::string_view currency = r.currency.empty() ? std::string_view(src.currency) : r.currency;
    at_src.postings.push_back({r.transfer_id, r.source, PostingKind::debit, r.amount});
    src.write_balance -= r.amount;
    src.write_reserved += r.amount;  // held for its reversal until the end of its saga
    src.low = std::min(src.low.value_or(src.write_balance), src.write_balance);
    src.reserved_high = std::max<std::int64_t>(src.reserved_high.value_or(0), static_cast<std::int64_t>(src.write_reserved));
    if (!dst.exists) {  // the credit, seeing the debit (the same account twice included)
      reason = Reason::unknown_account;
    } else if (dst.locked) {
      reason = Reason::account_locked;
    } else if (!currency.empty() && !dst.currency.empty() && dst.currency != currency) {
      reason = Reason::currency_mismatch;
    } else if (static_cast<WideAmount>(dst.write_balance) + dst.write_reserved + r.amount > kMax) {
      reason = Reason::overflow;
      dst.refused = true;
    }
    if (reason == Reason::none) {
      at_dst.postings.push_back({r.transfer_id, r.destination, PostingKind::credit, r.amount});
      dst.write_balance += r.amount;
      const auto sum = static_cast<std::int64_t>(dst.write_balance + dst.write_reserved);  // <= INT64_MAX: checked
      dst.sum_high = std::max(dst.sum_high.value_or(sum), sum);
      out.outcome = TransferState::done;
    } else {  // the credit voided, the debit reversed
      out.reason = reason;
      at_dst.voids.push_back({r.transfer_id, r.destination, true});
      at_src.postings.push_back({r.transfer_id, r.source, PostingKind::reverse_debit, r.amount});
      src.write_balance += r.amount;
    }
    src.write_reserved -= r.amount;  // released, or given back by the reversal
  }
  // Every account read, moved or not: each is locked and checked with the
  // moves. The cache keeps each as the walk leaves it, but an account with a
  // refused leg, whose move stands only on the row exactly as read: the
  // next walk reads it.
  for (const AccountSnap& a : snaps_) {
    if (!a.exists) continue;
    if (a.write_reserved != a.reserved) return Status::fatal("engine: a walk left account " + std::string(a.id) + "'s reservation changed");
    walk_[a.shard].balances.push_back({a.id, a.balance, a.write_balance, a.reserved, a.min_balance, a.currency,
                                       a.locked, a.low, a.reserved_high, a.sum_high, a.refused});
    if (a.refused) {
      walk_cache_.forget(a.id, a.hash);
      continue;
    }
    Account& known = walk_cache_.put(a.id, a.hash);
    known.balance = a.write_balance;
    known.reserved = a.reserved;
    known.min_balance = a.min_balance;
    known.currency.assign(a.currency);
    known.locked = a.locked;
  }
  for (std::size_t s = 0; s < walk_.size(); ++s) {
    const WalkWrites& w = walk_[s];
    if (w.postings.empty() && w.voids.empty() && w.balances.empty()) continue;
    Status st = with_retries("walk", [&] {
      if (Status fp = SAGA_FAILPOINT("before_walk"); !fp) return fp;
      Status r = ledger_.shard(s).write_walk(w.postings, w.voids, w.balances);
      if (!r) return r;
      return SAGA_FAILPOINT("after_walk");
    });
    if (!st) return st;
  }
  return Status::ok();
}

// The slot of account id in this batch's table; a new id gets a new slot
// at the end, listed with its shard for the reads.
std::uint32_t SagaEngine::slot_of(std::string_view id) {
  const std::size_t mask = slot_index_.size() - 1;
  const std::size_t hash = std::hash<std::string_view>{}(id);
  for (std::size_t h = hash & mask;; h = (h + 1) & mask) {
    std::uint32_t& entry = slot_index_[h];
    if (entry == 0) {
      AccountSnap& a = snaps_.emplace_back();
      a.id = id;
      a.hash = hash;
      a.shard = static_cast<std::uint32_t>(ledger_.shard_index(id));
      entry = static_cast<std::uint32_t>(snaps_.size());
      snapshot_ids_[a.shard].push_back(id);
      snapshot_slots_[a.shard].push_back(entry - 1);
    }
    if (snaps_[entry - 1].id == id) return entry - 1;
  }
}

Status SagaEngine::load_snapshot(std::vector<SagaItem>& items, bool lock, bool cached) {
  snaps_.clear();
  item_slots_.clear();
  for (auto& ids : snapshot_ids_) ids.clear();
  for (auto& slots : snapshot_slots_) slots.clear();
  std::size_t capacity = 64;
  while (capacity < 4 * pending_.size()) capacity *= 2;  // at most half full: two accounts an item
  slot_index_.assign(capacity, 0);
  for (std::size_t i : pending_) item_slots_.push_back({slot_of(items[i].source), slot_of(items[i].destination)});
  const auto started = Clock::now();
  if (cached && !lock) {  // what the cache holds is not read
    for (std::size_t s = 0; s < snapshot_ids_.size(); ++s) {
      std::size_t kept = 0;
      for (std::size_t j = 0; j < snapshot_ids_[s].size(); ++j) {
        AccountSnap& a = snaps_[snapshot_slots_[s][j]];
        if (const Account* known = walk_cache_.find(a.id, a.hash)) {
          a.exists = true;
          a.locked = known->locked;
          a.balance = known->balance;
          a.reserved = known->reserved;
          a.min_balance = known->min_balance;
          a.currency.assign(known->currency);
          continue;
        }
        snapshot_ids_[s][kept] = snapshot_ids_[s][j];
        snapshot_slots_[s][kept++] = snapshot_slots_[s][j];
      }
      snapshot_ids_[s].resize(kept);
      snapshot_slots_[s].resize(kept);
    }
  }
  // Across stores the first store comes last: the walk's moves lock the
  // others with their PREPAREs and the first with its COMMIT, so a walk
  // that reads locked takes them in that order too (batches never wait on
  // each other across servers in a cycle, which no server could see).
  const std::size_t count = snapshot_ids_.size();
  for (std::size_t k = 0; k < count; ++k) {
    const std::size_t s = across_ ? (k + 1) % count : k;
    if (snapshot_ids_[s].empty()) continue;
    snapshot_.resize(snapshot_ids_[s].size());
    Status st = with_retries("plan", [&] {
      if (Status fp = SAGA_FAILPOINT("before_plan"); !fp) return fp;
      Status r = lock ? ledger_.shard(s).load_accounts(snapshot_ids_[s], snapshot_)
                      : ledger_.shard(s).read_accounts(snapshot_ids_[s], snapshot_);
      if (!r) return r;
      return SAGA_FAILPOINT("after_plan");
    });
    if (st.kind() == ErrorKind::fatal) return st;
    if (!st) {
      for (std::size_t i : pending_) items[i].dropped = true;
      pending_.clear();
      return Status::ok();
    }
    for (std::size_t j = 0; j < snapshot_ids_[s].size(); ++j) {
      AccountSnap& a = snaps_[snapshot_slots_[s][j]];
      a.exists = snapshot_[j].has_value();
      if (!a.exists) continue;
      a.locked = snapshot_[j]->locked;
      a.balance = snapshot_[j]->balance;
      a.reserved = snapshot_[j]->reserved;
      a.min_balance = snapshot_[j]->min_balance;
      a.currency = snapshot_[j]->currency;
    }
  }
  observer_->on_stage("plan", Clock::now() - started);
  return Status::ok();
}

void SagaEngine::plan_wave(std::vector<SagaItem>& items) {
  wave_.clear();
  deferred_.clear();
  for (AccountSnap& a : snaps_) {
    a.write_balance = a.balance;
    a.sequential_balance = a.balance;
    a.write_reserved = a.reserved;
    a.credited = 0;
    a.blocked = false;
  }
  constexpr WideAmount kMax = INT64_MAX;
  for (std::size_t k = 0; k < pending_.size(); ++k) {
    const std::size_t i = pending_[k];
    const SagaItem& it = items[i];
    AccountSnap& src = snaps_[item_slots_[k].source];
    AccountSnap& dst = snaps_[item_slots_[k].destination];
    auto defer = [&] {
      deferred_.push_back(i);
      src.blocked = dst.blocked = true;
    };
    if (src.blocked || dst.blocked) {
      defer();
      continue;
    }
    const bool currency_ok =
        it.currency.empty() || src.currency.empty() || it.currency == src.currency;
    if (!src.exists || src.locked || !currency_ok) {  // refused at the debit either way
      wave_.push_back(i);
      continue;
    }
    // One by one, every earlier transfer of the batch has finished (released
    // or reversed) when this one starts: its debit sees the sequential
    // balance and the snapshot's reservation. In the wave, debits land
    // first, each seeing the wave's earlier debits (balance and
    // reservation), and credits after all debits, each seeing
    // balance + reserved as of the snapshot (debits leave it unchanged)
    // plus the wave's earlier credits; releases and reversals come after
    // the wave. Where that changes an outcome, the transfer waits for a
    // later wave (where, first on its accounts, it sees what one by one
    // would).
    std::int64_t write_next = 0;
    std::int64_t seq_next = 0;
    const bool write_ok = !__builtin_sub_overflow(src.write_balance, it.amount, &write_next) &&
                          write_next >= src.min_balance;
    const bool seq_ok = !__builtin_sub_overflow(src.sequential_balance, it.amount, &seq_next) &&
                        seq_next >= src.min_balance;
    if (seq_ok && !write_ok) {
      defer();
      continue;
    }
    if (!seq_ok) {  // insufficient funds either way
      wave_.push_back(i);
      continue;
    }
    if (static_cast<WideAmount>(src.reserved) + it.amount > kMax) {  // overflow either way
      wave_.push_back(i);
      continue;
    }
    if (src.write_reserved + it.amount > kMax) {
      defer();
      continue;
    }
    const std::string& currency = it.currency.empty() ? src.currency : it.currency;
    const bool credit_accepted = dst.exists && !dst.locked &&
                                 (currency.empty() || dst.currency.empty() || currency == dst.currency);
    const WideAmount seq_total = static_cast<WideAmount>(dst.sequential_balance) + dst.reserved;
    const WideAmount wave_total = static_cast<WideAmount>(dst.balance) + dst.reserved + dst.credited;
    const bool credit_ok = credit_accepted && seq_total + it.amount <= kMax;
    if (credit_ok && wave_total + it.amount > kMax) {
      defer();
      continue;
    }
    wave_.push_back(i);
    src.write_balance = write_next;
    src.write_reserved += it.amount;
    src.sequential_balance = seq_next;
    if (credit_ok) {
      dst.sequential_balance += it.amount;
      dst.credited += it.amount;
    } else {
      src.sequential_balance += it.amount;  // one by one, reversed at once
    }
  }
}

Status SagaEngine::post_wave(std::vector<SagaItem>& items) {
  // Debits for the wave, then credits for those whose debit is in the
  // journal: a transfer with both legs posted always rolls forward.
  for (ShardBatch& b : shards_) b.clear();
  for (std::size_t i : wave_) {
    const SagaItem& it = items[i];
    ShardBatch& b = shards_[ledger_.shard_index(it.source)];
    b.legs.push_back({LegOp::debit, it.id, it.source, it.amount, it.currency});
    b.item.push_back(i);
  }
  if (Status s = run_legs(shards_, "debit"); !s) return s;

  for (ShardBatch& b : followups_) b.clear();
  for (ShardBatch& d : shards_) {
    for (std::size_t k = 0; k < d.legs.size(); ++k) {
      SagaItem& it = items[d.item[k]];
      if (d.failed) {
        it.dropped = true;
        continue;
      }
      const LegResult& r = d.results[k];
      switch (r.status) {
        case LegStatus::posted:
        case LegStatus::already_posted: {
          if (it.currency.empty()) it.currency = r.account_currency;
          ShardBatch& c = followups_[ledger_.shard_index(it.destination)];
          c.legs.push_back({LegOp::credit, it.id, it.destination, it.amount, it.currency});
          c.item.push_back(d.item[k]);
          break;
        }
        case LegStatus::refused:
          transitions_.push_back({d.item[k], TransferState::canceling, r.reason});
          break;
        case LegStatus::voided:  // canceled by someone else: our epoch is stale
          it.dropped = true;
          break;
        default:
          return unexpected(d.legs[k], r.status);
      }
    }
  }
  if (Status s = run_legs(followups_, "credit"); !s) return s;
  for (ShardBatch& c : followups_) {
    for (std::size_t k = 0; k < c.legs.size(); ++k) {
      SagaItem& it = items[c.item[k]];
      if (c.failed) {
        it.dropped = true;
        continue;
      }
      const LegResult& r = c.results[k];
      switch (r.status) {
        case LegStatus::posted:
        case LegStatus::already_posted:
          transitions_.push_back({c.item[k], TransferState::applied, Reason::none});
          break;
        case LegStatus::refused:
          transitions_.push_back({c.item[k], TransferState::canceling, r.reason});
          break;
        case LegStatus::voided:
          it.dropped = true;
          break;
        default:
          return unexpected(c.legs[k], r.status);
      }
    }
  }
  return write_transitions(items, "apply");
}

Status SagaEngine::step_compensate_and_release(std::vector<SagaItem>& items) {
  // Compensation voids the credit before touching the debit, so a zombie can
  // never credit a transfer whose debit was reversed.
  for (ShardBatch& b : shards_) b.clear();
  bool any = false;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const SagaItem& it = items[i];
    if (it.dropped) continue;
    if (it.settled) {  // its legs are done
      if (it.state == TransferState::canceling) {
        transitions_.push_back({i, TransferState::canceled, it.reason});
      } else if (it.state == TransferState::applied) {
        transitions_.push_back({i, TransferState::done, Reason::none});
      }
      continue;
    }
    if (it.state == TransferState::canceling) {
      ShardBatch& b = shards_[ledger_.shard_index(it.destination)];
      b.legs.push_back({LegOp::cancel_credit, it.id, it.destination, it.amount, {}});
      b.item.push_back(i);
      any = true;
    } else if (it.state == TransferState::applied) {
      for (std::string_view account : {std::string_view(it.source), std::string_view(it.destination)}) {
        ShardBatch& b = shards_[ledger_.shard_index(account)];
        b.legs.push_back({LegOp::release, it.id, account, it.amount, {}});
        b.item.push_back(i);
      }
      any = true;
    }
  }
  if (!any) return write_transitions(items, "finish");
  if (Status s = run_legs(shards_, "cleanup"); !s) return s;

  // Items whose credit is now void get their debit reversed (or voided).
  for (ShardBatch& b : followups_) b.clear();
  for (ShardBatch& b : shards_) {
    for (std::size_t k = 0; k < b.legs.size(); ++k) {
      SagaItem& it = items[b.item[k]];
      if (b.failed) {
        it.dropped = true;
        continue;
      }
      const LegResult& r = b.results[k];
      if (b.legs[k].op == LegOp::release) {
        if (r.status != LegStatus::released) return unexpected(b.legs[k], r.status);
        continue;
      }
      if (r.status == LegStatus::credit_posted) {
        transitions_.push_back({b.item[k], TransferState::applied, Reason::none});
      } else if (r.status == LegStatus::voided) {
        ShardBatch& d = followups_[ledger_.shard_index(it.source)];
        d.legs.push_back({LegOp::cancel_debit, it.id, it.source, it.amount, {}});
        d.item.push_back(b.item[k]);
      } else {
        return unexpected(b.legs[k], r.status);
      }
    }
  }
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!items[i].dropped && !items[i].settled && items[i].state == TransferState::applied) {
      transitions_.push_back({i, TransferState::done, Reason::none});
    }
  }

  if (Status s = run_legs(followups_, "compensate"); !s) return s;
  for (ShardBatch& b : followups_) {
    for (std::size_t k = 0; k < b.legs.size(); ++k) {
      SagaItem& it = items[b.item[k]];
      if (b.failed) {
        it.dropped = true;
        continue;
      }
      const LegStatus st = b.results[k].status;
      if (st != LegStatus::reversed && st != LegStatus::voided) return unexpected(b.legs[k], st);
      transitions_.push_back({b.item[k], TransferState::canceled, it.reason});
    }
  }
  return write_transitions(items, "finish");
}

Status SagaEngine::write_transitions(std::vector<SagaItem>& items, const char* stage) {
  if (transitions_.empty()) return Status::ok();
  const auto started = Clock::now();
  transition_batch_.clear();
  written_.clear();
  outcome_.assign(transitions_.size(), Outcome::refused);
  for (std::size_t k = 0; k < transitions_.size(); ++k) {
    const Pending& p = transitions_[k];
    const SagaItem& it = items[p.item];
    if (!is_legal_transition(it.state, p.to)) {
      return Status::fatal("engine attempted illegal transition " + std::string(to_string(it.state)) +
                           " -> " + std::string(to_string(p.to)) + " for transfer " + it.id);
    }
    // A transfer inserted in this very transaction cannot be owned by anyone
    // else and its intermediate states are never visible outside it: only
    // its final state is written, once. Outside a batch transaction (several
    // stores, MongoDB) each stage commits on its own, and only what recovery
    // must know is written: the end, and `canceling` before any compensation
    // leg runs (recovery from `pending` would otherwise find the credit void
    // and stop). `pending` and `applied` are not: recovery from the state
    // before them posts the same legs again, which the journal reports as
    // already posted, and a paused owner's legs are fenced by the voids
    // either way.
    if (scoped_ ? it.fresh && !is_terminal(p.to)
                : p.to == TransferState::pending || p.to == TransferState::applied) {
      outcome_[k] = scoped_ ? Outcome::coalesced : Outcome::unwritten;
      continue;
    }
    written_.push_back(k);
    transition_batch_.push_back({it.id, stored_[p.item], p.to, p.reason, options_.owner, it.epoch});
  }
  applied_.assign(transition_batch_.size(), 0);
  Status s = Status::ok();
  std::int64_t written_at_ms = 0;
  if (!transition_batch_.empty()) {
    s = with_retries("transition", [&] {
      if (Status fp = SAGA_FAILPOINT("before_", stage); !fp) return fp;
      Status r = ledger_.transfers().transition(transition_batch_, options_.lease_ms, applied_,
                                                &written_at_ms);
      if (!r) return r;
      return SAGA_FAILPOINT("after_", stage);
    });
  }
  if (s.kind() == ErrorKind::fatal) {
    transitions_.clear();
    return s;
  }
  // Expand the store's answers back onto every queued transition.
  for (std::size_t w = 0; w < written_.size(); ++w) {
    outcome_[written_[w]] = s.is_ok() && applied_[w] ? Outcome::written : Outcome::refused;
  }
  // Per (from, to): the unwritten transitions this write confirmed, which
  // came first, and the ones it made.
  using Counts = std::array<std::array<std::size_t, kTransferStateCount>, kTransferStateCount>;
  std::array<Counts, 2> counts{};
  auto count = [&](std::size_t which, TransferState from, TransferState to) {
    ++counts[which][static_cast<std::size_t>(from)][static_cast<std::size_t>(to)];
  };
  for (std::size_t k = 0; k < transitions_.size(); ++k) {
    const std::size_t i = transitions_[k].item;
    SagaItem& it = items[i];
    const TransferState to = transitions_[k].to;
    if (outcome_[k] == Outcome::refused) {
      it.dropped = true;  // fenced out, or left for recovery after a store error
      continue;
    }
    // Unwritten transitions count once a later write shows the item was
    // still ours (metrics count what the store holds, not a zombie's
    // replay). They lead from the stored state into `pending`, then
    // `applied`, so the stored state and the item's give them.
    if (outcome_[k] == Outcome::written && !scoped_) {
      TransferState from = stored_[i];
      if (from == TransferState::initial && it.state != from) {
        count(0, from, TransferState::pending);
        from = TransferState::pending;
      }
      if (it.state == TransferState::applied && from != it.state) count(0, from, it.state);
    }
    if (outcome_[k] != Outcome::unwritten) count(1, it.state, to);
    if (outcome_[k] == Outcome::written) stored_[i] = to;
    if (to == TransferState::canceling) {
      log_event(spdlog::level::info, "compensating: a leg was refused",
                {{"transfer_id", it.id}, {"reason", to_string(transitions_[k].reason)},
                 {"from_state", to_string(it.state)}, {"worker", options_.owner}});
    }
    if (to == TransferState::canceled) observer_->on_compensation(transitions_[k].reason);
    it.state = to;
    it.reason = transitions_[k].reason;
    if (is_terminal(it.state)) it.finished_at_ms = written_at_ms;
  }
  transitions_.clear();
  for (const Counts& c : counts) {
    for (std::size_t f = 0; f < c.size(); ++f) {
      for (std::size_t t = 0; t < c[f].size(); ++t) {
        if (c[f][t] != 0) {
          observer_->on_transitions(static_cast<TransferState>(f), static_cast<TransferState>(t), c[f][t]);
        }
      }
    }
  }
  observer_->on_stage(stage, Clock::now() - started);
  return Status::ok();
}

}  // namespace sagapool
