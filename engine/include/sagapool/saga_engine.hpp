#pragma once
// The saga stage engine: drives batches of transfers through
// initial -> pending -> applied -> done, or -> canceling -> canceled, with one
// conditional write per record per stage and one store round trip per stage
// per shard for the whole batch (DESIGN.md, "States and stages").
//
// Zombie safety: every transfer write is fenced by (owner, epoch); legs are
// idempotent through the posting journal, and compensation voids a leg
// before it can post, so a paused worker that wakes up can neither post a
// leg of a canceled transfer nor move a transfer backwards.
#include <chrono>
#include <cstdint>
#include <string>
#include <optional>
#include <string_view>
#include <unordered_set>
#include <vector>

#include "sagapool/account_cache.hpp"
#include "sagapool/domain.hpp"
#include "sagapool/ledger.hpp"
#include "sagapool/status.hpp"

namespace sagapool {

// What the engine reports as it goes (metrics live behind this).
class SagaObserver {
 public:
  virtual ~SagaObserver() = default;
  virtual void on_transitions(TransferState from, TransferState to, std::size_t count) = 0;
  virtual void on_compensation(Reason reason) = 0;
  virtual void on_stage(std::string_view stage, std::chrono::nanoseconds elapsed) = 0;
  virtual void on_store_error(std::string_view op, const Status& error) = 0;
};

// An observer that records nothing, for tools and tests.
class NullObserver final : public SagaObserver {
 public:
  void on_transitions(TransferState, TransferState, std::size_t) override {}
  void on_compensation(Reason) override {}
  void on_stage(std::string_view, std::chrono::nanoseconds) override {}
  void on_store_error(std::string_view, const Status&) override {}
};

// One transfer as the engine carries it through a batch.
struct SagaItem {
  std::string id;
  std::string source;
  std::string destination;
  std::string currency;  // the request's, or the source account's once debited
  // The request's own currency (empty when absent) and metadata, echoed in
  // its outcome.
  std::string requested_currency;
  std::string metadata;
  std::int64_t amount = 0;
  std::int64_t epoch = 0;
  std::int64_t requested_at_ms = 0;
  std::int64_t finished_at_ms = 0;  // the store's time of the terminal write
  TransferState state = TransferState::initial;
  Reason reason = Reason::none;
  // Set when a conditional write did not apply (another owner took over) or a
  // store error left the item for recovery: the engine stops touching it.
  bool dropped = false;
  // Inserted (state initial, epoch 1) in the transaction the engine runs in
  // (run_in_scope): only its final state needs writing.
  bool fresh = false;
  // Its legs ran whole in one Store::settle_sagas call: only its transitions are
  // left to write.
  bool settled = false;

  void assign(const TransferDoc& doc);
};

class SagaEngine {
 public:
  struct Options {
    std::string owner;
    std::int64_t lease_ms = 30'000;
    int call_retries = 5;  // retry_call errors are retried this often per call
  };

  SagaEngine(Ledger& ledger, Options options, SagaObserver* observer);
  ~SagaEngine();
  SagaEngine(const SagaEngine&) = delete;
  SagaEngine& operator=(const SagaEngine&) = delete;

  // Advances every item (owned at item.epoch) until it is terminal or
  // dropped. Returns a non-ok Status only for fatal errors; transient store
  // errors drop the affected items, which recovery picks up after their lease.
  Status run(std::vector<SagaItem>& items);

  // The same, inside a scope the caller opened on the only store, or on the
  // first of several for the items split_first_store kept (see
  // Store::begin_scope), so the caller can add its own writes to the same
  // transaction. Any failed store call fails the whole run: the caller must
  // then end_scope(false) and treat every item as not run.
  Status run_in_scope(std::vector<SagaItem>& items);

  // Several stores, each with a scope the caller opened (the first holding
  // the batch's inserts), all of which can prepare (Store::supports_prepare):
  // runs every item whole, in batch order, as one store's settle_sagas does.
  // Each store reads the batch's accounts it holds (read_accounts, but for
  // those the last walks left known in walk_cache_; or load_accounts,
  // locked, after lock_next_walk or for an unknown account);
  // the sagas are walked here over what they read; each store is sent what
  // they write there (write_walk), its moves locking the accounts last. The
  // caller then prepares the other stores' scopes and commits the first
  // (TwoPhaseBatch). Any failed store call fails the whole run, as in
  // run_in_scope.
  Status run_across(std::vector<SagaItem>& items);
  // The next run_across reads its accounts locked from the start, instead
  // of locking them with its writes: after a batch whose moves did not
  // stand (the accounts changed meanwhile), so that it cannot fail again.
  // The walks after it read their accounts from the stores, not from
  // walk_cache_, until kWalksUncached have run.
  void lock_next_walk() {
    lock_next_walk_ = true;
    walks_uncached_ = kWalksUncached;
  }

  // Several stores, before run_in_scope in a scope the caller opened on the
  // first (holding the batch's inserts): moves to `rest`, in batch order,
  // every item with an account on another store, and every later item that
  // shares an account with one moved. What stays runs whole in that
  // transaction; `rest` runs after its commit, stage by stage (run). Each
  // account still sees the batch's transfers in batch order.
  void split_first_store(std::vector<SagaItem>& items, std::vector<SagaItem>& rest);

