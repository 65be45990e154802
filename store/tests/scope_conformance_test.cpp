// Scopes (Store::begin_scope/end_scope): a whole batch in one transaction.
// A backend may keep work in memory inside a scope (SQLite writes balances
// and the pending entries of transfers inserted in the scope behind), so
// these cases check that a scope changes nothing but atomicity: the same
// sagas give the same ledger with and without one, a rolled-back scope
// leaves no trace, and reads inside a scope see the scope's own writes.
#include <limits>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "sagapool/ledger.hpp"
#include "sagapool/saga_engine.hpp"
#include "store_test.hpp"

namespace sagapool::test {
namespace {

const std::vector<Account>& hot_accounts() {
  static const std::vector<Account> accounts = {
      make_account("h0", 1000),          make_account("h1", 500, -300, "EUR"),
      make_account("h2", 0, 0, "USD"),   make_account("h3", 1'000'000),
      make_account("h4", 200, 0, "", true), make_account("h5", 50),
  };
  return accounts;
}

// Everything a saga leaves in a store, in comparable form.
struct LedgerState {
  std::map<std::string, std::int64_t> balances;
  std::map<std::string, std::int64_t> reserved;
  std::set<std::tuple<std::string, std::string, PostingKind, std::int64_t>> postings;
  std::set<std::pair<std::string, std::string>> pending;
  std::map<std::string, std::pair<TransferState, Reason>> transfers;

