// The saga engine against a real SQLite ledger (DESIGN.md, "States and
// stages" and "Invariants"): every edge of the state machine, every outcome
// path, idempotent re-runs, batches equal to one-by-one runs (seeded), epoch
// fencing, zombies, operator cancels, roll-forward, and the audit catching a
// corrupted ledger. Each scenario runs on one store and on two stores (legs
// crossing shards).
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "process.hpp"
#include "sagapool/audit.hpp"
#include "sagapool/fault_store.hpp"
#include "sagapool/ledger.hpp"
#include "sagapool/memory_store.hpp"
#include "sagapool/operator_actions.hpp"
#include "sagapool/saga_engine.hpp"
#include "sagapool/two_phase.hpp"

namespace sagapool {
namespace {

using S = TransferState;

constexpr std::int64_t kLeaseMs = 30'000;
constexpr std::string_view kOwner = "worker-a";

// ---- recording ------------------------------------------------------------

struct Edge {
  S from;
  S to;
  std::size_t count;
};

class RecordingObserver final : public SagaObserver {
 public:
  void on_transitions(S from, S to, std::size_t count) override { edges.push_back({from, to, count}); }
  void on_compensation(Reason r) override { compensations.push_back(r); }
  void on_stage(std::string_view, std::chrono::nanoseconds) override {}
  void on_store_error(std::string_view op, const Status& e) override {
    store_errors.push_back(std::string(op) + ": " + e.message());
  }
  std::size_t transitions() const {
    std::size_t n = 0;
    for (const Edge& e : edges) n += e.count;
    return n;
  }
  std::vector<Edge> edges;
  std::vector<Reason> compensations;
  std::vector<std::string> store_errors;
};

// ---- ledger set-up ----------------------------------------------------------

// A transfer request whose strings the test owns: NewTransfer only views them.
struct Req {
  std::string id;
  std::string from;
  std::string to;
  std::int64_t amount = 0;
  std::string currency;
};

struct AccountSpec {
  AccountSpec() = default;
  AccountSpec(std::string id_, std::int64_t balance_, std::int64_t min_balance_ = 0,
              std::string currency_ = "", bool locked_ = false)
      : id(std::move(id_)), balance(balance_), min_balance(min_balance_),
        currency(std::move(currency_)), locked(locked_) {}
  std::string id;
  std::int64_t balance = 0;
  std::int64_t min_balance = 0;
  std::string currency;
  bool locked = false;
};

// A ledger of `stores` SQLite files in `folder`, initialised.
struct LedgerFiles {
  std::vector<std::filesystem::path> files;
  std::unique_ptr<Ledger> ledger;