 private:
  struct ShardBatch;
  // What the planner knows of an account during one batch.
  // Sums of a wave's amounts may pass INT64_MAX; the planner compares them.
  __extension__ typedef __int128 WideAmount;
  struct AccountSnap {
    std::string_view id;      // an item's source or destination
    std::size_t hash = 0;     // std::hash of id
    std::uint32_t shard = 0;  // ledger_.shard_index(id)
    bool exists = false;
    bool locked = false;
    bool blocked = false;  // touched by a deferred transfer in this wave
    std::int64_t balance = 0;
    std::int64_t reserved = 0;
    std::int64_t min_balance = 0;
    std::int64_t write_balance = 0;       // as the wave's debits will see it
    std::int64_t sequential_balance = 0;  // as one-by-one processing would
    WideAmount write_reserved = 0;        // as the wave's debits will see it
    WideAmount credited = 0;              // the wave's credits planned so far
    std::string currency;
    // walk_across: what its passed checks compared (BalanceMove).
    std::optional<std::int64_t> low;
    std::optional<std::int64_t> reserved_high;
    std::optional<std::int64_t> sum_high;
    bool refused = false;
  };
  // What a walk across stores writes on one store.
  struct WalkWrites {
    std::vector<WalkPosting> postings;
    std::vector<WalkVoid> voids;
    std::vector<BalanceMove> balances;
  };
  Status run_rounds(std::vector<SagaItem>& items);
  Status flush_coalesced(std::vector<SagaItem>& items);
  Status step_initial(std::vector<SagaItem>& items);
  Status step_legs(std::vector<SagaItem>& items);
  Status settle_pending(std::vector<SagaItem>& items);
  Status walk_across(std::vector<SagaItem>& items);
  // `cached` (unless `lock`): only the accounts walk_cache_ does not hold are read.
  Status load_snapshot(std::vector<SagaItem>& items, bool lock = true, bool cached = false);
  std::uint32_t slot_of(std::string_view id);
  void plan_wave(std::vector<SagaItem>& items);
  Status post_wave(std::vector<SagaItem>& items);
  Status step_compensate_and_release(std::vector<SagaItem>& items);
  Status write_transitions(std::vector<SagaItem>& items, const char* stage);
  Status run_legs(std::vector<ShardBatch>& shards, const char* stage);
  // Retries retry_call errors with backoff; inside a scope a failed call
  // fails the whole run instead (its transaction must be rolled back).
  template <typename Call>
  Status with_retries(std::string_view op, Call&& call);
  template <typename Call>
  Status with_retries_unscoped(std::string_view op, Call&& call);

  Ledger& ledger_;
  Options options_;
  SagaObserver* observer_;

  // Reused across batches so the hot path does not allocate per transfer.
  struct Pending {
    std::size_t item;
    TransferState to;
    Reason reason;
  };
  std::vector<Pending> transitions_;
  std::vector<Transition> transition_batch_;
  std::vector<std::uint8_t> applied_;
  std::vector<std::size_t> written_;          // transitions_ sent to the store
  // Per transitions_ entry: what became of it.
  enum class Outcome : std::uint8_t {
    refused,    // not applied by the store (or its write failed)
    written,    // applied by the store
    coalesced,  // left to the batch transaction's final write of the item
    unwritten,  // not needed by recovery, so not written (no batch transaction)
  };
  std::vector<Outcome> outcome_;
  std::vector<TransferState> stored_;  // per item: the state its store row holds
  std::vector<ShardBatch> shards_;     // first legs of a stage, per shard
  std::vector<ShardBatch> followups_;  // legs that depend on their results
  std::vector<std::size_t> pending_;   // items to post, in batch order
  std::vector<std::size_t> wave_;
  std::vector<std::size_t> deferred_;
  // The accounts of pending_'s items, in order of first appearance (slots);
  // item_slots_[k] holds pending_[k]'s source and destination slots.
  // slot_index_ is an open-addressing table over the slots (slot + 1;
  // 0 = free). Flat and reused, so a batch's walk hashes each id once and
  // allocates nothing.
  struct ItemSlots {
    std::uint32_t source;
    std::uint32_t destination;
  };
  std::vector<AccountSnap> snaps_;
  std::vector<std::uint32_t> slot_index_;
  std::vector<ItemSlots> item_slots_;
  std::vector<std::vector<std::string_view>> snapshot_ids_;  // per shard
  std::vector<std::vector<std::uint32_t>> snapshot_slots_;   // per shard, as snapshot_ids_
  std::vector<std::optional<Account>> snapshot_;
  std::unordered_set<std::string_view> held_;  // split_first_store: accounts of items moved
  std::vector<std::uint8_t> stays_;
  std::vector<SettleRequest> settle_batch_;
  std::vector<SettleResult> settle_results_;
  NullObserver null_observer_;
  std::vector<WalkWrites> walk_;  // per shard
  bool scoped_ = false;        // this run is one transaction on the only store
  bool across_ = false;        // ... or one on each store (run_across)
  bool lock_next_walk_ = false;
  // walk_across's accounts as its last walks left them. 2^18 slots (about
  // 30 MiB, only in a worker with several stores) hold a ledger of 100,000
  // accounts whole; a larger one keeps its accounts walked last.
  static constexpr int kWalksUncached = 64;  // after a failed batch: its accounts may be contended
  AccountCache walk_cache_{std::size_t{1} << 18};
  int walks_uncached_ = 0;
  bool store_failed_ = false;  // a store call failed during this run
};

}  // namespace sagapool