  static LedgerState read(Store& s, const std::vector<std::string>& ids) {
    LedgerState out;
    EXPECT_TRUE(s.scan_accounts([&](const Account& a) {
                   out.balances[a.id] = a.balance;
                   out.reserved[a.id] = a.reserved;
                 }).is_ok());
    EXPECT_TRUE(s.scan_postings([&](const Posting& p) {
                   out.postings.emplace(p.transfer_id, p.account_id, p.kind, p.amount);
                 }).is_ok());
    EXPECT_TRUE(s.scan_pending([&](const PendingEntry& e) {
                   out.pending.emplace(e.account_id, e.transfer_id);
                 }).is_ok());
    for (const std::string& id : ids) {
      std::optional<TransferDoc> d;
      EXPECT_TRUE(s.load_transfer(id, d).is_ok());
      if (d) out.transfers[id] = {d->state, d->reason};
    }
    return out;
  }
  bool operator==(const LedgerState&) const = default;
};

SagaItem item_of(const TransferSpec& t, bool fresh) {
  SagaItem it;
  it.id = t.id;
  it.source = t.from;
  it.destination = t.to;
  it.currency = t.currency;
  it.amount = t.amount;
  it.epoch = 1;
  it.fresh = fresh;
  return it;
}

std::vector<TransferSpec> random_batch(std::mt19937& rng, int batch, std::size_t size) {
  static const std::vector<std::string> ids = {"h0", "h1", "h2", "h3", "h4", "h5", "ghost"};
  static const std::vector<std::string> currencies = {"", "", "", "EUR", "USD"};
  std::vector<TransferSpec> out;
  for (std::size_t i = 0; i < size; ++i) {
    const std::size_t from = rng() % ids.size();
    const std::size_t to = (from + 1 + rng() % (ids.size() - 1)) % ids.size();
    TransferSpec t = spec("b" + std::to_string(batch) + "-" + std::to_string(i), ids[from], ids[to],
                          static_cast<std::int64_t>(1 + rng() % 700));
    t.currency = currencies[rng() % currencies.size()];
    out.push_back(std::move(t));
  }
  return out;
}

// Counts the batches that ran as whole sagas in one call (the settle stage).
class SettleCounter final : public SagaObserver {
 public:
  void on_transitions(TransferState, TransferState, std::size_t) override {}
  void on_compensation(Reason) override {}
  void on_stage(std::string_view stage, std::chrono::nanoseconds) override { settled += stage == "settle"; }
  void on_store_error(std::string_view, const Status&) override {}
  int settled = 0;
};

class ScopedLedger {
 public:
  explicit ScopedLedger(std::unique_ptr<Store> store) {
    std::vector<std::unique_ptr<Store>> stores;
    stores.push_back(std::move(store));
    ledger_ = Ledger::from_stores(std::move(stores));
    engine_ = std::make_unique<SagaEngine>(*ledger_, SagaEngine::Options{"w1", 60'000, 5}, &observer_);
  }
  Store& store() { return ledger_->shard(0); }
  int settled_batches() const { return observer_.settled; }

  // The worker's way: one scope for the inserts and every stage.
  Status run_batch_in_scope(const std::vector<TransferSpec>& batch, bool commit) {
    std::vector<NewTransfer> news;
    for (const TransferSpec& t : batch) news.push_back(t.to_new());
    std::vector<InsertResult> inserted(news.size());
    if (Status s = store().begin_scope(); !s) return s;
    Status s = store().insert_transfers(news, "w1", 60'000, inserted);
    std::vector<SagaItem> items;
    for (const TransferSpec& t : batch) items.push_back(item_of(t, true));
    if (s) s = engine_->run_in_scope(items);
    if (!s || !commit) {
      store().end_scope(false).ignore();
      return s;
    }
    return store().end_scope(true);
  }

  // The reference: each transfer inserted and run on its own.
  Status run_one_by_one(const std::vector<TransferSpec>& batch) {
    for (const TransferSpec& t : batch) {
      const NewTransfer n = t.to_new();
      InsertResult r{};
      if (Status s = store().insert_transfers(std::span(&n, 1), "w1", 60'000, std::span(&r, 1)); !s) {
        return s;
      }
      std::vector<SagaItem> items = {item_of(t, false)};
      if (Status s = engine_->run(items); !s) return s;
    }
    return Status::ok();
  }

 private:
  SettleCounter observer_;
  std::unique_ptr<Ledger> ledger_;
  std::unique_ptr<SagaEngine> engine_;
};

// Runs `batch` in one scope on `scoped` and one transfer at a time on
// `reference`; both must then hold the same ledger for `ids`.
void expect_batch_as_one_by_one(ScopedLedger& scoped, ScopedLedger& reference,
                                const std::vector<TransferSpec>& batch,
                                const std::vector<std::string>& ids, int b) {
  const int settled_before = scoped.settled_batches();
  SAGA_ASSERT_OK(scoped.run_batch_in_scope(batch, true));
  SAGA_ASSERT_OK(reference.run_one_by_one(batch));
  // Where the store settles whole sagas, the batch took that path (and the
  // one-by-one reference, of transfers not fresh, the legs).
  EXPECT_EQ(scoped.settled_batches() - settled_before, scoped.store().supports_settle_sagas() ? 1 : 0);
  EXPECT_EQ(reference.settled_batches(), 0);
  const LedgerState got = LedgerState::read(scoped.store(), ids);
  const LedgerState want = LedgerState::read(reference.store(), ids);
  ASSERT_EQ(got.balances, want.balances) << "after batch " << b;
  ASSERT_EQ(got.reserved, want.reserved) << "after batch " << b;
  ASSERT_EQ(got.postings, want.postings) << "after batch " << b;
  ASSERT_EQ(got.transfers, want.transfers) << "after batch " << b;
  EXPECT_TRUE(got.pending.empty()) << "every saga finished, so nothing stays pending";
}

TEST_P(StoreTest, SagasInOneScopeMatchSagasOneByOne) {
  if (!store_->supports_scope()) GTEST_SKIP() << GetParam() << " has no scopes";
  SAGA_ASSERT_OK(store_->create_accounts(hot_accounts()));
  auto other = fresh_store();
  ASSERT_NE(other, nullptr);
  SAGA_ASSERT_OK(other->create_accounts(hot_accounts()));
  ScopedLedger scoped(std::move(store_));
  ScopedLedger reference(std::move(other));

  std::mt19937 rng(20261121);
  std::vector<std::string> ids;
  std::size_t canceled = 0;
  for (int b = 0; b < 12; ++b) {
    const auto batch = random_batch(rng, b, 1 + rng() % 30);
    for (const TransferSpec& t : batch) ids.push_back(t.id);
    ASSERT_NO_FATAL_FAILURE(expect_batch_as_one_by_one(scoped, reference, batch, ids, b));
  }
  for (const auto& [id, st] : LedgerState::read(scoped.store(), ids).transfers) {
    canceled += st.first == TransferState::canceled;
  }
  // The mix must exercise both outcomes, or the comparison proves little.
  EXPECT_GT(canceled, 10U);
  EXPECT_LT(canceled, ids.size() - 10);
}

// Near INT64_MAX the order of a batch's legs matters: credits are refused
// for overflow when they would eat the room reserved for reversals, and a
// batch posts its debits before its credits and releases after both. The
// planner must defer what would come out differently, so a batch still
// gives the one-by-one result.
TEST_P(StoreTest, SagasNearInt64MaxInOneScopeMatchSagasOneByOne) {
  if (!store_->supports_scope()) GTEST_SKIP() << GetParam() << " has no scopes";
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  const std::vector<Account> accounts = {
      make_account("e0", kMax - 3000), make_account("e1", kMax - 400),
      make_account("e2", 2000),        make_account("e3", 0, -5000),
      make_account("e4", kMax / 2),
  };
  SAGA_ASSERT_OK(store_->create_accounts(accounts));
  auto other = fresh_store();
  ASSERT_NE(other, nullptr);
  SAGA_ASSERT_OK(other->create_accounts(accounts));
  ScopedLedger scoped(std::move(store_));
  ScopedLedger reference(std::move(other));

  std::mt19937 rng(9223372);
  std::vector<std::string> ids;
  std::map<Reason, std::size_t> reasons;
  for (int b = 0; b < 30; ++b) {
    std::vector<TransferSpec> batch;
    const std::size_t size = 1 + rng() % 25;
    for (std::size_t i = 0; i < size; ++i) {
      const std::size_t from = rng() % accounts.size();
      const std::size_t to = (from + 1 + rng() % (accounts.size() - 1)) % accounts.size();
      std::int64_t amount = static_cast<std::int64_t>(1 + rng() % 2500);
      if (rng() % 10 == 0) amount = kMax / static_cast<std::int64_t>(2 + rng() % 3);
      batch.push_back(spec("n" + std::to_string(b) + "-" + std::to_string(i), accounts[from].id,
                           accounts[to].id, amount));
      ids.push_back(batch.back().id);
    }
    ASSERT_NO_FATAL_FAILURE(expect_batch_as_one_by_one(scoped, reference, batch, ids, b));
  }
  for (const auto& [id, st] : LedgerState::read(scoped.store(), ids).transfers) ++reasons[st.second];
  // The mix must reach the edges, or the comparison proves little.
  const std::string mix = "overflow " + std::to_string(reasons[Reason::overflow]) +
                          ", insufficient_funds " + std::to_string(reasons[Reason::insufficient_funds]) +
                          ", done " + std::to_string(reasons[Reason::none]);
  EXPECT_GE(reasons[Reason::overflow], 8U) << mix;
  EXPECT_GE(reasons[Reason::insufficient_funds], 10U) << mix;
  EXPECT_GE(reasons[Reason::none], 100U) << mix;
}

TEST_P(StoreTest, ARolledBackScopeLeavesNoTrace) {
  if (!store_->supports_scope()) GTEST_SKIP() << GetParam() << " has no scopes";
  SAGA_ASSERT_OK(store_->create_accounts(hot_accounts()));
  ScopedLedger ledger(std::move(store_));
  std::mt19937 rng(7);
  const auto committed = random_batch(rng, 0, 20);
  SAGA_ASSERT_OK(ledger.run_batch_in_scope(committed, true));
  std::vector<std::string> ids;
  for (const TransferSpec& t : committed) ids.push_back(t.id);
  const auto rolled_back = random_batch(rng, 1, 20);
  for (const TransferSpec& t : rolled_back) ids.push_back(t.id);
  const LedgerState before = LedgerState::read(ledger.store(), ids);

  SAGA_ASSERT_OK(ledger.run_batch_in_scope(rolled_back, false));
  EXPECT_TRUE(LedgerState::read(ledger.store(), ids) == before);
  // The same batch again, committed this time, runs as if for the first time.
  SAGA_ASSERT_OK(ledger.run_batch_in_scope(rolled_back, true));
  const LedgerState after = LedgerState::read(ledger.store(), ids);
  EXPECT_EQ(after.transfers.size(), ids.size());
  EXPECT_GT(after.postings.size(), before.postings.size());
}

TEST_P(StoreTest, ReadsInsideAScopeSeeItsWrites) {
  if (!store_->supports_scope()) GTEST_SKIP() << GetParam() << " has no scopes";
  create({make_account("acct-a", 500), make_account("acct-b", 0)});
  SAGA_ASSERT_OK(store_->begin_scope());
  const TransferSpec t1 = spec("t-1", "acct-a", "acct-b", 120);
  ASSERT_EQ(insert(t1), InsertResult::inserted);
  // The same id again in the same scope: a duplicate, or a conflict.
  const TransferSpec changed = spec("t-1", "acct-a", "acct-b", 121);
  const NewTransfer again[] = {t1.to_new(), changed.to_new()};
  InsertResult again_results[2]{};
  SAGA_ASSERT_OK(store_->insert_transfers(again, "w1", 60'000, again_results));
  EXPECT_EQ(again_results[0], InsertResult::duplicate);
  EXPECT_EQ(again_results[1], InsertResult::conflict);
  EXPECT_EQ(leg(LegOp::debit, "t-1", "acct-a", 120).status, LegStatus::posted);
  EXPECT_TRUE(transition("t-1", TransferState::initial, TransferState::pending, "w1", 1));
  EXPECT_FALSE(transition("t-1", TransferState::initial, TransferState::pending, "w1", 1));
  EXPECT_EQ(load("t-1").state, TransferState::pending);

  const std::string_view ids[] = {"acct-a"};
  std::optional<Account> snapshot[1];
  SAGA_ASSERT_OK(store_->load_accounts(ids, snapshot));
  ASSERT_TRUE(snapshot[0].has_value());
  EXPECT_EQ(snapshot[0]->balance, 380);
  EXPECT_EQ(snapshot[0]->reserved, 120);
  EXPECT_EQ(account("acct-a").balance, 380);
  EXPECT_EQ(pending("acct-a"), std::vector<std::string>{"t-1"});
  // A leg after a read still lands, and a release after the pending entry
  // was read removes it.
  EXPECT_EQ(leg(LegOp::credit, "t-1", "acct-b", 120).status, LegStatus::posted);
  EXPECT_EQ(leg(LegOp::debit, "t-1", "acct-a", 120).status, LegStatus::already_posted);
  EXPECT_EQ(leg(LegOp::release, "t-1", "acct-a", 120).status, LegStatus::released);
  SAGA_ASSERT_OK(store_->end_scope(true));
  EXPECT_EQ(account("acct-a").balance, 380);
  EXPECT_EQ(account("acct-a").reserved, 0);
  EXPECT_EQ(account("acct-b").balance, 120);
  EXPECT_TRUE(pending("acct-a").empty());
  EXPECT_EQ(pending("acct-b"), std::vector<std::string>{"t-1"});
  expect_balances_match_postings(*store_);
}

}  // namespace
}  // namespace sagapool::test
