// The store contract (store.hpp) as tests: every backend runs every case.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <tuple>

#include "store_test.hpp"

namespace sagapool::test {
namespace {

using S = TransferState;
constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();

void expect_same_doc(const TransferDoc& a, const TransferDoc& b) {
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.source, b.source);
  EXPECT_EQ(a.destination, b.destination);
  EXPECT_EQ(a.amount, b.amount);
  EXPECT_EQ(a.currency, b.currency);
  EXPECT_EQ(a.metadata, b.metadata);
  EXPECT_EQ(a.payload_hash, b.payload_hash);
  EXPECT_EQ(a.state, b.state);
  EXPECT_EQ(a.owner, b.owner);
  EXPECT_EQ(a.epoch, b.epoch);
  EXPECT_EQ(a.lease_until_ms, b.lease_until_ms);
  EXPECT_EQ(a.reason, b.reason);
  EXPECT_EQ(a.created_at_ms, b.created_at_ms);
  EXPECT_EQ(a.last_modified_ms, b.last_modified_ms);
  EXPECT_EQ(a.requested_at_ms, b.requested_at_ms);
  EXPECT_EQ(a.finished_at_ms, b.finished_at_ms);
  EXPECT_EQ(a.attempts, b.attempts);
  EXPECT_EQ(a.notified, b.notified);
  EXPECT_EQ(a.origin.topic, b.origin.topic);
  EXPECT_EQ(a.origin.partition, b.origin.partition);
  EXPECT_EQ(a.origin.offset, b.origin.offset);
}

using PostingKey = std::tuple<std::string, std::string, PostingKind, std::int64_t>;
std::set<PostingKey> posting_keys(const std::vector<Posting>& ps) {
  std::set<PostingKey> out;
  for (const Posting& p : ps) out.emplace(p.transfer_id, p.account_id, p.kind, p.amount);
  return out;
}

std::vector<std::string> sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::vector<std::string> ids_of(const std::vector<TransferDoc>& docs) {
  std::vector<std::string> out;
  for (const TransferDoc& d : docs) out.push_back(d.id);
  return out;
}

// Runs `call` again while it reports a transient error (a busy store under
// the concurrency tests), at most ~10 s.
template <typename Call>
Status with_retries(Call call) {
  Status s = call();
  for (int i = 0; i < 1000 && s.is_transient(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    s = call();
  }
  return s;
}

// ---- schema, topology, clock -------------------------------------------------

TEST_P(StoreTest, InitSchemaTwiceIsANoOp) {
  create(make_account("acct-a", 500));
  EXPECT_EQ(insert(spec("t-1")), InsertResult::inserted);
  SAGA_ASSERT_OK(store_->init_schema());
  SAGA_ASSERT_OK(store_->init_schema());
  auto other = second_connection();
  ASSERT_NE(other, nullptr);
  SAGA_ASSERT_OK(other->init_schema());
  EXPECT_EQ(account("acct-a").balance, 500);
  EXPECT_EQ(load("t-1").state, S::initial);
}

TEST_P(StoreTest, TopologyIsAbsentUntilWrittenThenReadsBack) {
  std::optional<Topology> t;
  // What `t` read back: the fields written, at this build's schema version.
  const auto expect_read_back = [&](const std::string& ledger_id, int shard_index, int shard_count) {
    EXPECT_EQ(t->ledger_id, ledger_id);
    EXPECT_EQ(t->shard_index, shard_index);
    EXPECT_EQ(t->shard_count, shard_count);
    EXPECT_EQ(t->schema_version, kSchemaVersion);
  };
  SAGA_ASSERT_OK(store_->read_topology(t));
  EXPECT_FALSE(t.has_value());

  SAGA_ASSERT_OK(store_->write_topology({"ledger-1", 1, 3, kSchemaVersion}));
  SAGA_ASSERT_OK(store_->read_topology(t));
  ASSERT_TRUE(t.has_value());
  expect_read_back("ledger-1", 1, 3);

  // Rewritten, then kept by a later init.
  SAGA_ASSERT_OK(store_->write_topology({"ledger-2", 0, 1, kSchemaVersion}));
  SAGA_ASSERT_OK(store_->init_schema());
  auto other = second_connection();
  ASSERT_NE(other, nullptr);
  SAGA_ASSERT_OK(other->read_topology(t));
  ASSERT_TRUE(t.has_value());
  expect_read_back("ledger-2", 0, 1);
}

TEST_P(StoreTest, AnUninitialisedStoreHasNoTopology) {
  auto raw = fresh_store(/*init=*/false);
  ASSERT_NE(raw, nullptr);
  std::optional<Topology> t;
  SAGA_ASSERT_OK(raw->read_topology(t));
  EXPECT_FALSE(t.has_value());
  SAGA_ASSERT_OK(raw->init_schema());
  SAGA_ASSERT_OK(raw->read_topology(t));
  EXPECT_FALSE(t.has_value()) << "init alone records no topology";
}

TEST_P(StoreTest, ClockIsMillisecondsSinceTheEpochAndAdvances) {
  const auto wall = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  const std::int64_t a = store_now();
  EXPECT_LT(std::llabs(a - wall), 60'000) << "store and test run on one machine";
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_GT(store_now(), a);
}

TEST_P(StoreTest, DisplayNameNamesTheStore) { EXPECT_FALSE(store_->display_name().empty()); }

// ---- insert ----------------------------------------------------------------------

TEST_P(StoreTest, InsertCreatesAnInitialDocumentWithALease) {
  TransferSpec t = spec("t-1");
  t.currency = "EUR";
  t.metadata = R"({"ref":"invoice \"9\" a\\b","n":[1,2]})";  // quotes and a backslash: escaped on the way
  const std::int64_t before = store_now();
  EXPECT_EQ(insert(t, "worker-1", 30'000), InsertResult::inserted);
  const std::int64_t after = store_now();

  const TransferDoc d = load("t-1");
  EXPECT_EQ(d.id, "t-1");
  EXPECT_EQ(d.source, "acct-a");
  EXPECT_EQ(d.destination, "acct-b");
  EXPECT_EQ(d.amount, 100);
  EXPECT_EQ(d.currency, "EUR");
  EXPECT_EQ(d.metadata, t.metadata);
  EXPECT_EQ(d.payload_hash, payload_hash(t.view()));
  EXPECT_EQ(d.state, S::initial);
  EXPECT_EQ(d.owner, "worker-1");
  EXPECT_EQ(d.epoch, 1);
  EXPECT_EQ(d.reason, Reason::none);
  EXPECT_GE(d.created_at_ms, before);
  EXPECT_LE(d.created_at_ms, after);
  EXPECT_EQ(d.last_modified_ms, d.created_at_ms);
  EXPECT_EQ(d.lease_until_ms, d.created_at_ms + 30'000);
  EXPECT_EQ(d.requested_at_ms, t.requested_at_ms);
  EXPECT_EQ(d.finished_at_ms, 0);
  EXPECT_EQ(d.attempts, 0);
  EXPECT_FALSE(d.notified);
  EXPECT_EQ(d.origin.topic, "transfers.requests");
  EXPECT_EQ(d.origin.partition, 3);
  EXPECT_EQ(d.origin.offset, 42);

  std::optional<TransferDoc> missing;
  SAGA_ASSERT_OK(store_->load_transfer("t-missing", missing));
  EXPECT_FALSE(missing.has_value());
}

TEST_P(StoreTest, InsertKeepsAllSixtyFourHashBitsAndEmptyOptionalFields) {
  TransferSpec t = spec("t-hash");
  t.hash = 0xFEDCBA9876543210ULL;
  EXPECT_EQ(insert(t), InsertResult::inserted);
  const TransferDoc d = load("t-hash");
  EXPECT_EQ(d.payload_hash, 0xFEDCBA9876543210ULL);
  EXPECT_EQ(d.currency, "");
  EXPECT_EQ(d.metadata, "");
  EXPECT_EQ(insert(t), InsertResult::duplicate);
}

TEST_P(StoreTest, InsertTellsDuplicatesFromConflictsAndTheFirstStands) {
  TransferSpec t = spec("t-1");
  t.currency = "EUR";
  t.metadata = R"({"a":1})";
  EXPECT_EQ(insert(t, "w1"), InsertResult::inserted);
  const TransferDoc first = load("t-1");

  // Same payload from another worker: a duplicate that changes nothing.
  EXPECT_EQ(insert(t, "w2", 1), InsertResult::duplicate);

  TransferSpec amount = t;
  amount.amount = 200;
  EXPECT_EQ(insert(amount), InsertResult::conflict);
  TransferSpec to = t;
  to.to = "acct-c";
  EXPECT_EQ(insert(to), InsertResult::conflict);
  TransferSpec currency = t;
  currency.currency = "USD";
  EXPECT_EQ(insert(currency), InsertResult::conflict);
  TransferSpec metadata = t;
  metadata.metadata = R"({"a":2})";
  EXPECT_EQ(insert(metadata), InsertResult::conflict);
  // Same hash (a collision) but other fields: still a conflict.
  TransferSpec collision = t;
  collision.from = "acct-z";
  collision.hash = payload_hash(t.view());
  EXPECT_EQ(insert(collision), InsertResult::conflict);
  // Same fields, other hash: a conflict too.
  TransferSpec other_hash = t;
  other_hash.hash = payload_hash(t.view()) ^ 1;
  EXPECT_EQ(insert(other_hash), InsertResult::conflict);
  // Origin and request time are not payload.
  TransferSpec redelivered = t;
  redelivered.offset = 99;
  redelivered.requested_at_ms += 5;
  EXPECT_EQ(insert(redelivered), InsertResult::duplicate);

  expect_same_doc(load("t-1"), first);
}

TEST_P(StoreTest, InsertBatchWithTheSameIdTwiceIsAppliedInOrder) {
  const TransferSpec a = spec("t-1");
  TransferSpec changed = a;
  changed.amount = 999;
  const TransferSpec b = spec("t-2", "acct-x", "acct-y");
  const std::vector<NewTransfer> batch = {a.to_new(), a.to_new(), changed.to_new(), b.to_new(),
                                          b.to_new()};
  std::vector<InsertResult> results(batch.size(), InsertResult::conflict);
  SAGA_ASSERT_OK(store_->insert_transfers(batch, "w1", 60'000, results));
  EXPECT_EQ(results, (std::vector<InsertResult>{InsertResult::inserted, InsertResult::duplicate,
                                                InsertResult::conflict, InsertResult::inserted,
                                                InsertResult::duplicate}));
  EXPECT_EQ(load("t-1").amount, 100);
  EXPECT_EQ(load("t-2").source, "acct-x");

  std::vector<InsertResult> none;
  SAGA_ASSERT_OK(store_->insert_transfers({}, "w1", 60'000, none));
}

// ---- transitions ---------------------------------------------------------------

TEST_P(StoreTest, TransitionIsFencedByOwnerEpochAndFromState) {
  EXPECT_EQ(insert(spec("t-1"), "w1"), InsertResult::inserted);
  const TransferDoc before = load("t-1");

  EXPECT_FALSE(transition("t-1", S::initial, S::pending, "w2", 1));  // wrong owner
  EXPECT_FALSE(transition("t-1", S::initial, S::pending, "w1", 2));  // wrong epoch
  EXPECT_FALSE(transition("t-1", S::initial, S::pending, "w1", 0));  // stale epoch
  EXPECT_FALSE(transition("t-1", S::pending, S::applied, "w1", 1));  // wrong from-state
  EXPECT_FALSE(transition("t-1", S::canceling, S::canceled, "w1", 1));
  EXPECT_FALSE(transition("t-missing", S::initial, S::pending, "w1", 1));
  expect_same_doc(load("t-1"), before);

  wait_store_clock_past(before.last_modified_ms);
  EXPECT_TRUE(transition("t-1", S::initial, S::pending, "w1", 1, Reason::none, 45'000));
  const TransferDoc d = load("t-1");
  EXPECT_EQ(d.state, S::pending);
  EXPECT_GT(d.last_modified_ms, before.last_modified_ms);
  EXPECT_EQ(d.lease_until_ms, d.last_modified_ms + 45'000);
  EXPECT_EQ(d.owner, "w1");
  EXPECT_EQ(d.epoch, 1);
  EXPECT_EQ(d.attempts, 0);
  EXPECT_EQ(d.finished_at_ms, 0);
  EXPECT_FALSE(d.notified);
  EXPECT_EQ(d.created_at_ms, before.created_at_ms);

  // Taken over: the former owner is a zombie and cannot move it.
  std::optional<TransferDoc> taken;
  SAGA_ASSERT_OK(store_->take_over("t-1", "w2", 60'000, taken));
  ASSERT_TRUE(taken.has_value());
  EXPECT_FALSE(transition("t-1", S::pending, S::applied, "w1", 1));
  EXPECT_FALSE(transition("t-1", S::pending, S::applied, "w2", 1));
  EXPECT_TRUE(transition("t-1", S::pending, S::applied, "w2", 2));
  EXPECT_EQ(load("t-1").state, S::applied);
}

TEST_P(StoreTest, TransitionBatchAppliesItsRecordsInOrder) {
  EXPECT_EQ(insert(spec("t-1")), InsertResult::inserted);
  EXPECT_EQ(insert(spec("t-2")), InsertResult::inserted);
  const std::vector<Transition> batch = {
      {"t-1", S::initial, S::pending, Reason::none, "w1", 1},
      {"t-1", S::pending, S::applied, Reason::none, "w1", 1},  // sees the first
      {"t-2", S::pending, S::applied, Reason::none, "w1", 1},  // wrong from
      {"t-2", S::initial, S::canceling, Reason::insufficient_funds, "w1", 1},
      {"t-2", S::initial, S::pending, Reason::none, "w1", 1},  // no longer initial
      {"t-1", S::applied, S::done, Reason::none, "w1", 1},
  };
  std::vector<std::uint8_t> applied(batch.size(), 7);
  SAGA_ASSERT_OK(store_->transition(batch, 60'000, applied));
  EXPECT_EQ(applied, (std::vector<std::uint8_t>{1, 1, 0, 1, 0, 1}));
  // Finished in such a batch, its outcome is unpublished until marked.
  const TransferDoc t1 = load("t-1");
  EXPECT_EQ(t1.state, S::done);
  EXPECT_GT(t1.finished_at_ms, 0);
  EXPECT_FALSE(t1.notified);
  const std::vector<std::string_view> published = {"t-1"};
  SAGA_ASSERT_OK(store_->mark_notified(published));
  EXPECT_TRUE(load("t-1").notified);
  const TransferDoc t2 = load("t-2");
  EXPECT_EQ(t2.state, S::canceling);
  EXPECT_EQ(t2.reason, Reason::insufficient_funds);

  std::vector<std::uint8_t> none;
  SAGA_ASSERT_OK(store_->transition({}, 60'000, none));
}

TEST_P(StoreTest, TerminalTransitionsSetFinishedAtAndClearNotified) {
  EXPECT_EQ(insert(spec("t-done")), InsertResult::inserted);
  EXPECT_TRUE(transition("t-done", S::initial, S::pending, "w1", 1));
  EXPECT_TRUE(transition("t-done", S::pending, S::applied, "w1", 1));
  EXPECT_EQ(load("t-done").finished_at_ms, 0);
  EXPECT_TRUE(transition("t-done", S::applied, S::done, "w1", 1));
  const TransferDoc done = load("t-done");
  EXPECT_EQ(done.state, S::done);
  EXPECT_GT(done.finished_at_ms, 0);
  EXPECT_EQ(done.finished_at_ms, done.last_modified_ms);
  EXPECT_GE(done.finished_at_ms, done.created_at_ms);
  EXPECT_FALSE(done.notified);
  EXPECT_EQ(done.reason, Reason::none);
  // Terminal is terminal.
  EXPECT_FALSE(transition("t-done", S::applied, S::done, "w1", 1));

  EXPECT_EQ(insert(spec("t-canceled")), InsertResult::inserted);
  EXPECT_TRUE(
      transition("t-canceled", S::initial, S::canceling, "w1", 1, Reason::insufficient_funds));
  EXPECT_TRUE(
      transition("t-canceled", S::canceling, S::canceled, "w1", 1, Reason::insufficient_funds));
  const TransferDoc canceled = load("t-canceled");
  EXPECT_EQ(canceled.state, S::canceled);
  EXPECT_EQ(canceled.reason, Reason::insufficient_funds);
  EXPECT_GT(canceled.finished_at_ms, 0);
  EXPECT_FALSE(canceled.notified);

  // The reason is written as given: the roll-forward clears it.
  EXPECT_EQ(insert(spec("t-roll")), InsertResult::inserted);
  EXPECT_TRUE(transition("t-roll", S::initial, S::canceling, "w1", 1, Reason::account_locked));
  EXPECT_TRUE(transition("t-roll", S::canceling, S::applied, "w1", 1, Reason::none));
  EXPECT_EQ(load("t-roll").reason, Reason::none);
  EXPECT_EQ(load("t-roll").finished_at_ms, 0);
}

TEST_P(StoreTest, MarkNotifiedMarksOnlyTerminalTransfers) {
  EXPECT_EQ(insert(spec("t-done")), InsertResult::inserted);
  EXPECT_TRUE(transition("t-done", S::initial, S::canceling, "w1", 1, Reason::overflow));
  EXPECT_TRUE(transition("t-done", S::canceling, S::canceled, "w1", 1, Reason::overflow));
  EXPECT_EQ(insert(spec("t-open")), InsertResult::inserted);
  const std::vector<std::string_view> ids = {"t-done", "t-open", "t-missing"};
  SAGA_ASSERT_OK(store_->mark_notified(ids));
  EXPECT_TRUE(load("t-done").notified);
  EXPECT_FALSE(load("t-open").notified);
  SAGA_ASSERT_OK(store_->mark_notified(ids));  // idempotent
  EXPECT_TRUE(load("t-done").notified);
  SAGA_ASSERT_OK(store_->mark_notified({}));
}

// ---- recovery ------------------------------------------------------------------

TEST_P(StoreTest, ClaimExpiredTakesExpiredUnfinishedAndUnpublishedWork) {
  // Still leased: not claimable.
  EXPECT_EQ(insert(spec("live"), "w1", 3'600'000), InsertResult::inserted);
  // Expired (lease 0 on the store's clock).
  EXPECT_EQ(insert(spec("expired"), "w1", 0), InsertResult::inserted);
  EXPECT_TRUE(transition("expired", S::initial, S::pending, "w1", 1, Reason::none, 0));
  // Terminal, outcome not yet published: claimable.
  EXPECT_EQ(insert(spec("done-unpublished"), "w1"), InsertResult::inserted);
  EXPECT_TRUE(transition("done-unpublished", S::initial, S::pending, "w1", 1));
  EXPECT_TRUE(transition("done-unpublished", S::pending, S::applied, "w1", 1));
  EXPECT_TRUE(transition("done-unpublished", S::applied, S::done, "w1", 1, Reason::none, 0));
  // Terminal and published: never claimed again.
  EXPECT_EQ(insert(spec("done-published"), "w1"), InsertResult::inserted);
  EXPECT_TRUE(transition("done-published", S::initial, S::canceling, "w1", 1, Reason::invalid));
  EXPECT_TRUE(transition("done-published", S::canceling, S::canceled, "w1", 1, Reason::invalid, 0));
  const std::vector<std::string_view> published = {"done-published"};
  SAGA_ASSERT_OK(store_->mark_notified(published));

  std::int64_t latest_lease = 0;
  for (const char* id : {"expired", "done-unpublished", "done-published"}) {
    latest_lease = std::max(latest_lease, load(id).lease_until_ms);
  }
  std::map<std::string, TransferDoc> before;
  for (const char* id : {"live", "expired", "done-unpublished", "done-published"}) {
    before[id] = load(id);
  }
  wait_store_clock_past(latest_lease);

  std::vector<TransferDoc> claimed;
  const std::int64_t t0 = store_now();
  SAGA_ASSERT_OK(store_->claim_expired("w2", 20'000, 100, claimed));
  const std::int64_t t1 = store_now();
  EXPECT_EQ(sorted(ids_of(claimed)), (std::vector<std::string>{"done-unpublished", "expired"}));
  for (const TransferDoc& d : claimed) {
    const TransferDoc& old = before[d.id];
    EXPECT_EQ(d.owner, "w2");
    EXPECT_EQ(d.epoch, old.epoch + 1);
    EXPECT_EQ(d.attempts, old.attempts + 1);
    EXPECT_EQ(d.state, old.state);
    EXPECT_EQ(d.reason, old.reason);
    EXPECT_EQ(d.notified, old.notified);
    EXPECT_EQ(d.created_at_ms, old.created_at_ms);
    EXPECT_EQ(d.finished_at_ms, old.finished_at_ms);
    EXPECT_GE(d.lease_until_ms, t0 + 20'000);
    EXPECT_LE(d.lease_until_ms, t1 + 20'000);
    expect_same_doc(load(d.id), d);  // the returned document is the stored one
  }
  expect_same_doc(load("live"), before["live"]);
  expect_same_doc(load("done-published"), before["done-published"]);

  // Leases renewed: nothing left to claim.
  SAGA_ASSERT_OK(store_->claim_expired("w3", 20'000, 100, claimed));
  EXPECT_TRUE(claimed.empty());

  // The former owner is fenced off; the new one moves on.
  EXPECT_FALSE(transition("expired", S::pending, S::applied, "w1", 1));
  EXPECT_TRUE(transition("expired", S::pending, S::applied, "w2", 2));
}

TEST_P(StoreTest, ClaimExpiredHonoursTheLimit) {
  std::int64_t latest = 0;
  for (int i = 0; i < 5; ++i) {
    const std::string id = "t-" + std::to_string(i);
    EXPECT_EQ(insert(spec(id), "w1", 0), InsertResult::inserted);
    latest = std::max(latest, load(id).lease_until_ms);
  }
  wait_store_clock_past(latest);
  std::vector<TransferDoc> claimed;
  SAGA_ASSERT_OK(store_->claim_expired("w2", 60'000, 0, claimed));
  EXPECT_TRUE(claimed.empty());
  std::set<std::string> all;
  for (const std::size_t expected : {2U, 2U, 1U, 0U}) {
    SAGA_ASSERT_OK(store_->claim_expired("w2", 60'000, 2, claimed));
    EXPECT_EQ(claimed.size(), expected);
    for (const auto& d : claimed) EXPECT_TRUE(all.insert(d.id).second) << d.id << " claimed twice";
  }
  EXPECT_EQ(all.size(), 5U);
}

TEST_P(StoreTest, ConcurrentClaimersNeverClaimTheSameTransfer) {
  constexpr int kTransfers = 120;
  std::vector<TransferSpec> specs;
  for (int i = 0; i < kTransfers; ++i) specs.push_back(spec("t-" + std::to_string(i)));
  std::vector<NewTransfer> batch;
  for (const auto& s : specs) batch.push_back(s.to_new());
  std::vector<InsertResult> results(batch.size());
  SAGA_ASSERT_OK(store_->insert_transfers(batch, "w0", 0, results));
  wait_store_clock_past(load("t-" + std::to_string(kTransfers - 1)).lease_until_ms);

  constexpr std::size_t kWorkers = 3;
  std::vector<std::unique_ptr<Store>> conns;
  for (std::size_t w = 0; w < kWorkers; ++w) {
    conns.push_back(second_connection());
    ASSERT_NE(conns.back(), nullptr);
  }
  std::vector<std::vector<std::string>> claimed(kWorkers);
  std::vector<Status> errors(kWorkers);
  std::vector<std::thread> threads;
  for (std::size_t w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      const std::string owner = "w" + std::to_string(w + 1);
      for (;;) {
        std::vector<TransferDoc> docs;
        Status s = with_retries([&] { return conns[w]->claim_expired(owner, 60'000, 7, docs); });
        if (!s) {
          errors[w] = s;
          return;
        }
        if (docs.empty()) return;
        for (const auto& d : docs) claimed[w].push_back(d.id);
      }
    });
  }
  for (auto& t : threads) t.join();
  std::set<std::string> all;
  for (std::size_t w = 0; w < kWorkers; ++w) {
    EXPECT_TRUE(errors[w].is_ok()) << errors[w].message();
    for (const auto& id : claimed[w]) EXPECT_TRUE(all.insert(id).second) << id << " claimed twice";
  }
  EXPECT_EQ(all.size(), static_cast<std::size_t>(kTransfers));
  for (int i = 0; i < kTransfers; ++i) EXPECT_EQ(load("t-" + std::to_string(i)).epoch, 2);
}

TEST_P(StoreTest, TakeOverClaimsRegardlessOfTheLease) {
  EXPECT_EQ(insert(spec("t-1"), "w1", 3'600'000), InsertResult::inserted);
  const std::int64_t t0 = store_now();
  std::optional<TransferDoc> d;
  SAGA_ASSERT_OK(store_->take_over("t-1", "sagactl", 5'000, d));
  const std::int64_t t1 = store_now();
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->owner, "sagactl");
  EXPECT_EQ(d->epoch, 2);
  EXPECT_EQ(d->attempts, 1);
  EXPECT_EQ(d->state, S::initial);
  EXPECT_GE(d->lease_until_ms, t0 + 5'000);
  EXPECT_LE(d->lease_until_ms, t1 + 5'000);
  expect_same_doc(load("t-1"), *d);

  SAGA_ASSERT_OK(store_->take_over("t-missing", "sagactl", 5'000, d));
  EXPECT_FALSE(d.has_value());

  // A finished transfer is returned as it is, with the owner that finished
  // it, and left alone (sagactl cancel reports who canceled it).
  EXPECT_EQ(insert(spec("t-2"), "w1", 3'600'000), InsertResult::inserted);
  EXPECT_TRUE(transition("t-2", S::initial, S::canceling, "w1", 1, Reason::insufficient_funds));
  EXPECT_TRUE(transition("t-2", S::canceling, S::canceled, "w1", 1, Reason::insufficient_funds));
  const TransferDoc before = load("t-2");
  SAGA_ASSERT_OK(store_->take_over("t-2", "sagactl", 5'000, d));
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->owner, "w1");
  EXPECT_EQ(d->state, S::canceled);
  expect_same_doc(before, *d);
  expect_same_doc(before, load("t-2"));
}

TEST_P(StoreTest, ListStaleReturnsUnfinishedWorkOldestFirst) {
  EXPECT_EQ(insert(spec("old")), InsertResult::inserted);
  EXPECT_EQ(insert(spec("old-done")), InsertResult::inserted);
  EXPECT_TRUE(transition("old-done", S::initial, S::canceling, "w1", 1, Reason::invalid));
  EXPECT_TRUE(transition("old-done", S::canceling, S::canceled, "w1", 1, Reason::invalid));
  wait_store_clock_past(load("old-done").last_modified_ms);
  EXPECT_EQ(insert(spec("middle")), InsertResult::inserted);
  EXPECT_TRUE(transition("middle", S::initial, S::pending, "w1", 1));
  wait_store_clock_past(load("middle").last_modified_ms);
  const std::int64_t cut = store_now();
  wait_store_clock_past(cut);
  EXPECT_EQ(insert(spec("new")), InsertResult::inserted);

  std::vector<TransferDoc> stale;
  SAGA_ASSERT_OK(store_->list_stale(cut, 10, stale));
  EXPECT_EQ(ids_of(stale), (std::vector<std::string>{"old", "middle"}));
  SAGA_ASSERT_OK(store_->list_stale(cut, 1, stale));
  EXPECT_EQ(ids_of(stale), (std::vector<std::string>{"old"}));
  SAGA_ASSERT_OK(store_->list_stale(store_now() + 1, 10, stale));
  EXPECT_EQ(ids_of(stale), (std::vector<std::string>{"old", "middle", "new"}));
}

TEST_P(StoreTest, StateStatsCountsAgesAndStuckWork) {
  StateStatsTable stats;
  SAGA_ASSERT_OK(store_->state_stats(stats));
  for (const auto& s : stats) {
    EXPECT_EQ(s.count, 0);
    EXPECT_EQ(s.oldest_ms, 0);
    EXPECT_EQ(s.stuck, 0);
  }
  EXPECT_EQ(insert(spec("i-expired"), "w1", 0), InsertResult::inserted);
  EXPECT_EQ(insert(spec("i-live"), "w1", 3'600'000), InsertResult::inserted);
  EXPECT_EQ(insert(spec("p-expired"), "w1"), InsertResult::inserted);
  EXPECT_TRUE(transition("p-expired", S::initial, S::pending, "w1", 1, Reason::none, 0));
  EXPECT_EQ(insert(spec("d-expired"), "w1"), InsertResult::inserted);
  EXPECT_TRUE(transition("d-expired", S::initial, S::pending, "w1", 1));
  EXPECT_TRUE(transition("d-expired", S::pending, S::applied, "w1", 1));
  EXPECT_TRUE(transition("d-expired", S::applied, S::done, "w1", 1, Reason::none, 0));
  std::int64_t latest = 0;
  for (const char* id : {"i-expired", "p-expired", "d-expired"}) {
    latest = std::max(latest, load(id).lease_until_ms);
  }
  wait_store_clock_past(latest);

  SAGA_ASSERT_OK(store_->state_stats(stats));
  const auto& initial = stats[static_cast<std::size_t>(S::initial)];
  EXPECT_EQ(initial.count, 2);
  EXPECT_EQ(initial.stuck, 1);
  EXPECT_EQ(initial.oldest_ms,
            std::min(load("i-expired").created_at_ms, load("i-live").created_at_ms));
  const auto& pending = stats[static_cast<std::size_t>(S::pending)];
  EXPECT_EQ(pending.count, 1);
  EXPECT_EQ(pending.stuck, 1);
  EXPECT_EQ(pending.oldest_ms, load("p-expired").created_at_ms);
  // Terminal transfers count only while their outcome is unpublished (the
  // outbox), aged by finish time: terminal totals come from counters.
  const auto& done = stats[static_cast<std::size_t>(S::done)];
  EXPECT_EQ(done.count, 1);
  EXPECT_EQ(done.stuck, 1);
  EXPECT_EQ(done.oldest_ms, load("d-expired").finished_at_ms);
  auto expect_none = [&](std::initializer_list<S> states) {
    for (S s : states) {
      EXPECT_EQ(stats[static_cast<std::size_t>(s)].count, 0) << to_string(s);
      EXPECT_EQ(stats[static_cast<std::size_t>(s)].oldest_ms, 0) << to_string(s);
      EXPECT_EQ(stats[static_cast<std::size_t>(s)].stuck, 0) << to_string(s);
    }
  };
  expect_none({S::applied, S::canceling, S::canceled});
  const std::vector<std::string_view> published = {"d-expired"};
  SAGA_ASSERT_OK(store_->mark_notified(published));
  SAGA_ASSERT_OK(store_->state_stats(stats));
  expect_none({S::done});
}

TEST_P(StoreTest, ScanTransferStatesVisitsEveryTransfer) {
  EXPECT_EQ(insert(spec("a")), InsertResult::inserted);
  EXPECT_EQ(insert(spec("b")), InsertResult::inserted);
  EXPECT_TRUE(transition("b", S::initial, S::canceling, "w1", 1, Reason::invalid));
  EXPECT_TRUE(transition("b", S::canceling, S::canceled, "w1", 1, Reason::invalid));
  const std::vector<std::string_view> ids = {"b"};
  SAGA_ASSERT_OK(store_->mark_notified(ids));
  std::map<std::string, std::pair<S, bool>> seen;
  SAGA_ASSERT_OK(store_->scan_transfer_states([&](std::string_view id, S s, bool notified) {
    seen[std::string(id)] = {s, notified};
  }));
  EXPECT_EQ(seen.size(), 2U);
  EXPECT_EQ(seen["a"], std::make_pair(S::initial, false));
  EXPECT_EQ(seen["b"], std::make_pair(S::canceled, true));
}

// ---- legs --------------------------------------------------------------------------

TEST_P(StoreTest, DebitPostsOnceWithItsPendingEntry) {
  create(make_account("acct-a", 1000, 0, "EUR"));
  const LegResult r = leg(LegOp::debit, "t-1", "acct-a", 300, "EUR");
  EXPECT_EQ(r.status, LegStatus::posted);
  EXPECT_EQ(r.reason, Reason::none);
  EXPECT_EQ(r.account_currency, "EUR");
  EXPECT_EQ(account("acct-a").balance, 700);
  const auto ps = postings("t-1");
  ASSERT_EQ(ps.size(), 1U);
  EXPECT_EQ(ps[0].account_id, "acct-a");
  EXPECT_EQ(ps[0].kind, PostingKind::debit);
  EXPECT_EQ(ps[0].amount, 300);
  EXPECT_GT(ps[0].at_ms, 0);
  EXPECT_EQ(pending("acct-a"), (std::vector<std::string>{"t-1"}));

  // Again: the journal makes it a no-op.
  const LegResult again = leg(LegOp::debit, "t-1", "acct-a", 300, "EUR");
  EXPECT_EQ(again.status, LegStatus::already_posted);
  EXPECT_EQ(again.account_currency, "EUR");
  EXPECT_EQ(account("acct-a").balance, 700);
  EXPECT_EQ(postings("t-1").size(), 1U);
  expect_balances_match_postings(*store_);
}

TEST_P(StoreTest, CreditPostsOnceWithItsPendingEntry) {
  create(make_account("acct-b", 10, 0, "EUR"));
  const LegResult r = leg(LegOp::credit, "t-1", "acct-b", 300);
  EXPECT_EQ(r.status, LegStatus::posted);
  EXPECT_EQ(r.account_currency, "EUR");
  EXPECT_EQ(account("acct-b").balance, 310);
  const auto ps = postings("t-1");
  ASSERT_EQ(ps.size(), 1U);
  EXPECT_EQ(ps[0].kind, PostingKind::credit);
  EXPECT_EQ(ps[0].amount, 300);
  EXPECT_EQ(pending("acct-b"), (std::vector<std::string>{"t-1"}));

  EXPECT_EQ(leg(LegOp::credit, "t-1", "acct-b", 300).status, LegStatus::already_posted);
  EXPECT_EQ(account("acct-b").balance, 310);
  EXPECT_EQ(postings("t-1").size(), 1U);
  expect_balances_match_postings(*store_);
}

TEST_P(StoreTest, DebitRefusalsNameTheRuleAndWriteNothing) {
  create({make_account("eur", 100, 0, "EUR"), make_account("locked", 100, 0, "EUR", true),
          make_account("any", 100)});

  LegResult r = leg(LegOp::debit, "t-1", "nobody", 10);
  EXPECT_EQ(r.status, LegStatus::refused);
  EXPECT_EQ(r.reason, Reason::unknown_account);
  EXPECT_EQ(r.account_currency, "");

  r = leg(LegOp::debit, "t-2", "locked", 1000, "USD");  // locked wins over the rest
  EXPECT_EQ(r.status, LegStatus::refused);
  EXPECT_EQ(r.reason, Reason::account_locked);
  EXPECT_EQ(r.account_currency, "EUR");

  r = leg(LegOp::debit, "t-3", "eur", 1000, "USD");  // currency before funds
  EXPECT_EQ(r.status, LegStatus::refused);
  EXPECT_EQ(r.reason, Reason::currency_mismatch);
  EXPECT_EQ(r.account_currency, "EUR");

  r = leg(LegOp::debit, "t-4", "eur", 101, "EUR");
  EXPECT_EQ(r.status, LegStatus::refused);
  EXPECT_EQ(r.reason, Reason::insufficient_funds);

  for (const char* t : {"t-1", "t-2", "t-3", "t-4"}) EXPECT_TRUE(postings(t).empty()) << t;
  EXPECT_TRUE(pending("eur").empty());
  EXPECT_TRUE(pending("locked").empty());
  EXPECT_EQ(account("eur").balance, 100);
  EXPECT_EQ(account("locked").balance, 100);

  // A refusal is not a void: the same leg posts once the rule holds.
  bool found = false;
  SAGA_ASSERT_OK(store_->set_locked("locked", false, found));
  EXPECT_TRUE(found);
  EXPECT_EQ(leg(LegOp::debit, "t-2", "locked", 10, "EUR").status, LegStatus::posted);
  // Exactly down to min_balance is allowed.
  EXPECT_EQ(leg(LegOp::debit, "t-4", "eur", 100, "EUR").status, LegStatus::posted);
  EXPECT_EQ(account("eur").balance, 0);
  // No required currency, or an account without one, matches anything.
  EXPECT_EQ(leg(LegOp::debit, "t-5", "any", 10, "USD").status, LegStatus::posted);
  EXPECT_EQ(leg(LegOp::debit, "t-6", "any", 10, "").status, LegStatus::posted);
  EXPECT_EQ(account("any").balance, 80);
  expect_balances_match_postings(*store_);
}

TEST_P(StoreTest, CreditRefusalsNameTheRuleAndWriteNothing) {
  create({make_account("eur", 100, 0, "EUR"), make_account("locked", 100, 0, "", true),
          make_account("full", kMax - 5)});

  LegResult r = leg(LegOp::credit, "t-1", "nobody", 10);
  EXPECT_EQ(r.status, LegStatus::refused);
  EXPECT_EQ(r.reason, Reason::unknown_account);
  r = leg(LegOp::credit, "t-2", "locked", 10);
  EXPECT_EQ(r.status, LegStatus::refused);
  EXPECT_EQ(r.reason, Reason::account_locked);
  r = leg(LegOp::credit, "t-3", "eur", 10, "GBP");
  EXPECT_EQ(r.status, LegStatus::refused);
  EXPECT_EQ(r.reason, Reason::currency_mismatch);
  r = leg(LegOp::credit, "t-4", "full", 6);
  EXPECT_EQ(r.status, LegStatus::refused);
  EXPECT_EQ(r.reason, Reason::overflow);
  r = leg(LegOp::credit, "t-5", "full", kMax);
  EXPECT_EQ(r.status, LegStatus::refused);
  EXPECT_EQ(r.reason, Reason::overflow);
  for (const char* t : {"t-1", "t-2", "t-3", "t-4", "t-5"}) EXPECT_TRUE(postings(t).empty()) << t;
  EXPECT_EQ(account("full").balance, kMax - 5);

  // Up to the largest balance is fine.
  EXPECT_EQ(leg(LegOp::credit, "t-6", "full", 5).status, LegStatus::posted);
  EXPECT_EQ(account("full").balance, kMax);
  EXPECT_EQ(leg(LegOp::credit, "t-7", "eur", 10, "EUR").status, LegStatus::posted);
  EXPECT_EQ(account("eur").balance, 110);
}

TEST_P(StoreTest, NegativeMinBalanceIsACreditLine) {
  create(make_account("acct-a", 50, -100));
  EXPECT_EQ(leg(LegOp::debit, "t-1", "acct-a", 150).status, LegStatus::posted);
  EXPECT_EQ(account("acct-a").balance, -100);
  const LegResult r = leg(LegOp::debit, "t-2", "acct-a", 1);
  EXPECT_EQ(r.status, LegStatus::refused);
  EXPECT_EQ(r.reason, Reason::insufficient_funds);
  EXPECT_EQ(leg(LegOp::credit, "t-3", "acct-a", 30).status, LegStatus::posted);
  EXPECT_EQ(leg(LegOp::debit, "t-2", "acct-a", 30).status, LegStatus::posted);
  EXPECT_EQ(account("acct-a").balance, -100);
  expect_balances_match_postings(*store_);
}

TEST_P(StoreTest, DebitNearTheInt64EdgesNeverOverflows) {
  // balance - amount below INT64_MIN is an underflow: insufficient funds.
  create(make_account("deep", kMin + 5, kMin));
  LegResult r = leg(LegOp::debit, "t-1", "deep", 10);
  EXPECT_EQ(r.status, LegStatus::refused);
  EXPECT_EQ(r.reason, Reason::insufficient_funds);
  EXPECT_EQ(leg(LegOp::debit, "t-2", "deep", 5).status, LegStatus::posted);
  EXPECT_EQ(account("deep").balance, kMin);

  create(make_account("edge", -1, kMin));
  EXPECT_EQ(leg(LegOp::debit, "t-3", "edge", kMax).status, LegStatus::posted);  // -1 - MAX == MIN
  EXPECT_EQ(account("edge").balance, kMin);
  create(make_account("past", -2, kMin));
  r = leg(LegOp::debit, "t-4", "past", kMax);
  EXPECT_EQ(r.status, LegStatus::refused);
  EXPECT_EQ(r.reason, Reason::insufficient_funds);
  EXPECT_EQ(account("past").balance, -2);

  create(make_account("rich", kMax));
  EXPECT_EQ(leg(LegOp::debit, "t-5", "rich", kMax).status, LegStatus::posted);
  EXPECT_EQ(account("rich").balance, 0);
}

TEST_P(StoreTest, CancelDebitReversesAPostedDebitExactlyOnce) {
  create(make_account("acct-a", 1000));
  expect_legs("t-1", "acct-a", 300,
              {{LegOp::debit, LegStatus::posted}, {LegOp::cancel_debit, LegStatus::reversed}});
  EXPECT_EQ(account("acct-a").balance, 1000);
  EXPECT_TRUE(pending("acct-a").empty());
  EXPECT_EQ(posting_keys(postings("t-1")),
            (std::set<PostingKey>{{"t-1", "acct-a", PostingKind::debit, 300},
                                  {"t-1", "acct-a", PostingKind::reverse_debit, 300}}));
  // Again, and a late debit: nothing moves.
  expect_legs("t-1", "acct-a", 300,
              {{LegOp::cancel_debit, LegStatus::reversed}, {LegOp::debit, LegStatus::already_posted}});
  EXPECT_EQ(account("acct-a").balance, 1000);
  EXPECT_EQ(postings("t-1").size(), 2U);
  EXPECT_TRUE(pending("acct-a").empty());
  expect_balances_match_postings(*store_);
}

TEST_P(StoreTest, CancelDebitBeforeTheDebitVoidsItForever) {
  create(make_account("acct-a", 1000));
  // The void, then a zombie's late debit: fenced, however often either comes.
  expect_legs("t-1", "acct-a", 300, {LegOp::cancel_debit, LegOp::debit, LegOp::cancel_debit, LegOp::debit},
              LegStatus::voided);
  EXPECT_EQ(account("acct-a").balance, 1000);
  EXPECT_TRUE(postings("t-1").empty());
  EXPECT_TRUE(pending("acct-a").empty());
  // The void is this transfer's, and this leg's: others still post.
  EXPECT_EQ(leg(LegOp::debit, "t-2", "acct-a", 300).status, LegStatus::posted);
  EXPECT_EQ(leg(LegOp::credit, "t-1", "acct-a", 300).status, LegStatus::posted);
  // An unknown account's leg can be voided too.
  expect_legs("t-3", "ghost", 1, {LegOp::cancel_debit, LegOp::debit}, LegStatus::voided);
  expect_balances_match_postings(*store_);
}

TEST_P(StoreTest, CancelCreditReportsAPostedCreditAndVoidsAMissingOne) {
  create(make_account("acct-b", 0));
  EXPECT_EQ(leg(LegOp::credit, "t-1", "acct-b", 50).status, LegStatus::posted);
  expect_legs("t-1", "acct-b", 50, {LegOp::cancel_credit, LegOp::cancel_credit}, LegStatus::credit_posted);
  EXPECT_EQ(account("acct-b").balance, 50);  // a credit is never reversed
  EXPECT_EQ(postings("t-1").size(), 1U);

  expect_legs("t-2", "acct-b", 50,
              {LegOp::cancel_credit, LegOp::credit, LegOp::cancel_credit, LegOp::credit}, LegStatus::voided);
  EXPECT_TRUE(postings("t-2").empty());
  EXPECT_EQ(account("acct-b").balance, 50);
  EXPECT_EQ(pending("acct-b"), (std::vector<std::string>{"t-1"}));
  // The debit leg of t-2 is not voided by the credit's void.
  create(make_account("acct-a", 100));
  EXPECT_EQ(leg(LegOp::debit, "t-2", "acct-a", 50).status, LegStatus::posted);
  expect_balances_match_postings(*store_);
}

TEST_P(StoreTest, ReleaseDropsOnlyThisTransfersPendingEntry) {
  create({make_account("acct-a", 1000), make_account("acct-b", 0)});
  EXPECT_EQ(leg(LegOp::debit, "t-1", "acct-a", 10).status, LegStatus::posted);
  EXPECT_EQ(leg(LegOp::debit, "t-2", "acct-a", 20).status, LegStatus::posted);
  EXPECT_EQ(leg(LegOp::credit, "t-1", "acct-b", 10).status, LegStatus::posted);
  EXPECT_EQ(pending("acct-a"), (std::vector<std::string>{"t-1", "t-2"}));

  EXPECT_EQ(leg(LegOp::release, "t-1", "acct-a", 10).status, LegStatus::released);
  EXPECT_EQ(pending("acct-a"), (std::vector<std::string>{"t-2"}));
  EXPECT_EQ(pending("acct-b"), (std::vector<std::string>{"t-1"}));
  EXPECT_EQ(leg(LegOp::release, "t-1", "acct-a", 10).status, LegStatus::released);  // again
  EXPECT_EQ(leg(LegOp::release, "t-9", "ghost", 0).status, LegStatus::released);    // nothing there
  EXPECT_EQ(pending("acct-a"), (std::vector<std::string>{"t-2"}));
  // Postings and balances stay.
  EXPECT_EQ(postings("t-1").size(), 2U);
  EXPECT_EQ(account("acct-a").balance, 970);
  // A released leg is still posted: debit again is a no-op.
  EXPECT_EQ(leg(LegOp::debit, "t-1", "acct-a", 10).status, LegStatus::already_posted);
  expect_balances_match_postings(*store_);
}

// ---- the reservation: every posted debit keeps room for its reversal ----------------

TEST_P(StoreTest, ACreditCannotEatTheRoomReservedForAReversal) {
  // A credit landing between a debit and its reversal (two workers, or a
  // crash and a recovery) once made the reversal overflow: a fatal error,
  // and every worker that recovered the transfer stopped the same way.
  create(make_account("rich", kMax - 100));
  EXPECT_EQ(leg(LegOp::debit, "t-1", "rich", 1000).status, LegStatus::posted);
  EXPECT_EQ(account("rich").balance, kMax - 1100);
  EXPECT_EQ(account("rich").reserved, 1000);
  // balance + reserved is kMax - 100: 101 more would eat the reservation.
  LegResult r = leg(LegOp::credit, "t-2", "rich", 101);
  EXPECT_EQ(r.status, LegStatus::refused);
  EXPECT_EQ(r.reason, Reason::overflow);
  EXPECT_TRUE(postings("t-2").empty());
  EXPECT_EQ(pending("rich"), (std::vector<std::string>{"t-1"}));
  EXPECT_EQ(leg(LegOp::credit, "t-3", "rich", 100).status, LegStatus::posted);  // up to the edge
  EXPECT_EQ(account("rich").balance, kMax - 1000);
  EXPECT_EQ(account("rich").reserved, 1000);
  // The reversal fits, and gives the reservation back.
  EXPECT_EQ(leg(LegOp::cancel_debit, "t-1", "rich", 1000).status, LegStatus::reversed);
  EXPECT_EQ(account("rich").balance, kMax);
  EXPECT_EQ(account("rich").reserved, 0);
  EXPECT_EQ(pending("rich"), (std::vector<std::string>{"t-3"}));
  EXPECT_EQ(leg(LegOp::cancel_debit, "t-1", "rich", 1000).status, LegStatus::reversed);  // again
  EXPECT_EQ(account("rich").balance, kMax);
  EXPECT_EQ(account("rich").reserved, 0);
  expect_balances_match_postings(*store_);
}

TEST_P(StoreTest, AReleaseGivesBackItsDebitsReservationOnce) {
  create({make_account("acct-a", 1000), make_account("acct-b", 0)});
  EXPECT_EQ(leg(LegOp::debit, "t-1", "acct-a", 300).status, LegStatus::posted);
  EXPECT_EQ(leg(LegOp::debit, "t-2", "acct-a", 200).status, LegStatus::posted);
  EXPECT_EQ(account("acct-a").reserved, 500);
  EXPECT_EQ(leg(LegOp::credit, "t-1", "acct-b", 300).status, LegStatus::posted);
  EXPECT_EQ(account("acct-b").reserved, 0);  // a credit reserves nothing
  EXPECT_EQ(leg(LegOp::release, "t-1", "acct-b", 300).status, LegStatus::released);
  EXPECT_EQ(account("acct-b").reserved, 0);
  EXPECT_EQ(leg(LegOp::release, "t-1", "acct-a", 300).status, LegStatus::released);
  EXPECT_EQ(account("acct-a").reserved, 200);
  // Again, and a release of nothing: the reservation is given back once.
  EXPECT_EQ(leg(LegOp::release, "t-1", "acct-a", 300).status, LegStatus::released);
  EXPECT_EQ(leg(LegOp::release, "t-9", "acct-a", 50).status, LegStatus::released);
  EXPECT_EQ(account("acct-a").reserved, 200);
  EXPECT_EQ(leg(LegOp::cancel_debit, "t-2", "acct-a", 200).status, LegStatus::reversed);
  EXPECT_EQ(account("acct-a").reserved, 0);
  EXPECT_EQ(account("acct-a").balance, 700);
  expect_balances_match_postings(*store_);
}

TEST_P(StoreTest, ADebitWhoseReservationWouldOverflowIsRefused) {
  create(make_account("deep", 0, kMin));
  EXPECT_EQ(leg(LegOp::debit, "t-1", "deep", kMax).status, LegStatus::posted);
  EXPECT_EQ(account("deep").reserved, kMax);
  // Funds allow it (-MAX - 1 == MIN), the reservation does not.
  const LegResult r = leg(LegOp::debit, "t-2", "deep", 1);
  EXPECT_EQ(r.status, LegStatus::refused);
  EXPECT_EQ(r.reason, Reason::overflow);
  EXPECT_EQ(account("deep").balance, -kMax);
  EXPECT_EQ(leg(LegOp::cancel_debit, "t-1", "deep", kMax).status, LegStatus::reversed);
  EXPECT_EQ(leg(LegOp::debit, "t-2", "deep", 1).status, LegStatus::posted);
  EXPECT_EQ(account("deep").balance, -1);
  EXPECT_EQ(account("deep").reserved, 1);
  expect_balances_match_postings(*store_);
}

TEST_P(StoreTest, ReservationsFollowALegBatchInOrder) {
  create(make_account("rich", kMax - 1000));
  const std::vector<LegRequest> batch = {
      {LegOp::debit, "t-1", "rich", 500, ""},     // posted: reserved 500, sum kMax - 1000
      {LegOp::credit, "t-2", "rich", 1001, ""},   // refused: sum would pass kMax
      {LegOp::release, "t-1", "rich", 500, ""},   // released: sum kMax - 1500
      {LegOp::credit, "t-2", "rich", 1001, ""},   // posted: sum kMax - 499
      {LegOp::debit, "t-3", "rich", 499, ""},     // posted: sum unchanged
      {LegOp::credit, "t-4", "rich", 500, ""},    // refused
      {LegOp::cancel_debit, "t-3", "rich", 499, ""},  // reversed: sum unchanged
      {LegOp::credit, "t-4", "rich", 499, ""},    // posted: sum kMax
  };
  std::vector<LegResult> results(batch.size());
  SAGA_ASSERT_OK(store_->apply_legs(batch, results));
  const std::vector<LegStatus> expected = {
      LegStatus::posted, LegStatus::refused, LegStatus::released, LegStatus::posted,
      LegStatus::posted, LegStatus::refused, LegStatus::reversed, LegStatus::posted};
  for (std::size_t i = 0; i < batch.size(); ++i) {
    EXPECT_EQ(results[i].status, expected[i]) << "record " << i;
  }
  EXPECT_EQ(results[1].reason, Reason::overflow);
  EXPECT_EQ(results[5].reason, Reason::overflow);
  EXPECT_EQ(account("rich").balance, kMax);
  EXPECT_EQ(account("rich").reserved, 0);
  expect_balances_match_postings(*store_);
}

TEST_P(StoreTest, LegBatchAppliesItsRecordsInOrder) {
  create({make_account("acct-a", 100), make_account("acct-b", 0)});
  const std::vector<LegRequest> batch = {
      {LegOp::debit, "t-1", "acct-a", 60, ""},          // posted: 40 left
      {LegOp::debit, "t-2", "acct-a", 60, ""},          // refused: 40 < 60
      {LegOp::credit, "t-3", "acct-a", 50, ""},         // posted: 90
      {LegOp::debit, "t-2", "acct-a", 60, ""},          // posted now: 30
      {LegOp::credit, "t-1", "acct-b", 60, ""},         // posted
      {LegOp::cancel_debit, "t-2", "acct-a", 60, ""},   // reversed: 90
      {LegOp::debit, "t-2", "acct-a", 60, ""},          // already posted
      {LegOp::cancel_debit, "t-4", "acct-a", 5, ""},    // voided
      {LegOp::debit, "t-4", "acct-a", 5, ""},           // voided
      {LegOp::release, "t-1", "acct-a", 60, ""},        // released
      {LegOp::cancel_credit, "t-1", "acct-b", 60, ""},  // credit posted
      {LegOp::debit, "t-1", "acct-a", 60, ""},          // already posted
  };
  std::vector<LegResult> results(batch.size());
  SAGA_ASSERT_OK(store_->apply_legs(batch, results));
  const std::vector<LegStatus> expected = {
      LegStatus::posted, LegStatus::refused,  LegStatus::posted,         LegStatus::posted,
      LegStatus::posted, LegStatus::reversed, LegStatus::already_posted, LegStatus::voided,
      LegStatus::voided, LegStatus::released, LegStatus::credit_posted,  LegStatus::already_posted};
  for (std::size_t i = 0; i < batch.size(); ++i) {
    EXPECT_EQ(results[i].status, expected[i]) << "record " << i;
  }
  EXPECT_EQ(results[1].reason, Reason::insufficient_funds);
  EXPECT_EQ(account("acct-a").balance, 90);
  EXPECT_EQ(account("acct-b").balance, 60);
  EXPECT_EQ(pending("acct-a"), (std::vector<std::string>{"t-3"}));
  EXPECT_EQ(pending("acct-b"), (std::vector<std::string>{"t-1"}));

  std::vector<LegResult> none;
  SAGA_ASSERT_OK(store_->apply_legs({}, none));
  expect_balances_match_postings(*store_);
}

// Seeded random batches of legs on five hot accounts (one locked, one with a
// credit line, currencies mixed) plus an unknown one: applying each batch in
// one call gives the same results and ledger as applying its legs one by one
// on a second store.
TEST_P(StoreTest, HotAccountBatchesMatchOneByOne) {
  const std::vector<Account> accounts = {
      make_account("h0", 1000),
      make_account("h1", 500, -300, "EUR"),
      make_account("h2", 0, 0, "USD"),
      make_account("h3", 1'000'000),
      make_account("h4", 200, 0, "", true),
  };
  const std::vector<std::string> account_ids = {"h0", "h1", "h2", "h3", "h4", "ghost"};
  const std::vector<std::string> currencies = {"", "EUR", "USD"};
  auto one_by_one = fresh_store();
  ASSERT_NE(one_by_one, nullptr);
  SAGA_ASSERT_OK(store_->create_accounts(accounts));
  SAGA_ASSERT_OK(one_by_one->create_accounts(accounts));

  for (const std::uint32_t seed : {1U, 7U, 20240611U}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    std::vector<std::string> transfer_ids;
    for (int i = 0; i < 40; ++i)
      transfer_ids.push_back("s" + std::to_string(seed) + "-" + std::to_string(i));
    for (int b = 0; b < 25; ++b) {
      const std::size_t size = 1 + rng() % 40;
      std::vector<LegRequest> batch;
      for (std::size_t i = 0; i < size; ++i) {
        const LegOp op = leg_op_for_roll(rng() % 100);
        const std::size_t t = rng() % transfer_ids.size();
        batch.push_back({op, transfer_ids[t], account_ids[rng() % account_ids.size()],
                         static_cast<std::int64_t>(1 + (t * 37) % 400),
                         currencies[rng() % currencies.size()]});
      }
      std::vector<LegResult> batched(batch.size());
      SAGA_ASSERT_OK(store_->apply_legs(batch, batched));
      for (std::size_t i = 0; i < batch.size(); ++i) {
        LegResult single;
        SAGA_ASSERT_OK(one_by_one->apply_legs(std::span(&batch[i], 1), std::span(&single, 1)));
        EXPECT_EQ(batched[i].status, single.status) << "batch " << b << " record " << i;
        EXPECT_EQ(batched[i].reason, single.reason) << "batch " << b << " record " << i;
        EXPECT_EQ(batched[i].account_currency, single.account_currency)
            << "batch " << b << " record " << i;
      }
    }
  }
  std::map<std::string, Account> a1, a2;
  SAGA_ASSERT_OK(store_->scan_accounts([&](const Account& a) { a1[a.id] = a; }));
  SAGA_ASSERT_OK(one_by_one->scan_accounts([&](const Account& a) { a2[a.id] = a; }));
  ASSERT_EQ(a1.size(), a2.size());
  for (const auto& [id, a] : a1) {
    EXPECT_EQ(a.balance, a2[id].balance) << id;
    EXPECT_EQ(a.reserved, a2[id].reserved) << id;
  }
  std::vector<Posting> p1, p2;
  SAGA_ASSERT_OK(store_->scan_postings([&](const Posting& p) { p1.push_back(p); }));
  SAGA_ASSERT_OK(one_by_one->scan_postings([&](const Posting& p) { p2.push_back(p); }));
  EXPECT_EQ(posting_keys(p1), posting_keys(p2));
  EXPECT_GT(p1.size(), 50U) << "the random mix should post plenty";
  std::set<std::pair<std::string, std::string>> e1, e2;
  SAGA_ASSERT_OK(store_->scan_pending(
      [&](const PendingEntry& e) { e1.emplace(e.account_id, e.transfer_id); }));
  SAGA_ASSERT_OK(one_by_one->scan_pending(
      [&](const PendingEntry& e) { e2.emplace(e.account_id, e.transfer_id); }));
  EXPECT_EQ(e1, e2);
  expect_balances_match_postings(*store_, false);
  expect_balances_match_postings(*one_by_one, false);
}

TEST_P(StoreTest, ConcurrentLegsOnHotAccountsConserveMoney) {
  constexpr int kAccounts = 4;
  constexpr std::int64_t kOpening = 10'000;
  std::vector<Account> accounts;
  for (int i = 0; i < kAccounts; ++i)
    accounts.push_back(make_account("c" + std::to_string(i), kOpening));
  SAGA_ASSERT_OK(store_->create_accounts(accounts));

  constexpr std::size_t kWorkers = 3;
  std::vector<std::unique_ptr<Store>> conns;
  for (std::size_t w = 0; w < kWorkers; ++w) {
    conns.push_back(second_connection());
    ASSERT_NE(conns.back(), nullptr);
  }
  std::vector<Status> errors(kWorkers);
  std::vector<std::thread> threads;
  for (std::size_t w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      std::mt19937 rng(static_cast<std::uint32_t>(w + 1));
      for (int b = 0; b < 15; ++b) {
        // Debits first (each worker its own transfer ids), then the credits
        // of those that posted, cancel_debit for the refused ones' peers.
        std::vector<LegRequest> debits;
        std::vector<std::string> ids;
        std::vector<std::pair<std::string, std::string>> legs;  // (from, to)
        for (int i = 0; i < 8; ++i) {
          ids.push_back("w" + std::to_string(w) + "-" + std::to_string(b) + "-" +
                        std::to_string(i));
          const int from = static_cast<int>(rng() % kAccounts);
          const int to = (from + 1 + static_cast<int>(rng() % (kAccounts - 1))) % kAccounts;
          legs.emplace_back("c" + std::to_string(from), "c" + std::to_string(to));
        }
        for (int i = 0; i < 8; ++i) {
          debits.push_back({LegOp::debit, ids[static_cast<std::size_t>(i)],
                            legs[static_cast<std::size_t>(i)].first,
                            static_cast<std::int64_t>(1 + rng() % 3000), ""});
        }
        std::vector<LegResult> r(debits.size());
        Status s = with_retries([&] { return conns[w]->apply_legs(debits, r); });
        if (!s) {
          errors[w] = s;
          return;
        }
        std::vector<LegRequest> seconds;
        for (std::size_t i = 0; i < debits.size(); ++i) {
          if (r[i].status == LegStatus::posted) {
            seconds.push_back(
                {LegOp::credit, debits[i].transfer_id, legs[i].second, debits[i].amount, ""});
          } else {
            seconds.push_back({LegOp::cancel_debit, debits[i].transfer_id, debits[i].account_id,
                               debits[i].amount, ""});
          }
        }
        std::vector<LegResult> r2(seconds.size());
        s = with_retries([&] { return conns[w]->apply_legs(seconds, r2); });
        if (!s) {
          errors[w] = s;
          return;
        }
        for (std::size_t i = 0; i < seconds.size(); ++i) {
          const LegStatus want =
              seconds[i].op == LegOp::credit ? LegStatus::posted : LegStatus::voided;
          if (r2[i].status != want) {
            errors[w] =
                Status::fatal("unexpected leg status for " + std::string(seconds[i].transfer_id));
            return;
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const Status& e : errors) EXPECT_TRUE(e.is_ok()) << e.message();
  std::int64_t total = 0;
  SAGA_ASSERT_OK(store_->scan_accounts([&](const Account& a) { total += a.balance; }));
  EXPECT_EQ(total, kAccounts * kOpening);
  expect_balances_match_postings(*store_);
}

// ---- accounts and views ----------------------------------------------------------

TEST_P(StoreTest, CreateAccountsStoresEveryField) {
  Account a = make_account("acct-a", 100, -50, "EUR", true);
  a.opening_balance = 7;  // ignored: a new account opens at its balance
  const std::vector<Account> batch = {a, make_account("acct-b", 0)};
  SAGA_ASSERT_OK(store_->create_accounts(batch));
  const Account got = account("acct-a");
  EXPECT_EQ(got.id, "acct-a");
  EXPECT_EQ(got.balance, 100);
  EXPECT_EQ(got.opening_balance, 100);
  EXPECT_EQ(got.min_balance, -50);
  EXPECT_EQ(got.currency, "EUR");
  EXPECT_TRUE(got.locked);
  const Account b = account("acct-b");
  EXPECT_EQ(b.currency, "");
  EXPECT_FALSE(b.locked);
  std::optional<Account> missing;
  SAGA_ASSERT_OK(store_->load_account("nobody", missing));
  EXPECT_FALSE(missing.has_value());
  SAGA_ASSERT_OK(store_->create_accounts({}));
}

TEST_P(StoreTest, CreateAccountsIsAllOrNothing) {
  create(make_account("taken", 5));
  const std::vector<Account> clash = {make_account("new-1", 1), make_account("taken", 2),
                                      make_account("new-2", 3)};
  Status s = store_->create_accounts(clash);
  EXPECT_EQ(s.kind(), ErrorKind::fatal);
  EXPECT_NE(s.message().find("taken"), std::string::npos) << s.message();
  const std::vector<Account> twice = {make_account("new-3", 1), make_account("new-3", 2)};
  s = store_->create_accounts(twice);
  EXPECT_EQ(s.kind(), ErrorKind::fatal);
  EXPECT_NE(s.message().find("new-3"), std::string::npos) << s.message();
  for (const char* id : {"new-1", "new-2", "new-3"}) {
    std::optional<Account> a;
    SAGA_ASSERT_OK(store_->load_account(id, a));
    EXPECT_FALSE(a.has_value()) << id;
  }
  EXPECT_EQ(account("taken").balance, 5);
  // The store is still usable after the failed call.
  create(make_account("new-1", 1));
  EXPECT_EQ(account("new-1").balance, 1);
}

TEST_P(StoreTest, LoadAccountsReadsManyInInputOrder) {
  create({make_account("acct-a", 100, -5, "EUR"), make_account("acct-b", 7, 0, "", true)});
  const std::vector<std::string_view> ids = {"acct-b", "ghost", "acct-a", "acct-b"};
  std::vector<std::optional<Account>> out(ids.size(), make_account("stale", 1));
  SAGA_ASSERT_OK(store_->load_accounts(ids, out));
  ASSERT_TRUE(out[0].has_value());
  EXPECT_EQ(out[0]->id, "acct-b");
  EXPECT_EQ(out[0]->balance, 7);
  EXPECT_TRUE(out[0]->locked);
  EXPECT_FALSE(out[1].has_value());
  ASSERT_TRUE(out[2].has_value());
  EXPECT_EQ(out[2]->id, "acct-a");
  EXPECT_EQ(out[2]->balance, 100);
  EXPECT_EQ(out[2]->opening_balance, 100);
  EXPECT_EQ(out[2]->min_balance, -5);
  EXPECT_EQ(out[2]->currency, "EUR");
  ASSERT_TRUE(out[3].has_value());
  EXPECT_EQ(out[3]->id, "acct-b");
  // It reads what legs wrote.
  EXPECT_EQ(leg(LegOp::debit, "t-1", "acct-a", 30).status, LegStatus::posted);
  SAGA_ASSERT_OK(store_->load_accounts(ids, out));
  ASSERT_TRUE(out[2].has_value());
  EXPECT_EQ(out[2]->balance, 70);
  std::vector<std::optional<Account>> none;
  SAGA_ASSERT_OK(store_->load_accounts({}, none));
}

TEST_P(StoreTest, SetLockedTogglesAndReportsMissingAccounts) {
  create(make_account("acct-a", 100));
  bool found = false;
  SAGA_ASSERT_OK(store_->set_locked("acct-a", true, found));
  EXPECT_TRUE(found);
  EXPECT_TRUE(account("acct-a").locked);
  EXPECT_EQ(leg(LegOp::debit, "t-1", "acct-a", 1).reason, Reason::account_locked);
  SAGA_ASSERT_OK(store_->set_locked("acct-a", true, found));  // already locked
  EXPECT_TRUE(found);
  SAGA_ASSERT_OK(store_->set_locked("acct-a", false, found));
  EXPECT_TRUE(found);
  EXPECT_FALSE(account("acct-a").locked);
  EXPECT_EQ(leg(LegOp::debit, "t-1", "acct-a", 1).status, LegStatus::posted);
  SAGA_ASSERT_OK(store_->set_locked("nobody", true, found));
  EXPECT_FALSE(found);
}

TEST_P(StoreTest, PostingPendingAndScanViewsAgree) {
  create({make_account("acct-a", 1000), make_account("acct-b", 0)});
  EXPECT_EQ(leg(LegOp::debit, "t-1", "acct-a", 10).status, LegStatus::posted);
  EXPECT_EQ(leg(LegOp::credit, "t-1", "acct-b", 10).status, LegStatus::posted);
  EXPECT_EQ(leg(LegOp::debit, "t-2", "acct-a", 20).status, LegStatus::posted);
  EXPECT_EQ(leg(LegOp::cancel_debit, "t-2", "acct-a", 20).status, LegStatus::reversed);
  EXPECT_EQ(leg(LegOp::debit, "t-3", "acct-a", 30).status, LegStatus::posted);

  EXPECT_EQ(posting_keys(postings("t-1")),
            (std::set<PostingKey>{{"t-1", "acct-a", PostingKind::debit, 10},
                                  {"t-1", "acct-b", PostingKind::credit, 10}}));
  EXPECT_TRUE(postings("t-missing").empty());

  std::vector<Posting> recent;
  SAGA_ASSERT_OK(store_->postings_for_account("acct-a", 10, recent));
  EXPECT_EQ(posting_keys(recent),
            (std::set<PostingKey>{{"t-1", "acct-a", PostingKind::debit, 10},
                                  {"t-2", "acct-a", PostingKind::debit, 20},
                                  {"t-2", "acct-a", PostingKind::reverse_debit, 20},
                                  {"t-3", "acct-a", PostingKind::debit, 30}}));
  for (std::size_t i = 1; i < recent.size(); ++i) {
    EXPECT_GE(recent[i - 1].at_ms, recent[i].at_ms) << "newest first";
  }
  SAGA_ASSERT_OK(store_->postings_for_account("acct-a", 2, recent));
  EXPECT_EQ(recent.size(), 2U);
  SAGA_ASSERT_OK(store_->postings_for_account("nobody", 10, recent));
  EXPECT_TRUE(recent.empty());

  EXPECT_EQ(pending("acct-a"), (std::vector<std::string>{"t-1", "t-3"}));
  EXPECT_EQ(pending("acct-b"), (std::vector<std::string>{"t-1"}));
  EXPECT_TRUE(pending("nobody").empty());

  std::set<std::pair<std::string, std::string>> entries;
  SAGA_ASSERT_OK(store_->scan_pending(
      [&](const PendingEntry& e) { entries.emplace(e.account_id, e.transfer_id); }));
  EXPECT_EQ(entries, (std::set<std::pair<std::string, std::string>>{
                         {"acct-a", "t-1"}, {"acct-a", "t-3"}, {"acct-b", "t-1"}}));
  std::vector<Posting> all;
  SAGA_ASSERT_OK(store_->scan_postings([&](const Posting& p) { all.push_back(p); }));
  EXPECT_EQ(all.size(), 5U);
  std::map<std::string, std::int64_t> balances;
  SAGA_ASSERT_OK(store_->scan_accounts([&](const Account& a) { balances[a.id] = a.balance; }));
  EXPECT_EQ(balances, (std::map<std::string, std::int64_t>{{"acct-a", 960}, {"acct-b", 10}}));
  expect_balances_match_postings(*store_);
}

// A whole saga, both ways, through the store alone: the ledger ends balanced
// and every invariant of DESIGN.md that the store can see holds.
TEST_P(StoreTest, SagasEndWithTheLedgerBalanced) {
  create({make_account("src", 500), make_account("dst", 0), make_account("shut", 0, 0, "", true)});
  const TransferSpec ok = spec("ok", "src", "dst", 200);
  const TransferSpec refused = spec("refused", "src", "shut", 100);
  EXPECT_EQ(insert(ok), InsertResult::inserted);
  EXPECT_EQ(insert(refused), InsertResult::inserted);
  for (const char* id : {"ok", "refused"}) {
    EXPECT_TRUE(transition(id, S::initial, S::pending, "w1", 1));
  }
  EXPECT_EQ(leg(LegOp::debit, "ok", "src", 200).status, LegStatus::posted);
  EXPECT_EQ(leg(LegOp::credit, "ok", "dst", 200).status, LegStatus::posted);
  EXPECT_TRUE(transition("ok", S::pending, S::applied, "w1", 1));
  EXPECT_EQ(leg(LegOp::release, "ok", "src", 200).status, LegStatus::released);
  EXPECT_EQ(leg(LegOp::release, "ok", "dst", 200).status, LegStatus::released);
  EXPECT_TRUE(transition("ok", S::applied, S::done, "w1", 1));

  EXPECT_EQ(leg(LegOp::debit, "refused", "src", 100).status, LegStatus::posted);
  EXPECT_EQ(leg(LegOp::credit, "refused", "shut", 100).reason, Reason::account_locked);
  EXPECT_TRUE(transition("refused", S::pending, S::canceling, "w1", 1, Reason::account_locked));
  EXPECT_EQ(leg(LegOp::cancel_credit, "refused", "shut", 100).status, LegStatus::voided);
  EXPECT_EQ(leg(LegOp::cancel_debit, "refused", "src", 100).status, LegStatus::reversed);
  EXPECT_EQ(leg(LegOp::release, "refused", "shut", 100).status, LegStatus::released);
  EXPECT_TRUE(transition("refused", S::canceling, S::canceled, "w1", 1, Reason::account_locked));

  EXPECT_EQ(account("src").balance, 300);
  EXPECT_EQ(account("dst").balance, 200);
  EXPECT_EQ(account("shut").balance, 0);
  std::size_t pending_entries = 0;
  SAGA_ASSERT_OK(store_->scan_pending([&](const PendingEntry&) { ++pending_entries; }));
  EXPECT_EQ(pending_entries, 0U) << "no pending entry names a terminal transfer";
  EXPECT_EQ(posting_keys(postings("refused")),
            (std::set<PostingKey>{{"refused", "src", PostingKind::debit, 100},
                                  {"refused", "src", PostingKind::reverse_debit, 100}}));
  expect_balances_match_postings(*store_);
}

}  // namespace
}  // namespace sagapool::test