  Status open(const std::filesystem::path& folder, std::size_t stores) {
    std::filesystem::create_directories(folder);
    std::vector<std::string> urls;
    for (std::size_t i = 0; i < stores; ++i) {
      files.push_back(folder / ("store" + std::to_string(i) + ".db"));
      urls.push_back("sqlite:" + files.back().string());
    }
    if (Status s = Ledger::open(urls, ledger); !s) return s;
    return ledger->init();
  }
  const std::filesystem::path& file_of(std::string_view account) const {
    return files[ledger->shard_index(account)];
  }
};

// The first id "<prefix><n>" that the placement hash puts on `shard`.
std::string id_on_shard(Ledger& ledger, std::string_view prefix, std::size_t shard) {
  for (int n = 0;; ++n) {
    std::string id = std::string(prefix) + std::to_string(n);
    if (ledger.shard_index(id) == shard) return id;
  }
}

Status create_accounts(Ledger& ledger, const std::vector<AccountSpec>& specs) {
  std::vector<std::vector<Account>> per_shard(ledger.shard_count());
  for (const AccountSpec& s : specs) {
    const Account a{.id = s.id, .balance = s.balance, .opening_balance = s.balance,
                    .min_balance = s.min_balance, .currency = s.currency, .locked = s.locked};
    per_shard[ledger.shard_index(s.id)].push_back(a);
  }
  for (std::size_t i = 0; i < per_shard.size(); ++i) {
    if (per_shard[i].empty()) continue;
    if (Status s = ledger.shard(i).create_accounts(per_shard[i]); !s) return s;
  }
  return Status::ok();
}

Status insert(Ledger& ledger, const std::vector<Req>& reqs, std::string_view owner) {
  std::vector<NewTransfer> batch;
  for (const Req& r : reqs) {
    NewTransfer t;
    t.request.id = r.id;
    t.request.from = r.from;
    t.request.to = r.to;
    t.request.amount = r.amount;
    t.request.currency = r.currency;
    t.payload_hash = payload_hash(t.request);
    t.requested_at_ms = 1'700'000'000'000;
    t.origin_topic = "transfers.requests";
    t.origin_partition = 0;
    t.origin_offset = static_cast<std::int64_t>(batch.size());
    batch.push_back(t);
  }
  std::vector<InsertResult> results(batch.size());
  if (Status s = ledger.transfers().insert_transfers(batch, owner, kLeaseMs, results); !s) return s;
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (results[i] != InsertResult::inserted) return Status::fatal("not inserted: " + reqs[i].id);
  }
  return Status::ok();
}

std::optional<TransferDoc> load(Ledger& ledger, std::string_view id) {
  std::optional<TransferDoc> doc;
  EXPECT_TRUE(ledger.transfers().load_transfer(id, doc).is_ok());
  return doc;
}

std::vector<SagaItem> items_for(Ledger& ledger, const std::vector<Req>& reqs) {
  std::vector<SagaItem> items;
  for (const Req& r : reqs) {
    const std::optional<TransferDoc> doc = load(ledger, r.id);
    EXPECT_TRUE(doc.has_value()) << r.id;
    if (doc) items.emplace_back().assign(*doc);
  }
  return items;
}

Status run_engine(Ledger& ledger, std::string_view owner, std::vector<SagaItem>& items,
                  SagaObserver& observer) {
  SagaEngine engine(ledger, {std::string(owner), kLeaseMs, 5}, &observer);
  return engine.run(items);
}

std::map<std::string, std::int64_t> balances(Ledger& ledger) {
  std::map<std::string, std::int64_t> out;
  for (std::size_t i = 0; i < ledger.shard_count(); ++i) {
    EXPECT_TRUE(ledger.shard(i).scan_accounts([&](const Account& a) { out[a.id] = a.balance; }).is_ok());
  }
  return out;
}

std::int64_t balance(Ledger& ledger, const std::string& id) {
  std::optional<Account> a;
  EXPECT_TRUE(ledger.shard_for(id).load_account(id, a).is_ok());
  EXPECT_TRUE(a.has_value()) << id;
  return a ? a->balance : std::numeric_limits<std::int64_t>::min();
}

// "transfer account kind amount" for every posting, sorted; times left out.
std::vector<std::string> posting_rows(Ledger& ledger) {
  std::vector<std::string> out;
  for (std::size_t i = 0; i < ledger.shard_count(); ++i) {
    EXPECT_TRUE(ledger.shard(i)
                    .scan_postings([&](const Posting& p) {
                      out.push_back(p.transfer_id + " " + p.account_id + " " +
                                    std::string(to_string(p.kind)) + " " + std::to_string(p.amount));
                    })
                    .is_ok());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The kinds of a transfer's postings over every store, e.g. "debit+credit".
std::string posting_kinds(Ledger& ledger, std::string_view transfer_id) {
  std::vector<PostingKind> kinds;
  std::vector<Posting> part;
  for (std::size_t i = 0; i < ledger.shard_count(); ++i) {
    EXPECT_TRUE(ledger.shard(i).postings_for_transfer(transfer_id, part).is_ok());
    for (const Posting& p : part) kinds.push_back(p.kind);
  }
  std::sort(kinds.begin(), kinds.end());
  std::string out;
  for (PostingKind k : kinds) out += (out.empty() ? "" : "+") + std::string(to_string(k));
  return out.empty() ? "none" : out;
}

std::set<std::string> pending_entries(Ledger& ledger) {
  std::set<std::string> out;
  for (std::size_t i = 0; i < ledger.shard_count(); ++i) {
    EXPECT_TRUE(ledger.shard(i)
                    .scan_pending([&](const PendingEntry& e) { out.insert(e.account_id + " " + e.transfer_id); })
                    .is_ok());
  }
  return out;
}

::testing::AssertionResult audit_passes(Ledger& ledger) {
  AuditReport report;
  if (Status s = run_audit(ledger, {}, report); !s) {
    return ::testing::AssertionFailure() << "run_audit failed: " << s.message();
  }
  if (!report.ok()) return ::testing::AssertionFailure() << report.to_text();
  return ::testing::AssertionSuccess();
}

// Runs SQL on a store file behind the store's back (corruption, inspection).
void exec_sql(const std::filesystem::path& file, const std::string& sql) {
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open_v2(file.c_str(), &raw, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
  std::unique_ptr<sqlite3, decltype(&sqlite3_close_v2)> db(raw, &sqlite3_close_v2);
  sqlite3_busy_timeout(db.get(), 5000);
  char* err = nullptr;
  const int rc = sqlite3_exec(db.get(), sql.c_str(), nullptr, nullptr, &err);
  const std::string message = err ? err : "";
  sqlite3_free(err);
  ASSERT_EQ(rc, SQLITE_OK) << message;
  ASSERT_GT(sqlite3_changes(db.get()), 0) << "no row changed by: " << sql;
}

bool store_transition(Ledger& ledger, std::string_view id, S from, S to, Reason reason,
                      std::string_view owner, std::int64_t epoch) {
  const Transition t{id, from, to, reason, owner, epoch};
  std::uint8_t applied = 0;
  EXPECT_TRUE(ledger.transfers().transition({&t, 1}, kLeaseMs, {&applied, 1}).is_ok());
  return applied != 0;
}

LegResult apply_leg(Ledger& ledger, LegOp op, std::string_view transfer_id, std::string_view account,
                    std::int64_t amount, std::string_view currency = {}) {
  const LegRequest leg{op, transfer_id, account, amount, currency};
  LegResult result;
  EXPECT_TRUE(ledger.shard_for(account).apply_legs({&leg, 1}, {&result, 1}).is_ok());
  return result;
}

// ---- the state machine ------------------------------------------------------

TEST(TransitionTable, AllThirtySixPairs) {
  const std::set<std::pair<S, S>> legal = {
      {S::initial, S::pending},   {S::initial, S::canceling}, {S::pending, S::applied},
      {S::pending, S::canceling}, {S::applied, S::done},      {S::canceling, S::canceled},
      {S::canceling, S::applied}};
  int pairs = 0;
  int allowed = 0;
  for (int f = 0; f < kTransferStateCount; ++f) {
    for (int t = 0; t < kTransferStateCount; ++t) {
      const auto from = static_cast<S>(f);
      const auto to = static_cast<S>(t);
      ++pairs;
      allowed += is_legal_transition(from, to) ? 1 : 0;
      EXPECT_EQ(is_legal_transition(from, to), legal.count({from, to}) == 1)
          << to_string(from) << " -> " << to_string(to);
    }
  }
  EXPECT_EQ(pairs, 36);
  EXPECT_EQ(allowed, 7);
  for (int f = 0; f < kTransferStateCount; ++f) {
    const auto from = static_cast<S>(f);
    EXPECT_FALSE(is_legal_transition(from, from)) << "self edge on " << to_string(from);
    EXPECT_FALSE(is_legal_transition(S::done, from));
    EXPECT_FALSE(is_legal_transition(S::canceled, from));
    EXPECT_FALSE(is_legal_transition(from, S::initial)) << "nothing returns to initial";
  }
}

// ---- fixture: one ledger per test, on 1 or 2 stores ---------------------------

class EngineTest : public ::testing::TestWithParam<std::size_t> {
 protected:
  void SetUp() override {
    const Status s = main_.open(dir_.path() / "main", GetParam());
    ASSERT_TRUE(s.is_ok()) << s.message();
  }

  // Every transition the engine wrote in this test was a legal edge, and
  // the ledger holds every invariant after the scenario.
  void TearDown() override {
    if (audit_after_ && main_.ledger) {
      EXPECT_TRUE(audit_passes(ledger())) << "after the scenario";
    }
    for (const Edge& e : observer_.edges) {
      EXPECT_TRUE(is_legal_transition(e.from, e.to))
          << "engine wrote " << to_string(e.from) << " -> " << to_string(e.to);
    }
    EXPECT_TRUE(observer_.store_errors.empty()) << observer_.store_errors.front();
  }

  Ledger& ledger() { return *main_.ledger; }
  // Source on the first store, destination on the last: cross-shard with 2.
  std::string src(std::string_view name) { return id_on_shard(ledger(), std::string(name) + "-", 0); }
  std::string dst(std::string_view name) {
    return id_on_shard(ledger(), std::string(name) + "-", ledger().shard_count() - 1);
  }

  void accounts(const std::vector<AccountSpec>& specs) {
    const Status s = create_accounts(ledger(), specs);
    ASSERT_TRUE(s.is_ok()) << s.message();
  }
  void submit(const std::vector<Req>& reqs, std::string_view owner = kOwner) {
    const Status s = insert(ledger(), reqs, owner);
    ASSERT_TRUE(s.is_ok()) << s.message();
  }
  // Inserts and runs the transfers as one batch; returns the items.
  std::vector<SagaItem> run_batch(const std::vector<Req>& reqs) {
    submit(reqs);
    std::vector<SagaItem> items = items_for(ledger(), reqs);
    const Status s = run_engine(ledger(), kOwner, items, observer_);
    EXPECT_TRUE(s.is_ok()) << s.message();
    return items;
  }
  TransferDoc doc(std::string_view id) {
    std::optional<TransferDoc> d = load(ledger(), id);
    EXPECT_TRUE(d.has_value()) << id;
    return d.value_or(TransferDoc{});
  }
  void expect_outcome(std::string_view id, S state, Reason reason, std::string_view kinds) {
    const TransferDoc d = doc(id);
    EXPECT_EQ(to_string(d.state), to_string(state)) << id;
    EXPECT_EQ(to_string(d.reason), to_string(reason)) << id;
    EXPECT_EQ(posting_kinds(ledger(), id), kinds) << id;
    if (is_terminal(state)) {
      EXPECT_GT(d.finished_at_ms, 0) << id;
      EXPECT_FALSE(d.notified) << id;
    }
  }
  // Each account holds the balance paired with it.
  void expect_balances(const std::vector<std::pair<std::string, std::int64_t>>& want) {
    for (const auto& [id, amount] : want) EXPECT_EQ(balance(ledger(), id), amount) << id;
  }

  // Where the fencing, zombie and operator cases start: `a` (100) on the
  // first store pays `b` (0) on the last `amount` as "t-1", submitted by
  // kOwner (state initial, epoch 1).
  struct OneTransfer {
    std::string a;
    std::string b;
    std::vector<Req> reqs;
  };
  OneTransfer submit_one(std::int64_t amount = 40) {
    OneTransfer t{src("a"), dst("b"), {}};
    accounts({{t.a, 100}, {t.b, 0}});
    t.reqs = {{"t-1", t.a, t.b, amount, ""}};
    submit(t.reqs);
    return t;
  }
  // The engine's first write on `id`: kOwner moves it initial -> pending at epoch 1.
  bool move_to_pending(std::string_view id) {
    return store_transition(ledger(), id, S::initial, S::pending, Reason::none, kOwner, 1);
  }
  // Posts both legs of `id`, as a worker does before it writes `applied`.
  ::testing::AssertionResult post_both_legs(std::string_view id, std::string_view from,
                                            std::string_view to, std::int64_t amount) {
    for (const auto& [op, account] : {std::pair{LegOp::debit, from}, std::pair{LegOp::credit, to}}) {
      const LegStatus status = apply_leg(ledger(), op, id, account, amount).status;
      if (status != LegStatus::posted) {
        return ::testing::AssertionFailure()
               << (op == LegOp::debit ? "debit" : "credit") << " of " << id << " on " << account
               << " not posted: status " << static_cast<int>(status);
      }
    }
    return ::testing::AssertionSuccess();
  }

  // `who` takes `id` over (epoch + 1), as recovery does once a lease runs out.
  std::optional<TransferDoc> take_over(std::string_view id, std::string_view who) {
    std::optional<TransferDoc> taken;
    const Status s = ledger().transfers().take_over(id, who, kLeaseMs, taken);
    EXPECT_TRUE(s.is_ok()) << s.message();
    return taken;
  }
  // The engine run by `owner` on the transfer it took over.
  Status run_taken_over(std::string_view owner, const TransferDoc& taken) {
    std::vector<SagaItem> items(1);
    items[0].assign(taken);
    return run_engine(ledger(), owner, items, observer_);
  }

  // `sagactl cancel` and `sagactl retry` of `id` by `who`, on `on` or else
  // the test's ledger.
  ::testing::AssertionResult cancel(std::string_view id, std::string_view who, ActionOutcome& out,
                                    Ledger* on = nullptr) {
    return act(cancel_transfer, id, who, out, on);
  }
  ::testing::AssertionResult retry(std::string_view id, std::string_view who, ActionOutcome& out) {
    return act(retry_transfer, id, who, out, nullptr);
  }

  test::TempDir dir_{"saga-engine-test"};
  LedgerFiles main_;
  bool audit_after_ = true;  // off only where a test corrupts the ledger
  RecordingObserver observer_;

 private:
  using Action = Status (*)(Ledger&, std::string_view, std::string_view, SagaObserver&, ActionOutcome&);
  ::testing::AssertionResult act(Action action, std::string_view id, std::string_view who,
                                 ActionOutcome& out, Ledger* on) {
    NullObserver quiet;
    const Status s = action(on ? *on : ledger(), id, who, quiet, out);
    if (!s) return ::testing::AssertionFailure() << s.message();
    return ::testing::AssertionSuccess();
  }
};

INSTANTIATE_TEST_SUITE_P(Stores, EngineTest, ::testing::Values(std::size_t{1}, std::size_t{2}),
                         [](const ::testing::TestParamInfo<std::size_t>& p) {
                           return std::to_string(p.param) + "_store" + (p.param == 1 ? "" : "s");
                         });

// ---- outcome paths --------------------------------------------------------------

TEST_P(EngineTest, HappyPathWalksInitialPendingAppliedDone) {
  const std::string a = src("a"), b = dst("b");
  accounts({{a, 1000}, {b, 50}});
  std::vector<SagaItem> items = run_batch({{"t-1", a, b, 300, ""}});
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0].state, S::done);
  EXPECT_FALSE(items[0].dropped);
  expect_outcome("t-1", S::done, Reason::none, "debit+credit");
  expect_balances({{a, 700}, {b, 350}});
  EXPECT_TRUE(pending_entries(ledger()).empty());
  const std::vector<std::pair<S, S>> want = {
      {S::initial, S::pending}, {S::pending, S::applied}, {S::applied, S::done}};
  ASSERT_EQ(observer_.edges.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(observer_.edges[i].from, want[i].first);
    EXPECT_EQ(observer_.edges[i].to, want[i].second);
  }
  EXPECT_TRUE(audit_passes(ledger()));
}

TEST_P(EngineTest, OverdraftCancelsWithInsufficientFundsAndNoPostings) {
  const std::string a = src("a"), b = dst("b");
  accounts({{a, 100}, {b, 0}});
  std::vector<SagaItem> items = run_batch({{"t-1", a, b, 101, ""}});
  EXPECT_EQ(items[0].state, S::canceled);
  expect_outcome("t-1", S::canceled, Reason::insufficient_funds, "none");
  expect_balances({{a, 100}, {b, 0}});
  ASSERT_EQ(observer_.compensations.size(), 1u);
  EXPECT_EQ(observer_.compensations[0], Reason::insufficient_funds);
  EXPECT_TRUE(audit_passes(ledger()));
}

TEST_P(EngineTest, DebitDownToMinBalanceAppliesOneMoreUnitDoesNot) {
  const std::string a = src("a"), c = src("c"), b = dst("b");
  accounts({{a, 0, -500}, {c, 10, 5}, {b, 0}});
  run_batch({{"t-1", a, b, 500, ""}, {"t-2", c, b, 6, ""}, {"t-3", c, b, 5, ""}});
  expect_outcome("t-1", S::done, Reason::none, "debit+credit");
  expect_outcome("t-2", S::canceled, Reason::insufficient_funds, "none");
  expect_outcome("t-3", S::done, Reason::none, "debit+credit");
  expect_balances({{a, -500}, {c, 5}, {b, 505}});
  EXPECT_TRUE(audit_passes(ledger()));
}

TEST_P(EngineTest, UnknownDestinationReversesTheDebitExactlyOnce) {
  const std::string a = src("a"), ghost = dst("ghost");
  accounts({{a, 1000}});
  std::vector<SagaItem> items = run_batch({{"t-1", a, ghost, 400, ""}});
  EXPECT_EQ(items[0].state, S::canceled);
  expect_outcome("t-1", S::canceled, Reason::unknown_account, "debit+reverse_debit");
  EXPECT_EQ(balance(ledger(), a), 1000);
  EXPECT_TRUE(pending_entries(ledger()).empty());
  const std::vector<std::string> rows = posting_rows(ledger());
  EXPECT_EQ(rows, (std::vector<std::string>{"t-1 " + a + " debit 400", "t-1 " + a + " reverse_debit 400"}));
  // Running the compensation again does not reverse twice.
  std::vector<SagaItem> again = items_for(ledger(), {{"t-1", a, ghost, 400, ""}});
  again[0].state = S::canceling;
  ASSERT_TRUE(run_engine(ledger(), kOwner, again, observer_).is_ok());
  EXPECT_EQ(posting_rows(ledger()), rows);
  EXPECT_EQ(balance(ledger(), a), 1000);
  EXPECT_TRUE(audit_passes(ledger()));
}

TEST_P(EngineTest, UnknownSourceCancelsWithoutPostings) {
  const std::string ghost = src("ghost"), b = dst("b");
  accounts({{b, 10}});
  run_batch({{"t-1", ghost, b, 5, ""}});
  expect_outcome("t-1", S::canceled, Reason::unknown_account, "none");
  EXPECT_EQ(balance(ledger(), b), 10);
  EXPECT_TRUE(audit_passes(ledger()));
}

TEST_P(EngineTest, LockedSourceCancelsLockedDestinationReverses) {
  const std::string a = src("a"), locked_src = src("ls"), b = dst("b"), locked_dst = dst("ld");
  accounts({{a, 100}, {locked_src, 100, 0, "", true}, {b, 0}, {locked_dst, 0, 0, "", true}});
  run_batch({{"t-1", locked_src, b, 10, ""}, {"t-2", a, locked_dst, 10, ""}});
  expect_outcome("t-1", S::canceled, Reason::account_locked, "none");
  expect_outcome("t-2", S::canceled, Reason::account_locked, "debit+reverse_debit");
  expect_balances({{a, 100}, {locked_src, 100}, {b, 0}, {locked_dst, 0}});
  EXPECT_TRUE(audit_passes(ledger()));
}

TEST_P(EngineTest, CurrencyMismatchOnEitherLeg) {
  const std::string eur = src("eur"), any = src("any"), usd = dst("usd"), any_dst = dst("anyd");
  accounts({{eur, 100, 0, "EUR"}, {any, 100}, {usd, 0, 0, "USD"}, {any_dst, 0}});
  run_batch({
      {"t-req-vs-source", eur, any_dst, 10, "USD"},  // the request names USD, the source is EUR
      {"t-source-vs-dest", eur, usd, 10, ""},        // EUR taken from the source, USD destination
      {"t-req-vs-dest", any, usd, 10, "EUR"},        // the source takes anything
      {"t-ok", eur, any_dst, 10, "EUR"},
  });
  expect_outcome("t-req-vs-source", S::canceled, Reason::currency_mismatch, "none");
  expect_outcome("t-source-vs-dest", S::canceled, Reason::currency_mismatch, "debit+reverse_debit");
  expect_outcome("t-req-vs-dest", S::canceled, Reason::currency_mismatch, "debit+reverse_debit");
  expect_outcome("t-ok", S::done, Reason::none, "debit+credit");
  expect_balances({{eur, 90}, {any, 100}, {usd, 0}, {any_dst, 10}});
  EXPECT_TRUE(audit_passes(ledger()));
}

TEST_P(EngineTest, CreditOverflowReversesTheDebit) {
  const std::string a = src("a"), full = dst("full");
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  accounts({{a, 100}, {full, kMax - 10}});
  run_batch({{"t-1", a, full, 11, ""}});
  expect_outcome("t-1", S::canceled, Reason::overflow, "debit+reverse_debit");
  expect_balances({{a, 100}, {full, kMax - 10}});
  EXPECT_TRUE(audit_passes(ledger()));
}

// The reservation (docs/RELIABILITY.md): a credit that lands between another
// transfer's debit and that debit's reversal may not use the room the
// reversal needs. Without it, the reversal overflowed: a fatal store error,
// and every worker recovering the transfer stopped the same way.
TEST_P(EngineTest, ACreditLeavesRoomForThePendingDebitsReversal) {
  const std::string a = src("a"), ghost = dst("ghost"), c = dst("c");
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  accounts({{a, kMax - 100}, {c, 1000}});
  // t-1 debited a, then its worker died before the credit.
  const std::vector<Req> first = {{"t-1", a, ghost, 500, ""}};
  submit(first);
  ASSERT_TRUE(move_to_pending("t-1"));
  ASSERT_EQ(apply_leg(ledger(), LegOp::debit, "t-1", a, 500).status, LegStatus::posted);
  // Meanwhile t-2 credits a: 500 of a's headroom is t-1's.
  run_batch({{"t-2", c, a, 400, ""}, {"t-3", c, a, 100, ""}});
  expect_outcome("t-2", S::canceled, Reason::overflow, "debit+reverse_debit");
  expect_outcome("t-3", S::done, Reason::none, "debit+credit");
  // Recovery reverses t-1's debit: it fits.
  std::vector<SagaItem> items = items_for(ledger(), first);
  ASSERT_TRUE(run_engine(ledger(), kOwner, items, observer_).is_ok());
  expect_outcome("t-1", S::canceled, Reason::unknown_account, "debit+reverse_debit");
  expect_balances({{a, kMax}, {c, 900}});
  EXPECT_TRUE(audit_passes(ledger()));
}

// ---- idempotence: every stage run twice ------------------------------------------

TEST_P(EngineTest, EveryStageRunTwiceIsANoOpTheSecondTime) {
  const std::string a = src("a"), c = src("c"), locked = src("l"), b = dst("b"), ghost = dst("ghost");
  accounts({{a, 1000}, {c, 5}, {locked, 100, 0, "", true}, {b, 0}});
  const std::vector<Req> reqs = {{"t-done", a, b, 100, ""},
                                 {"t-overdraft", c, b, 50, ""},
                                 {"t-unknown", a, ghost, 70, ""},
                                 {"t-locked", locked, b, 1, ""}};
  submit(reqs);
  const std::vector<SagaItem> fresh = items_for(ledger(), reqs);
  std::vector<SagaItem> items = fresh;
  ASSERT_TRUE(run_engine(ledger(), kOwner, items, observer_).is_ok());
  expect_outcome("t-done", S::done, Reason::none, "debit+credit");
  expect_outcome("t-overdraft", S::canceled, Reason::insufficient_funds, "none");
  expect_outcome("t-unknown", S::canceled, Reason::unknown_account, "debit+reverse_debit");
  expect_outcome("t-locked", S::canceled, Reason::account_locked, "none");

  const auto balances_before = balances(ledger());
  const auto postings_before = posting_rows(ledger());
  const auto pending_before = pending_entries(ledger());
  std::vector<TransferDoc> docs_before;
  for (const Req& r : reqs) docs_before.push_back(doc(r.id));
  const std::size_t transitions_before = observer_.transitions();

  // Replay each transfer from every state on its path, at the same epoch.
  const std::map<std::string, std::vector<S>> paths = {
      {"t-done", {S::initial, S::pending, S::applied}},
      {"t-overdraft", {S::initial, S::pending, S::canceling}},
      {"t-unknown", {S::initial, S::pending, S::canceling}},
      {"t-locked", {S::initial, S::pending, S::canceling}}};
  for (const SagaItem& original : fresh) {
    for (S from : paths.at(original.id)) {
      std::vector<SagaItem> replay{original};
      replay[0].state = from;
      ASSERT_TRUE(run_engine(ledger(), kOwner, replay, observer_).is_ok());
      EXPECT_TRUE(replay[0].dropped) << original.id << " replayed from " << to_string(from);
      EXPECT_EQ(balances(ledger()), balances_before) << original.id << " from " << to_string(from);
      EXPECT_EQ(posting_rows(ledger()), postings_before) << original.id << " from " << to_string(from);
      EXPECT_EQ(pending_entries(ledger()), pending_before) << original.id << " from " << to_string(from);
    }
  }
  // The whole batch once more, as it was before the first run.
  std::vector<SagaItem> again = fresh;
  ASSERT_TRUE(run_engine(ledger(), kOwner, again, observer_).is_ok());
  EXPECT_EQ(balances(ledger()), balances_before);
  EXPECT_EQ(posting_rows(ledger()), postings_before);
  EXPECT_EQ(observer_.transitions(), transitions_before) << "a replay moved a transfer";
  for (std::size_t i = 0; i < reqs.size(); ++i) {
    const TransferDoc d = doc(reqs[i].id);
    EXPECT_EQ(d.state, docs_before[i].state) << reqs[i].id;
    EXPECT_EQ(d.reason, docs_before[i].reason) << reqs[i].id;
    EXPECT_EQ(d.epoch, docs_before[i].epoch) << reqs[i].id;
    EXPECT_EQ(d.last_modified_ms, docs_before[i].last_modified_ms) << reqs[i].id;
    EXPECT_EQ(d.finished_at_ms, docs_before[i].finished_at_ms) << reqs[i].id;
  }
  EXPECT_TRUE(audit_passes(ledger()));
}

TEST_P(EngineTest, EveryLegAppliedTwiceIsANoOpTheSecondTime) {
  audit_after_ = false;  // legs without transfer documents: invariant 4 would (rightly) fail
  const std::string a = src("a"), b = dst("b");
  accounts({{a, 100}, {b, 0}});
  // The same leg applied twice: the first call reports `first`, the replay `again`.
  auto apply_twice = [&](LegOp op, std::string_view transfer, const std::string& account,
                         std::int64_t amount, LegStatus first, LegStatus again) {
    EXPECT_EQ(apply_leg(ledger(), op, transfer, account, amount).status, first) << transfer << " " << account;
    EXPECT_EQ(apply_leg(ledger(), op, transfer, account, amount).status, again)
        << transfer << " " << account << ", again";
  };
  apply_twice(LegOp::debit, "t-1", a, 30, LegStatus::posted, LegStatus::already_posted);
  apply_twice(LegOp::credit, "t-1", b, 30, LegStatus::posted, LegStatus::already_posted);
  expect_balances({{a, 70}, {b, 30}});
  apply_twice(LegOp::release, "t-1", a, 30, LegStatus::released, LegStatus::released);
  // Compensation of another transfer: reverse once, void once.
  EXPECT_EQ(apply_leg(ledger(), LegOp::debit, "t-2", a, 20).status, LegStatus::posted);
  apply_twice(LegOp::cancel_credit, "t-2", b, 20, LegStatus::voided, LegStatus::voided);
  apply_twice(LegOp::cancel_debit, "t-2", a, 20, LegStatus::reversed, LegStatus::reversed);
  EXPECT_EQ(balance(ledger(), a), 70);
  EXPECT_EQ(apply_leg(ledger(), LegOp::credit, "t-2", b, 20).status, LegStatus::voided);
  // A credit posted before the cancel: the transfer must roll forward.
  EXPECT_EQ(apply_leg(ledger(), LegOp::credit, "t-1", b, 30).status, LegStatus::already_posted);
  apply_twice(LegOp::cancel_credit, "t-1", b, 30, LegStatus::credit_posted, LegStatus::credit_posted);
  // A debit voided before it posted never posts.
  EXPECT_EQ(apply_leg(ledger(), LegOp::cancel_debit, "t-3", a, 5).status, LegStatus::voided);
  EXPECT_EQ(apply_leg(ledger(), LegOp::debit, "t-3", a, 5).status, LegStatus::voided);
  EXPECT_EQ(balance(ledger(), a), 70);
  EXPECT_EQ(posting_rows(ledger()),
            (std::vector<std::string>{"t-1 " + a + " debit 30", "t-1 " + b + " credit 30",
                                      "t-2 " + a + " debit 20", "t-2 " + a + " reverse_debit 20"}));
}

TEST_P(EngineTest, ReplayedCompensationIsNotCountedAgain) {
  const std::string a = src("a"), ghost = dst("ghost");
  accounts({{a, 100}});
  const std::vector<Req> reqs = {{"t-1", a, ghost, 10, ""}};
  run_batch(reqs);
  ASSERT_EQ(observer_.compensations.size(), 1u);
  std::vector<SagaItem> replay = items_for(ledger(), reqs);
  replay[0].state = S::canceling;  // same owner, same epoch: a re-run of the last stage
  ASSERT_TRUE(run_engine(ledger(), kOwner, replay, observer_).is_ok());
  EXPECT_TRUE(replay[0].dropped);
  EXPECT_EQ(observer_.compensations.size(), 1u)
      << "saga_compensations_total counted a compensation whose transition was fenced out";
}

// ---- the engine refuses to move a transfer along an edge the store does not hold --

TEST_P(EngineTest, EngineNeverMovesATransferOffItsRecordedState) {
  const std::vector<Req> reqs = submit_one(10).reqs;
  // The store holds `initial`; an item claiming `applied` would release and
  // write applied -> done, which the store's state condition refuses.
  std::vector<SagaItem> items = items_for(ledger(), reqs);
  items[0].state = S::applied;
  ASSERT_TRUE(run_engine(ledger(), kOwner, items, observer_).is_ok());
  EXPECT_TRUE(items[0].dropped);
  EXPECT_EQ(doc("t-1").state, S::initial);
  EXPECT_EQ(observer_.transitions(), 0u);
  // Terminal items are left alone: no write at all.
  items = items_for(ledger(), reqs);
  for (S terminal : {S::done, S::canceled}) {
    std::vector<SagaItem> t = items;
    t[0].state = terminal;
    ASSERT_TRUE(run_engine(ledger(), kOwner, t, observer_).is_ok());
    EXPECT_EQ(t[0].state, terminal);
    EXPECT_FALSE(t[0].dropped);
  }
  EXPECT_EQ(doc("t-1").state, S::initial);
  EXPECT_EQ(posting_kinds(ledger(), "t-1"), "none");
  // Once done, an item replayed from `initial` cannot take it back.
  items = items_for(ledger(), reqs);
  ASSERT_TRUE(run_engine(ledger(), kOwner, items, observer_).is_ok());
  ASSERT_EQ(doc("t-1").state, S::done);
  const std::size_t before = observer_.transitions();
  std::vector<SagaItem> back = items_for(ledger(), reqs);
  back[0].state = S::initial;
  ASSERT_TRUE(run_engine(ledger(), kOwner, back, observer_).is_ok());
  EXPECT_TRUE(back[0].dropped);
  EXPECT_EQ(doc("t-1").state, S::done);
  EXPECT_EQ(observer_.transitions(), before);
  EXPECT_TRUE(audit_passes(ledger()));
}

TEST_P(EngineTest, StoreTransitionIsConditionalOnStateOwnerAndEpoch) {
  submit_one(10);
  EXPECT_FALSE(store_transition(ledger(), "t-1", S::pending, S::applied, Reason::none, kOwner, 1));
  EXPECT_FALSE(store_transition(ledger(), "t-1", S::initial, S::pending, Reason::none, "someone-else", 1));
  EXPECT_FALSE(store_transition(ledger(), "t-1", S::initial, S::pending, Reason::none, kOwner, 2));
  EXPECT_EQ(doc("t-1").state, S::initial);
  EXPECT_TRUE(store_transition(ledger(), "t-1", S::initial, S::pending, Reason::none, kOwner, 1));
  EXPECT_EQ(doc("t-1").state, S::pending);
}

// ---- batches equal one-by-one runs --------------------------------------------------

struct Scenario {
  std::vector<AccountSpec> accounts;
  std::vector<Req> transfers;
};

// `hot` accounts with small balances so that some transfers overdraw; a few
// unknown accounts, one locked account, mixed currencies. With `disjoint`,
// sources and destinations are different accounts and no credit can fail,
// so no balance a debit reads depends on an earlier transfer's credit or
// reversal.
// `spread`, when not 0, is the number of accounts instead.
Scenario random_scenario(std::uint32_t seed, std::size_t transfers, bool disjoint, int spread = 0) {
  std::mt19937 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  Scenario sc;
  const int hot = spread != 0 ? spread : pick(5, 8);
  const int locked = pick(0, hot - 1);
  for (int i = 0; i < hot; ++i) {
    AccountSpec a;
    a.id = "hot-" + std::to_string(i);
    a.balance = pick(0, 400);
    a.min_balance = pick(0, 4) == 0 ? -pick(1, 200) : 0;
    a.currency = i % 3 == 0 ? "EUR" : (i % 3 == 1 ? "" : "USD");
    const bool is_destination = disjoint && i >= hot / 2;
    if (is_destination) a.currency.clear();
    a.locked = i == locked && !is_destination;
    sc.accounts.push_back(a);
  }
  for (std::size_t k = 0; k < transfers; ++k) {
    Req r;
    r.id = "t-" + std::to_string(seed) + "-" + std::to_string(k);
    if (disjoint) {
      r.from = "hot-" + std::to_string(pick(0, hot / 2 - 1));
      r.to = "hot-" + std::to_string(pick(hot / 2, hot - 1));
    } else {
      const int f = pick(0, hot - 1);
      int t = pick(0, hot - 2);
      if (t >= f) ++t;
      r.from = pick(0, 19) == 0 ? "ghost-" + std::to_string(pick(0, 3)) : "hot-" + std::to_string(f);
      r.to = pick(0, 12) == 0 ? "ghost-" + std::to_string(pick(4, 7)) : "hot-" + std::to_string(t);
    }
    r.amount = pick(1, 250);
    const int c = pick(0, 9);
    r.currency = c < 7 ? "" : (c < 9 ? "EUR" : "USD");
    sc.transfers.push_back(r);
  }
  return sc;
}

struct Outcome {
  S state = S::initial;
  Reason reason = Reason::none;
  bool operator==(const Outcome&) const = default;
};

// How run_scenario runs a scenario's transfers.
enum class RunMode {
  batch,       // one engine run of them all
  one_by_one,  // one engine run per transfer, in order
  // As the worker runs a batch on several stores (Worker::write_batch):
  // inserted in a transaction on the first store, which runs what
  // split_first_store keeps, and the rest after its commit.
  first_store_first,
  // As the worker runs a batch on several stores that can prepare
  // (Worker::write_across): one transaction on each store (memory stores
  // here), every transfer walked whole, committed by TwoPhaseBatch.
  across,
};

// A ledger of memory stores whose scopes can be prepared.
std::unique_ptr<Ledger> preparing_ledger(std::size_t stores) {
  auto clock = std::make_shared<sim::WallClock>();
  std::vector<std::unique_ptr<Store>> v;
  for (std::size_t i = 0; i < stores; ++i) {
    sim::MemoryOptions o;
    o.name = "store" + std::to_string(i);
    o.prepare = true;
    v.push_back(sim::connect(sim::make_memory_db(clock, o)));
  }
  std::unique_ptr<Ledger> ledger = Ledger::from_stores(std::move(v));
  EXPECT_TRUE(ledger->init().is_ok());
  return ledger;
}

// The saga of a request inserted in the current scope, as the worker starts it.
SagaItem fresh_item(const Req& r) {
  SagaItem it;
  it.id = r.id;
  it.source = r.from;
  it.destination = r.to;
  it.currency = r.currency;
  it.requested_currency = r.currency;
  it.amount = r.amount;
  it.epoch = 1;
  it.fresh = true;
  return it;
}

// first_store_first: how many transfers ran in the first store's
// transaction, how many after it, and how many of those had both accounts
// on the first store (and waited for an earlier transfer).
struct SplitCounts {
  std::size_t kept = 0;
  std::size_t moved = 0;
  std::size_t waited = 0;
};

// Runs `sc` on a fresh ledger in `folder` as `mode` says. Fills outcomes,
// balances and postings, and adds to `split`.
// On memory stores when `in_memory` (always for `across`), else on SQLite files.
void run_scenario(const Scenario& sc, const std::filesystem::path& folder, std::size_t stores,
                  RunMode mode, std::map<std::string, Outcome>& outcomes,
                  std::map<std::string, std::int64_t>& final_balances, std::vector<std::string>& postings,
                  SplitCounts* split = nullptr, bool in_memory = false) {
  LedgerFiles lf;
  std::unique_ptr<Ledger> memory;
  Status s = Status::ok();
  if (in_memory || mode == RunMode::across) {
    memory = preparing_ledger(stores);
  } else {
    s = lf.open(folder, stores);
  }
  ASSERT_TRUE(s.is_ok()) << s.message();
  Ledger& ledger = memory ? *memory : *lf.ledger;
  s = create_accounts(ledger, sc.accounts);
  ASSERT_TRUE(s.is_ok()) << s.message();
  RecordingObserver observer;
  if (mode == RunMode::across) {
    SagaEngine engine(ledger, {std::string(kOwner), kLeaseMs, 5}, &observer);
    TwoPhaseBatch batch(ledger, kOwner);
    std::vector<SagaItem> all;
    for (const Req& r : sc.transfers) all.push_back(fresh_item(r));
    s = batch.begin();
    if (s) s = insert(ledger, sc.transfers, kOwner);
    if (s) s = engine.run_across(all);
    if (s) s = batch.commit();
    ASSERT_TRUE(s.is_ok()) << s.message();
    for (const SagaItem& it : all) ASSERT_TRUE(is_terminal(it.state)) << it.id;
  } else if (mode == RunMode::first_store_first) {
    SagaEngine engine(ledger, {std::string(kOwner), kLeaseMs, 5}, &observer);
    std::vector<SagaItem> kept, rest;
    for (const Req& r : sc.transfers) kept.push_back(fresh_item(r));
    ASSERT_TRUE(ledger.transfers().begin_scope().is_ok());
    s = insert(ledger, sc.transfers, kOwner);
    if (s) engine.split_first_store(kept, rest);
    if (s) s = engine.run_in_scope(kept);
    if (s) s = ledger.transfers().end_scope(true);
    ASSERT_TRUE(s.is_ok()) << s.message();
    for (SagaItem& it : rest) it.fresh = false;
    s = engine.run(rest);
    ASSERT_TRUE(s.is_ok()) << s.message();
    if (split) {
      split->kept += kept.size();
      split->moved += rest.size();
      for (const SagaItem& it : rest) {
        split->waited += ledger.shard_index(it.source) == 0 && ledger.shard_index(it.destination) == 0;
      }
    }
  } else {
    s = insert(ledger, sc.transfers, kOwner);
    ASSERT_TRUE(s.is_ok()) << s.message();
    std::vector<SagaItem> all = items_for(ledger, sc.transfers);
    if (mode == RunMode::one_by_one) {
      for (SagaItem& item : all) {
        std::vector<SagaItem> one{item};
        s = run_engine(ledger, kOwner, one, observer);
        ASSERT_TRUE(s.is_ok()) << s.message();
        ASSERT_TRUE(is_terminal(one[0].state)) << one[0].id;
      }
    } else {
      s = run_engine(ledger, kOwner, all, observer);
      ASSERT_TRUE(s.is_ok()) << s.message();
    }
  }
  for (const Req& r : sc.transfers) {
    const std::optional<TransferDoc> d = load(ledger, r.id);
    ASSERT_TRUE(d.has_value());
    ASSERT_TRUE(is_terminal(d->state)) << r.id << " left " << to_string(d->state);
    outcomes[r.id] = {d->state, d->reason};
  }
  final_balances = balances(ledger);
  postings = posting_rows(ledger);
  EXPECT_TRUE(observer.store_errors.empty());
  for (const Edge& e : observer.edges) EXPECT_TRUE(is_legal_transition(e.from, e.to));
  EXPECT_TRUE(audit_passes(ledger));
}

// Compares a batch run with a one-by-one run of the same seeded scenario,
// seed by seed, naming the first transfer whose outcome differs.
void compare_batch_with_one_by_one(const std::filesystem::path& dir, std::size_t stores, bool disjoint,
                                   RunMode batch_mode = RunMode::batch, int spread = 0) {
  constexpr std::uint32_t kSeeds = 20;
  constexpr std::size_t kTransfers = 200;
  int differing_seeds = 0;
  std::set<Reason> reasons_seen;
  SplitCounts split;
  for (std::uint32_t seed = 1; seed <= kSeeds; ++seed) {
    const Scenario sc = random_scenario(seed, kTransfers, disjoint, spread);
    std::map<std::string, Outcome> batch_out, single_out;
    std::map<std::string, std::int64_t> batch_bal, single_bal;
    std::vector<std::string> batch_post, single_post;
    const std::string tag = "seed" + std::to_string(seed);
    ASSERT_NO_FATAL_FAILURE(
        run_scenario(sc, dir / (tag + "-batch"), stores, batch_mode, batch_out, batch_bal, batch_post, &split));
    // `across` runs on memory stores, and so does its reference.
    ASSERT_NO_FATAL_FAILURE(run_scenario(sc, dir / (tag + "-single"), stores, RunMode::one_by_one, single_out,
                                         single_bal, single_post, nullptr, batch_mode == RunMode::across));
    for (const auto& [id, o] : single_out) reasons_seen.insert(o.reason);
    std::size_t differing = 0;
    std::string first;
    for (const Req& r : sc.transfers) {
      const Outcome& b = batch_out[r.id];
      const Outcome& o = single_out[r.id];
      if (b == o) continue;
      if (differing++ == 0) {
        first = r.id + " (" + r.from + " -> " + r.to + ", " + std::to_string(r.amount) +
                "): batch " + std::string(to_string(b.state)) + "/" + std::string(to_string(b.reason)) +
                ", one by one " + std::string(to_string(o.state)) + "/" + std::string(to_string(o.reason));
      }
    }
    const bool same = differing == 0 && batch_bal == single_bal && batch_post == single_post;
    if (!same) ++differing_seeds;
    EXPECT_TRUE(same) << "seed " << seed << ": " << differing << " of " << kTransfers
                      << " outcomes differ; first: " << first;
  }
  EXPECT_EQ(differing_seeds, 0) << "seeds whose batch run differs from the one-by-one run";
  if (batch_mode == RunMode::first_store_first) {  // both parts ran, with transfers enough to tell
    EXPECT_GT(split.kept, kSeeds * kTransfers / 20);
    EXPECT_GT(split.moved, kSeeds * kTransfers / 2);
    EXPECT_GT(split.waited, kSeeds * kTransfers / 20);
    std::cout << "first store's transaction: " << split.kept << ", after it: " << split.moved << " ("
              << split.waited << " of them waiting for an earlier transfer)\n";
  }
  // The scenarios are not trivial: the outcome paths they are meant to mix occur.
  std::vector<Reason> wanted = {Reason::none, Reason::insufficient_funds, Reason::account_locked,
                                Reason::currency_mismatch};
  if (!disjoint) wanted.push_back(Reason::unknown_account);
  for (Reason r : wanted) EXPECT_EQ(reasons_seen.count(r), 1u) << "no outcome with reason " << to_string(r);
}

TEST_P(EngineTest, SeededBatchesEqualOneByOneRuns) {
  compare_batch_with_one_by_one(dir_.path() / "random", GetParam(), false);
}

TEST_P(EngineTest, SeededBatchesEqualOneByOneRunsWhenSourcesAndDestinationsAreDisjoint) {
  compare_batch_with_one_by_one(dir_.path() / "disjoint", GetParam(), true);
}

// Several stores, as the worker runs a batch there: the transfers with both
// accounts on the first store in its insert's transaction, the others after.
TEST(FirstStoreFirst, SeededBatchesEqualOneByOneRuns) {
  test::TempDir dir{"saga-engine-first-store"};
  compare_batch_with_one_by_one(dir.path() / "random", 2, false, RunMode::first_store_first, 300);
}

// Several stores that can prepare, as the worker runs a batch there: every
// transfer walked whole in one transaction on each store.
TEST(AcrossStores, SeededBatchesEqualOneByOneRuns) {
  test::TempDir dir{"saga-engine-across"};
  compare_batch_with_one_by_one(dir.path() / "random", 2, false, RunMode::across, 300);
}

TEST(AcrossStores, SeededBatchesEqualOneByOneRunsOnThreeStoresWithHotAccounts) {
  test::TempDir dir{"saga-engine-across"};
  compare_batch_with_one_by_one(dir.path() / "random", 3, false, RunMode::across);
  compare_batch_with_one_by_one(dir.path() / "disjoint", 3, true, RunMode::across);
}

// One transfer of 60 from `a` (the first store, 100) to `b` (the second),
// inserted and walked in a batch across both stores, not yet committed.
struct OneAcross {
  std::unique_ptr<Ledger> ledger = preparing_ledger(2);
  std::string a = id_on_shard(*ledger, "a", 0);
  std::string b = id_on_shard(*ledger, "b", 1);
  SagaEngine engine{*ledger, {std::string(kOwner), kLeaseMs, 5}, nullptr};
  TwoPhaseBatch batch{*ledger, kOwner};
  std::vector<SagaItem> items;

  void walk() {
    ASSERT_TRUE(create_accounts(*ledger, {{a, 100}, {b, 0}}).is_ok());
    const std::vector<Req> reqs = {{"t-1", a, b, 60, ""}};
    items = {fresh_item(reqs[0])};
    ASSERT_TRUE(batch.begin().is_ok());
    ASSERT_TRUE(insert(*ledger, reqs, kOwner).is_ok());
    ASSERT_TRUE(engine.run_across(items).is_ok());
  }
};

// A transaction across stores: nothing of it is visible before the first
// store's commit, and the other stores hold it prepared until finished.
TEST(AcrossStores, AFailedPrepareRollsEveryStoreBack) {
  OneAcross t;
  ASSERT_NO_FATAL_FAILURE(t.walk());
  Ledger& ledger = *t.ledger;
  EXPECT_EQ(t.items[0].state, S::done);
  // The second store's scope is gone (a lost connection): its prepare fails.
  ASSERT_TRUE(ledger.shard(1).end_scope(false).is_ok());
  EXPECT_FALSE(t.batch.commit().is_ok());
  EXPECT_FALSE(load(ledger, "t-1").has_value());
  EXPECT_EQ(balance(ledger, t.a), 100);
  EXPECT_EQ(balance(ledger, t.b), 0);
  EXPECT_TRUE(posting_rows(ledger).empty());
  std::vector<std::string> decided;
  ASSERT_TRUE(ledger.transfers().list_decisions(0, 10, decided).is_ok());
  EXPECT_TRUE(decided.empty());
}

// A worker that dies between prepare and commit, or between commit and
// finish, leaves the second store prepared (its lock held): resolve_prepared
// rolls the first back and finishes the second.
TEST(AcrossStores, ResolvePreparedFinishesWhatAWorkerLeftAsTheDecisionSays) {
  for (const bool committed : {false, true}) {
    OneAcross t;
    ASSERT_NO_FATAL_FAILURE(t.walk());
    Ledger& ledger = *t.ledger;
    // What TwoPhaseBatch::commit does, stopped where a crash would stop it.
    std::vector<std::string> prepared;
    ASSERT_TRUE(ledger.shard(1).list_prepared(kBatchGidPrefix, 0, prepared).is_ok());
    ASSERT_TRUE(prepared.empty());
    std::vector<std::string> decided;
    ASSERT_TRUE(ledger.transfers().list_decisions(0, 10, decided).is_ok());
    ASSERT_EQ(decided.size(), 1u);
    const std::string gid = decided[0];
    ASSERT_TRUE(ledger.shard(1).prepare_scope(gid).is_ok());
    ASSERT_TRUE(ledger.transfers().end_scope(committed).is_ok());
    ASSERT_TRUE(ledger.shard(1).list_prepared(kBatchGidPrefix, 0, prepared).is_ok());
    ASSERT_EQ(prepared, std::vector<std::string>{gid});
    // While prepared the second store is locked, as its rows would be.
    std::optional<Account> locked;
    EXPECT_EQ(ledger.shard(1).load_account(t.b, locked).kind(), ErrorKind::retry_call);
    ResolveCounts counts;
    ASSERT_TRUE(resolve_prepared(ledger, 0, counts).is_ok());
    EXPECT_EQ(counts.committed, committed ? 1u : 0u);
    EXPECT_EQ(counts.rolled_back, committed ? 0u : 1u);
    EXPECT_EQ(counts.forgotten, 1u);  // the decision, once nothing is prepared under it
    ASSERT_TRUE(ledger.shard(1).list_prepared(kBatchGidPrefix, 0, prepared).is_ok());
    EXPECT_TRUE(prepared.empty());
    ASSERT_TRUE(ledger.transfers().list_decisions(0, 10, decided).is_ok());
    EXPECT_TRUE(decided.empty());
    EXPECT_EQ(load(ledger, "t-1").has_value(), committed);
    EXPECT_EQ(balance(ledger, t.a), committed ? 40 : 100);
    EXPECT_EQ(balance(ledger, t.b), committed ? 60 : 0);
    EXPECT_TRUE(audit_passes(ledger));
  }
}

// Which store each read goes to, in order: "<store>:<call>".
class ReadLog final : public sim::FaultHooks {
 public:
  ReadLog(std::vector<std::string>& log, std::size_t store) : log_(log), store_(store) {}
  Status on_call(std::string_view op, sim::Phase phase, bool) override {
    if (phase == sim::Phase::before && (op == "read_accounts" || op == "load_accounts")) {
      log_.push_back(std::to_string(store_) + ":" + std::string(op));
    }
    return Status::ok();
  }

 private:
  std::vector<std::string>& log_;
  std::size_t store_;
};

// Two memory stores that can prepare, their reads logged in `log`.
struct LoggedStores {
  std::vector<std::string> log;
  ReadLog first{log, 0}, second{log, 1};
  std::unique_ptr<Ledger> ledger;

  LoggedStores() {
    std::vector<std::unique_ptr<Store>> stores;
    auto clock = std::make_shared<sim::WallClock>();
    for (ReadLog* h : {&first, &second}) {
      sim::MemoryOptions o;
      o.prepare = true;
      stores.push_back(std::make_unique<sim::FaultStore>(sim::connect(sim::make_memory_db(clock, o)), *h));
    }
    ledger = Ledger::from_stores(std::move(stores));
  }
};

// Walked first, locked last: the accounts are read unlocked, but for those
// the engine's last walks left known; locked when one has no row, and for
// the batch after one that failed. Either way the first store comes last,
// as the moves lock it last.
TEST(AcrossStores, AccountsAreReadLockedOnlyForAnUnknownAccountOrAfterAFailedBatch) {
  LoggedStores logged;
  std::vector<std::string>& log = logged.log;
  std::unique_ptr<Ledger>& ledger = logged.ledger;
  ASSERT_TRUE(ledger->init().is_ok());
  const std::string a = id_on_shard(*ledger, "a", 0), b = id_on_shard(*ledger, "b", 1),
                    ghost = id_on_shard(*ledger, "ghost", 1);
  ASSERT_TRUE(create_accounts(*ledger, {{a, 100}, {b, 0}}).is_ok());
  SagaEngine engine(*ledger, {std::string(kOwner), kLeaseMs, 5}, nullptr);
  TwoPhaseBatch batch(*ledger, kOwner);
  auto run = [&](const std::vector<Req>& reqs) {
    log.clear();
    std::vector<SagaItem> items;
    for (const Req& r : reqs) items.push_back(fresh_item(r));
    Status s = batch.begin();
    if (s) s = insert(*ledger, reqs, kOwner);
    if (s) s = engine.run_across(items);
    if (s) s = batch.commit();
    EXPECT_TRUE(s.is_ok()) << s.message();
    return items;
  };
  run({{"t-1", a, b, 10, ""}});
  EXPECT_EQ(log, (std::vector<std::string>{"1:read_accounts", "0:read_accounts"}));
  const std::vector<SagaItem> unknown = run({{"t-2", a, ghost, 10, ""}});  // a known
  EXPECT_EQ(log, (std::vector<std::string>{"1:read_accounts", "1:load_accounts", "0:load_accounts"}));
  EXPECT_EQ(unknown[0].reason, Reason::unknown_account);
  engine.lock_next_walk();
  run({{"t-3", a, b, 10, ""}});
  EXPECT_EQ(log, (std::vector<std::string>{"1:load_accounts", "0:load_accounts"}));
  run({{"t-4", a, b, 10, ""}});  // read, as the walks after a failed batch are
  EXPECT_EQ(log, (std::vector<std::string>{"1:read_accounts", "0:read_accounts"}));
  EXPECT_EQ(balance(*ledger, a), 70);
  EXPECT_EQ(balance(*ledger, b), 30);
  EXPECT_TRUE(audit_passes(*ledger));
}

// What a walk left known may have moved since, under another worker. Where
// that changes no verdict the moves stand on the rows as they are; where it
// does, they do not, and the batch runs again on the accounts read locked,
// ending as it would one transfer at a time. An account with a refused leg
// is read again by the next walk.
TEST(AcrossStores, AWalkOnAccountsMovedSinceItsEngineLastSawThemEndsAsOneByOne) {
  LoggedStores logged;
  std::vector<std::string>& log = logged.log;
  std::unique_ptr<Ledger>& ledger = logged.ledger;
  ASSERT_TRUE(ledger->init().is_ok());
  const std::string a = id_on_shard(*ledger, "a", 0), b = id_on_shard(*ledger, "b", 1);
  ASSERT_TRUE(create_accounts(*ledger, {{a, 100}, {b, 0}}).is_ok());
  SagaEngine mine(*ledger, {"worker-1", kLeaseMs, 5}, nullptr);
  SagaEngine other(*ledger, {"worker-2", kLeaseMs, 5}, nullptr);
  // One attempt at a batch, as Worker::write_across makes it.
  auto attempt = [&](SagaEngine& engine, const std::string& owner, const Req& req, SagaItem& item) {
    log.clear();
    TwoPhaseBatch batch(*ledger, owner);
    item = fresh_item(req);
    std::vector<SagaItem> items{item};
    Status s = batch.begin();
    if (s) s = insert(*ledger, {req}, owner);
    if (s) s = engine.run_across(items);
    if (s) s = batch.commit();
    if (!s) {
      batch.rollback();
      engine.lock_next_walk();
    }
    item = items[0];
    return s;
  };
  SagaItem item;
  ASSERT_TRUE(attempt(mine, "worker-1", {"t-1", a, b, 10, ""}, item).is_ok());
  EXPECT_EQ(log, (std::vector<std::string>{"1:read_accounts", "0:read_accounts"}));
  ASSERT_TRUE(attempt(mine, "worker-1", {"t-2", a, b, 10, ""}, item).is_ok());
  EXPECT_TRUE(log.empty());  // both known: a at 80
  EXPECT_EQ(item.state, S::done);
  ASSERT_TRUE(attempt(other, "worker-2", {"t-3", a, b, 30, ""}, item).is_ok());
  EXPECT_EQ(balance(*ledger, a), 50);
  // a at 80 as known, 50 as it is: no verdict changes, the moves stand.
  ASSERT_TRUE(attempt(mine, "worker-1", {"t-4", a, b, 40, ""}, item).is_ok());
  EXPECT_TRUE(log.empty());
  EXPECT_EQ(item.state, S::done);
  EXPECT_EQ(balance(*ledger, a), 10);
  // a at 40 as known, 10 as it is: the debit of 20 would overdraw it.
  const Req t5{"t-5", a, b, 20, ""};
  EXPECT_EQ(attempt(mine, "worker-1", t5, item).kind(), ErrorKind::retry_stage);
  EXPECT_TRUE(log.empty());
  EXPECT_FALSE(load(*ledger, "t-5").has_value());  // the batch rolled back whole
  EXPECT_EQ(balance(*ledger, a), 10);
  ASSERT_TRUE(attempt(mine, "worker-1", t5, item).is_ok());
  EXPECT_EQ(log, (std::vector<std::string>{"1:load_accounts", "0:load_accounts"}));
  EXPECT_EQ(item.state, S::canceled);
  EXPECT_EQ(item.reason, Reason::insufficient_funds);
  // A third engine, new: a, refused, is read again; b is known.
  SagaEngine third(*ledger, {"worker-3", kLeaseMs, 5}, nullptr);
  ASSERT_TRUE(attempt(third, "worker-3", {"t-6", a, b, 50, ""}, item).is_ok());
  EXPECT_EQ(item.reason, Reason::insufficient_funds);
  ASSERT_TRUE(attempt(third, "worker-3", {"t-7", a, b, 10, ""}, item).is_ok());
  EXPECT_EQ(log, (std::vector<std::string>{"0:read_accounts"}));
  EXPECT_EQ(item.state, S::done);
  EXPECT_EQ(balance(*ledger, a), 0);
  EXPECT_EQ(balance(*ledger, b), 100);
  EXPECT_TRUE(audit_passes(*ledger));
}

// A decision that never committed is recorded as an abort by whoever asks
// first, so the batch's first store can never commit it afterwards.
TEST(AcrossStores, AnUndecidedBatchCanNoLongerCommitOnceDecided) {
  std::unique_ptr<Ledger> ledger = preparing_ledger(2);
  Store& first = ledger->transfers();
  bool committed = true;
  ASSERT_TRUE(first.decide("saga:x:1", committed).is_ok());
  EXPECT_FALSE(committed);
  ASSERT_TRUE(first.begin_scope().is_ok());
  EXPECT_FALSE(first.record_decision("saga:x:1").is_ok());
  ASSERT_TRUE(first.end_scope(false).is_ok());
  ASSERT_TRUE(first.begin_scope().is_ok());
  ASSERT_TRUE(first.record_decision("saga:x:2").is_ok());
  ASSERT_TRUE(first.end_scope(true).is_ok());
  ASSERT_TRUE(first.decide("saga:x:2", committed).is_ok());
  EXPECT_TRUE(committed);
}

// A transfer that could run in the first store's transaction waits for an
// earlier one of the batch that shares its source but not its store: one by
// one, the earlier takes the funds.
TEST(FirstStoreFirst, ALaterTransferOnTheFirstStoreWaitsForAnEarlierOneSharingAnAccount) {
  test::TempDir dir{"saga-engine-first-store"};
  LedgerFiles lf;
  ASSERT_TRUE(lf.open(dir.path(), 2).is_ok());
  Ledger& ledger = *lf.ledger;
  const std::string a = id_on_shard(ledger, "a", 0), b = id_on_shard(ledger, "b", 1),
                    c = id_on_shard(ledger, "c", 0), d = id_on_shard(ledger, "d", 0),
                    e = id_on_shard(ledger, "e", 0);
  ASSERT_TRUE(create_accounts(ledger, {{a, 100}, {b, 0}, {c, 0}, {d, 50}, {e, 0}}).is_ok());
  const std::vector<Req> reqs = {{"t-1", a, b, 100, ""}, {"t-2", a, c, 100, ""}, {"t-3", d, e, 50, ""}};
  std::vector<SagaItem> kept, rest;
  for (const Req& r : reqs) kept.push_back(fresh_item(r));
  SagaEngine engine(ledger, {std::string(kOwner), kLeaseMs, 5}, nullptr);
  engine.split_first_store(kept, rest);
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept[0].id, "t-3");
  ASSERT_EQ(rest.size(), 2u);
  EXPECT_EQ(rest[0].id, "t-1");
  EXPECT_EQ(rest[1].id, "t-2");

  ASSERT_TRUE(ledger.transfers().begin_scope().is_ok());
  ASSERT_TRUE(insert(ledger, reqs, kOwner).is_ok());
  ASSERT_TRUE(engine.run_in_scope(kept).is_ok());
  ASSERT_TRUE(ledger.transfers().end_scope(true).is_ok());
  EXPECT_EQ(kept[0].state, S::done);
  for (const std::string id : {"t-1", "t-2"}) EXPECT_EQ(load(ledger, id)->state, S::initial) << id;
  for (SagaItem& it : rest) it.fresh = false;
  ASSERT_TRUE(engine.run(rest).is_ok());
  EXPECT_EQ(load(ledger, "t-1")->state, S::done);
  EXPECT_EQ(load(ledger, "t-2")->state, S::canceled);
  EXPECT_EQ(load(ledger, "t-2")->reason, Reason::insufficient_funds);
  EXPECT_EQ(balance(ledger, b), 100);
  EXPECT_EQ(balance(ledger, e), 50);
  EXPECT_TRUE(audit_passes(ledger));
}

TEST(FirstStoreFirst, ATransferWithAnAccountElsewhereIsRefusedInTheFirstStoresTransaction) {
  test::TempDir dir{"saga-engine-first-store"};
  LedgerFiles lf;
  ASSERT_TRUE(lf.open(dir.path(), 2).is_ok());
  Ledger& ledger = *lf.ledger;
  const std::vector<Req> reqs = {{"t-1", id_on_shard(ledger, "a", 0), id_on_shard(ledger, "b", 1), 1, ""}};
  std::vector<SagaItem> items = {fresh_item(reqs[0])};
  SagaEngine engine(ledger, {std::string(kOwner), kLeaseMs, 5}, nullptr);
  ASSERT_TRUE(ledger.transfers().begin_scope().is_ok());
  const Status s = engine.run_in_scope(items);
  ASSERT_TRUE(ledger.transfers().end_scope(false).is_ok());
  EXPECT_EQ(s.kind(), ErrorKind::fatal);
  EXPECT_NE(s.message().find("t-1 has an account on another store"), std::string::npos) << s.message();
}

// The smallest cases behind a difference: a debit in a batch must see the
// credit (or the reversal) of an earlier transfer of the same batch.
TEST_P(EngineTest, BatchDebitSeesTheCreditOfAnEarlierTransferInTheBatch) {
  const std::string a = src("a"), b = dst("b"), c = src("c");
  accounts({{a, 100}, {b, 0}, {c, 0}});
  run_batch({{"t-1", a, b, 100, ""}, {"t-2", b, c, 100, ""}});
  // One by one, t-1 credits b with 100 before t-2 debits it.
  expect_outcome("t-1", S::done, Reason::none, "debit+credit");
  expect_outcome("t-2", S::done, Reason::none, "debit+credit");
  EXPECT_EQ(balance(ledger(), c), 100);
  EXPECT_TRUE(audit_passes(ledger()));
}

TEST_P(EngineTest, BatchDebitSeesTheReversalOfAnEarlierTransferInTheBatch) {
  const std::string a = src("a"), ghost = dst("ghost"), b = dst("b");
  accounts({{a, 100}, {b, 0}});
  run_batch({{"t-1", a, ghost, 100, ""}, {"t-2", a, b, 100, ""}});
  // One by one, t-1's debit is reversed before t-2 debits a.
  expect_outcome("t-1", S::canceled, Reason::unknown_account, "debit+reverse_debit");
  expect_outcome("t-2", S::done, Reason::none, "debit+credit");
  EXPECT_EQ(balance(ledger(), b), 100);
  EXPECT_TRUE(audit_passes(ledger()));
}

// ---- fencing: stale epochs and zombies ---------------------------------------------

TEST_P(EngineTest, StaleEpochChangesNothing) {
  const auto [a, b, reqs] = submit_one();
  std::vector<SagaItem> stale = items_for(ledger(), reqs);  // worker-a at epoch 1
  const std::optional<TransferDoc> taken = take_over("t-1", "worker-b");
  ASSERT_TRUE(taken.has_value());
  EXPECT_EQ(taken->epoch, 2);
  EXPECT_EQ(taken->owner, "worker-b");
  EXPECT_EQ(taken->attempts, 1);

  ASSERT_TRUE(run_engine(ledger(), kOwner, stale, observer_).is_ok());
  EXPECT_TRUE(stale[0].dropped);
  EXPECT_EQ(observer_.transitions(), 0u);
  const TransferDoc after = doc("t-1");
  EXPECT_EQ(after.state, S::initial);
  EXPECT_EQ(after.owner, "worker-b");
  EXPECT_EQ(after.epoch, 2);
  EXPECT_EQ(after.last_modified_ms, taken->last_modified_ms);
  if (ledger().shard_count() == 1) {
    // The claim is the batch's first write, and it is fenced out.
    expect_balances({{a, 100}, {b, 0}});
    EXPECT_EQ(posting_kinds(ledger(), "t-1"), "none");
  } else {
    // Several stores write no claim (only what recovery needs): the stale
    // owner posts the legs, which the journal and the voids fence, not the
    // epoch (store.hpp), and its finish is fenced out.
    expect_balances({{a, 60}, {b, 40}});
    EXPECT_EQ(posting_kinds(ledger(), "t-1"), "debit+credit");
    EXPECT_TRUE(pending_entries(ledger()).empty());
  }

  // The new owner finishes it; the stale owner's replay then changes nothing.
  ASSERT_TRUE(run_taken_over("worker-b", *taken).is_ok());
  expect_outcome("t-1", S::done, Reason::none, "debit+credit");
  stale = items_for(ledger(), reqs);
  stale[0].epoch = 1;
  stale[0].state = S::pending;
  ASSERT_TRUE(run_engine(ledger(), kOwner, stale, observer_).is_ok());
  EXPECT_TRUE(stale[0].dropped);
  expect_balances({{a, 60}, {b, 40}});
  EXPECT_EQ(doc("t-1").epoch, 2);
  EXPECT_TRUE(audit_passes(ledger()));
}

// Legs are fenced by the journal and by voids, not by the epoch (store.hpp):
// a stale owner resuming a `pending` transfer may post its legs, but never
// moves the transfer and never posts a leg twice.
TEST_P(EngineTest, StaleOwnerOfAPendingTransferNeverMovesItNorAppliesTwice) {
  const auto [a, b, reqs] = submit_one();
  ASSERT_TRUE(move_to_pending("t-1"));
  std::vector<SagaItem> stale = items_for(ledger(), reqs);
  const std::optional<TransferDoc> taken = take_over("t-1", "worker-b");
  ASSERT_TRUE(taken.has_value());

  ASSERT_TRUE(run_engine(ledger(), kOwner, stale, observer_).is_ok());
  EXPECT_TRUE(stale[0].dropped);
  EXPECT_EQ(doc("t-1").state, S::pending);
  EXPECT_EQ(doc("t-1").epoch, 2);
  EXPECT_EQ(observer_.transitions(), 0u);

  ASSERT_TRUE(run_taken_over("worker-b", *taken).is_ok());
  expect_outcome("t-1", S::done, Reason::none, "debit+credit");
  expect_balances({{a, 60}, {b, 40}});
  EXPECT_TRUE(audit_passes(ledger()));
}

TEST_P(EngineTest, ZombieCanceledByAnotherOwnerPostsNothing) {
  const auto [a, b, reqs] = submit_one();
  ASSERT_TRUE(move_to_pending("t-1"));
  std::vector<SagaItem> zombie = items_for(ledger(), reqs);  // A, pending, epoch 1, then paused

  ActionOutcome out;
  ASSERT_TRUE(cancel("t-1", "operator-b", out));
  EXPECT_EQ(out.result, ActionResult::done) << out.message;
  EXPECT_EQ(out.state, S::canceled);
  expect_outcome("t-1", S::canceled, Reason::canceled_by_operator, "none");

  ASSERT_TRUE(run_engine(ledger(), kOwner, zombie, observer_).is_ok());
  EXPECT_TRUE(zombie[0].dropped);
  EXPECT_EQ(posting_kinds(ledger(), "t-1"), "none");
  expect_balances({{a, 100}, {b, 0}});
  EXPECT_EQ(doc("t-1").state, S::canceled);
  EXPECT_EQ(doc("t-1").owner, "operator-b");
  EXPECT_TRUE(audit_passes(ledger()));
}

TEST_P(EngineTest, ZombieThatDebitedBeforeTheCancelNeverCredits) {
  const auto [a, b, reqs] = submit_one();
  ASSERT_TRUE(move_to_pending("t-1"));
  std::vector<SagaItem> zombie = items_for(ledger(), reqs);
  ASSERT_EQ(apply_leg(ledger(), LegOp::debit, "t-1", a, 40).status, LegStatus::posted);

  ActionOutcome out;
  ASSERT_TRUE(cancel("t-1", "operator-b", out));
  EXPECT_EQ(out.result, ActionResult::done) << out.message;
  expect_outcome("t-1", S::canceled, Reason::canceled_by_operator, "debit+reverse_debit");

  ASSERT_TRUE(run_engine(ledger(), kOwner, zombie, observer_).is_ok());
  EXPECT_TRUE(zombie[0].dropped);
  EXPECT_EQ(posting_kinds(ledger(), "t-1"), "debit+reverse_debit");
  expect_balances({{a, 100}, {b, 0}});
  EXPECT_TRUE(pending_entries(ledger()).empty());
  EXPECT_TRUE(audit_passes(ledger()));
}

// ---- operator actions -----------------------------------------------------------------

TEST_P(EngineTest, CancelIsRefusedOnceAppliedAndOnceDone) {
  const auto [a, b, reqs] = submit_one();
  ASSERT_TRUE(move_to_pending("t-1"));
  ASSERT_TRUE(post_both_legs("t-1", a, b, 40));
  ASSERT_TRUE(store_transition(ledger(), "t-1", S::pending, S::applied, Reason::none, kOwner, 1));

  ActionOutcome out;
  ASSERT_TRUE(cancel("t-1", "operator", out));
  EXPECT_EQ(out.result, ActionResult::refused);
  EXPECT_EQ(out.state, S::applied);
  EXPECT_NE(out.message.find("applied"), std::string::npos) << out.message;
  EXPECT_EQ(doc("t-1").state, S::applied);
  EXPECT_EQ(doc("t-1").epoch, 1) << "a refused cancel must not take the transfer over";

  std::vector<SagaItem> items = items_for(ledger(), reqs);
  ASSERT_TRUE(run_engine(ledger(), kOwner, items, observer_).is_ok());
  expect_outcome("t-1", S::done, Reason::none, "debit+credit");
  ASSERT_TRUE(cancel("t-1", "operator", out));
  EXPECT_EQ(out.result, ActionResult::refused);
  EXPECT_EQ(out.state, S::done);
  expect_outcome("t-1", S::done, Reason::none, "debit+credit");
  expect_balances({{a, 60}, {b, 40}});

  // Canceled already, and unknown.
  const std::string ghost = dst("ghost");
  run_batch({{"t-2", a, ghost, 1, ""}});
  ASSERT_TRUE(cancel("t-2", "operator", out));
  EXPECT_EQ(out.result, ActionResult::preempted);
  EXPECT_EQ(out.state, S::canceled);
  EXPECT_NE(out.message.find("already canceled by worker-a (reason unknown_account)"),
            std::string::npos)
      << out.message;
  ASSERT_TRUE(cancel("t-nope", "operator", out));
  EXPECT_EQ(out.result, ActionResult::not_found);
  EXPECT_TRUE(audit_passes(ledger()));
}

// The operator's own ledger on the same files, whose take_over first lets
// `act` run: what a worker does between the command's read and its take-over.
class BeforeTakeOver final : public sim::FaultHooks {
 public:
  explicit BeforeTakeOver(std::function<void()> act) : act_(std::move(act)) {}
  Status on_call(std::string_view op, sim::Phase phase, bool) override {
    if (op == "take_over" && phase == sim::Phase::before && act_) std::exchange(act_, nullptr)();
    return Status::ok();
  }

 private:
  std::function<void()> act_;
};

std::unique_ptr<Ledger> operator_ledger(const LedgerFiles& files, sim::FaultHooks& hooks) {
  std::vector<std::unique_ptr<Store>> stores;
  for (const auto& f : files.files) {
    std::unique_ptr<Store> s;
    EXPECT_TRUE(open_store("sqlite:" + f.string(), s).is_ok());
    stores.push_back(std::make_unique<sim::FaultStore>(std::move(s), hooks));
  }
  return Ledger::from_stores(std::move(stores));
}

// Issue 19, finding 6: a worker cancels the transfer for its own reason after
// `sagactl cancel` read it; the command used to report "canceled", exit 0.
TEST_P(EngineTest, CancelReportsACancelAWorkerMadeAfterItsRead) {
  const std::vector<Req> reqs = submit_one(500).reqs;  // an overdraft
  BeforeTakeOver worker_first([&] {
    std::vector<SagaItem> items = items_for(ledger(), reqs);
    ASSERT_TRUE(run_engine(ledger(), kOwner, items, observer_).is_ok());
  });
  std::unique_ptr<Ledger> op = operator_ledger(main_, worker_first);
  ActionOutcome out;
  ASSERT_TRUE(cancel("t-1", "operator", out, op.get()));
  EXPECT_EQ(out.result, ActionResult::preempted) << out.message;
  EXPECT_EQ(out.state, S::canceled);
  EXPECT_NE(out.message.find("already canceled by worker-a (reason insufficient_funds), not by "
                             "this command"),
            std::string::npos)
      << out.message;
  expect_outcome("t-1", S::canceled, Reason::insufficient_funds, "none");
  EXPECT_EQ(doc("t-1").owner, kOwner) << "a finished transfer is not taken over";
  EXPECT_EQ(doc("t-1").epoch, 1);
}

// The worker got as far as canceling (its debit posted, the destination
// unknown) when the command took over: the command finishes that
// compensation and says whose cancel it was.
TEST_P(EngineTest, CancelFinishesAWorkersCancelAndSaysSo) {
  const std::string a = submit_one().a;
  ASSERT_TRUE(move_to_pending("t-1"));
  ASSERT_EQ(apply_leg(ledger(), LegOp::debit, "t-1", a, 40).status, LegStatus::posted);
  BeforeTakeOver worker_first([&] {
    ASSERT_TRUE(store_transition(ledger(), "t-1", S::pending, S::canceling,
                                 Reason::account_locked, kOwner, 1));
  });
  std::unique_ptr<Ledger> op = operator_ledger(main_, worker_first);
  ActionOutcome out;
  ASSERT_TRUE(cancel("t-1", "operator", out, op.get()));
  EXPECT_EQ(out.result, ActionResult::preempted) << out.message;
  EXPECT_NE(out.message.find("being canceled by a worker (reason account_locked), not by this "
                             "command; this command finished that cancel"),
            std::string::npos)
      << out.message;
  expect_outcome("t-1", S::canceled, Reason::account_locked, "debit+reverse_debit");
  EXPECT_EQ(balance(ledger(), a), 100);
}

TEST_P(EngineTest, CancelOfAPendingTransferWithBothLegsPostedRollsForward) {
  const auto [a, b, reqs] = submit_one();
  ASSERT_TRUE(move_to_pending("t-1"));
  ASSERT_TRUE(post_both_legs("t-1", a, b, 40));

  ActionOutcome out;
  ASSERT_TRUE(cancel("t-1", "operator", out));
  EXPECT_EQ(out.result, ActionResult::refused) << out.message;
  EXPECT_EQ(out.state, S::done);
  expect_outcome("t-1", S::done, Reason::none, "debit+credit");
  EXPECT_TRUE(audit_passes(ledger()));
}

TEST_P(EngineTest, RetryFinishesANonTerminalTransferAndRefusesATerminalOne) {
  submit_one();
  ASSERT_TRUE(move_to_pending("t-1"));
  ActionOutcome out;
  ASSERT_TRUE(retry("t-1", "operator", out));
  EXPECT_EQ(out.result, ActionResult::done) << out.message;
  EXPECT_EQ(out.state, S::done);
  expect_outcome("t-1", S::done, Reason::none, "debit+credit");
  EXPECT_EQ(doc("t-1").owner, "operator");
  EXPECT_EQ(doc("t-1").epoch, 2);
  ASSERT_TRUE(retry("t-1", "operator", out));
  EXPECT_EQ(out.result, ActionResult::refused);
  ASSERT_TRUE(retry("t-nope", "operator", out));
  EXPECT_EQ(out.result, ActionResult::not_found);
  EXPECT_TRUE(audit_passes(ledger()));
}

// ---- roll-forward -------------------------------------------------------------------

TEST_P(EngineTest, CancelingWithTheCreditPostedRollsForwardToDone) {
  const auto [a, b, reqs] = submit_one();
  ASSERT_TRUE(move_to_pending("t-1"));
  ASSERT_TRUE(post_both_legs("t-1", a, b, 40));
  ASSERT_TRUE(store_transition(ledger(), "t-1", S::pending, S::canceling, Reason::insufficient_funds,
                               kOwner, 1));

  std::vector<SagaItem> items = items_for(ledger(), reqs);
  ASSERT_EQ(items[0].state, S::canceling);
  ASSERT_TRUE(run_engine(ledger(), kOwner, items, observer_).is_ok());
  EXPECT_EQ(items[0].state, S::done);
  expect_outcome("t-1", S::done, Reason::none, "debit+credit");
  ASSERT_EQ(observer_.edges.size(), 2u);
  EXPECT_EQ(observer_.edges[0].from, S::canceling);
  EXPECT_EQ(observer_.edges[0].to, S::applied);
  EXPECT_EQ(observer_.edges[1].from, S::applied);
  EXPECT_EQ(observer_.edges[1].to, S::done);
  EXPECT_TRUE(observer_.compensations.empty());
  expect_balances({{a, 60}, {b, 40}});
  EXPECT_TRUE(pending_entries(ledger()).empty());
  EXPECT_TRUE(audit_passes(ledger()));
}

// ---- the audit catches corruption -------------------------------------------------------

TEST_P(EngineTest, AuditFailsOnACorruptedLedger) {
  audit_after_ = false;
  const std::string a = src("a"), b = dst("b");
  accounts({{a, 100}, {b, 0}});
  run_batch({{"t-1", a, b, 40, ""}});
  ASSERT_TRUE(audit_passes(ledger()));

  // The invariants the audit fails, and its report, while `corrupt` (SQL on
  // `file`) is in force; `undo`, if any, then puts the ledger back.
  auto audit_corrupted = [&](const std::filesystem::path& file, const std::string& corrupt,
                             const std::string& undo) {
    exec_sql(file, corrupt);
    AuditReport report;
    EXPECT_TRUE(run_audit(ledger(), {}, report).is_ok());
    std::set<int> failed;
    for (const AuditCheck& c : report.checks) {
      if (!c.ok) failed.insert(c.invariant);
    }
    EXPECT_FALSE(report.ok());
    if (!undo.empty()) exec_sql(file, undo);
    return std::pair{failed, report.to_text()};
  };
  const std::string where_a = " WHERE id = '" + a + "'";

  // A balance changed behind the journal's back: conservation and journal.
  auto [failed, text] =
      audit_corrupted(main_.file_of(a), "UPDATE accounts SET balance = balance + 7" + where_a,
                      "UPDATE accounts SET balance = balance - 7" + where_a);
  EXPECT_EQ(failed, (std::set<int>{1, 3})) << text;
  EXPECT_NE(text.find(a), std::string::npos) << text;
  ASSERT_TRUE(audit_passes(ledger()));

  // A pending entry naming a done transfer.
  std::tie(failed, text) = audit_corrupted(
      main_.file_of(b), "INSERT INTO pending(account_id, transfer_id) VALUES ('" + b + "', 't-1')",
      "DELETE FROM pending WHERE account_id = '" + b + "'");
  EXPECT_EQ(failed, (std::set<int>{5})) << text;

  // A reservation that is not what the pending debits hold.
  std::tie(failed, text) = audit_corrupted(main_.file_of(a), "UPDATE accounts SET reserved = 5" + where_a,
                                           "UPDATE accounts SET reserved = 0" + where_a);
  EXPECT_EQ(failed, (std::set<int>{3})) << text;
  EXPECT_NE(text.find(a + ": reserved 5 != pending debits 0"), std::string::npos) << text;
  ASSERT_TRUE(audit_passes(ledger()));

  // A balance below its minimum.
  std::tie(failed, text) =
      audit_corrupted(main_.file_of(a), "UPDATE accounts SET min_balance = 1000" + where_a,
                      "UPDATE accounts SET min_balance = 0" + where_a);
  EXPECT_EQ(failed, (std::set<int>{2})) << text;

  // A done transfer that lost its credit.
  std::tie(failed, text) = audit_corrupted(
      main_.file_of(b), "DELETE FROM postings WHERE transfer_id = 't-1' AND kind = 'credit'", "");
  EXPECT_TRUE(failed.count(3) == 1 && failed.count(4) == 1) << text;
}

}  // namespace
}  // namespace sagapool
