// The conformance suite on the embedded default: no server, label `unit`.
// Also what only this backend has: upgrading a file made by an older schema.
#include <sqlite3.h>

#include <chrono>
#include <thread>

#include "store_test.hpp"

namespace sagapool::test {
INSTANTIATE_TEST_SUITE_P(sqlite, StoreTest, testing::Values(std::string("sqlite")),
                         [](const testing::TestParamInfo<std::string>& p) { return p.param; });

namespace {

void exec(sqlite3* db, const char* sql) {
  char* err = nullptr;
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, &err);
  EXPECT_EQ(rc, SQLITE_OK) << (err ? err : "") << " in: " << sql;
  sqlite3_free(err);
}

// A store file at this build's version, one shard of ledger-1; closed.
std::string current_file(const TempDir& dir) {
  const std::string path = (dir.path() / "store.db").string();
  std::unique_ptr<Store> store;
  EXPECT_TRUE(open_store("sqlite:" + path, store).is_ok());
  EXPECT_TRUE(store->init_schema().is_ok());
  EXPECT_TRUE(store->write_topology({"ledger-1", 0, 1, kSchemaVersion, kSchemaVersion}).is_ok());
  return path;
}

void exec(const std::string& path, const char* sql) {
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
  exec(raw, sql);
  sqlite3_close(raw);
}

bool has_account_index(const std::string& path) {
  sqlite3* raw = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(raw, "SELECT 1 FROM sqlite_master WHERE name = 'postings_account'", -1,
                               &st, nullptr),
            SQLITE_OK);
  const bool found = sqlite3_step(st) == SQLITE_ROW;
  sqlite3_finalize(st);
  sqlite3_close(raw);
  return found;
}

// transfer/kind of the account's latest postings, newest first.
std::vector<std::string> recent(Store& store, std::string_view account, std::size_t limit = 100) {
  std::vector<Posting> postings;
  EXPECT_TRUE(store.postings_for_account(account, limit, postings).is_ok());
  std::vector<std::string> out;
  for (const Posting& p : postings) out.push_back(p.transfer_id + "/" + std::string(to_string(p.kind)));
  return out;
}

// Legs applied in one scope (one transaction, as the engine runs a batch).
void apply_in_scope(Store& store, std::vector<LegRequest> legs, bool commit = true) {
  std::vector<LegResult> results(legs.size());
  ASSERT_TRUE(store.begin_scope().is_ok());
  ASSERT_TRUE(store.apply_legs(legs, results).is_ok());
  for (const LegResult& r : results) {
    EXPECT_TRUE(r.status == LegStatus::posted || r.status == LegStatus::reversed);
  }
  ASSERT_TRUE(store.end_scope(commit).is_ok());
}

// The first column of the first row of `sql` on the file, as text ("" for
// none or NULL).
std::string value(const std::string& path, const std::string& sql) {
  sqlite3* raw = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(raw, sql.c_str(), -1, &st, nullptr), SQLITE_OK) << sqlite3_errmsg(raw);
  std::string out;
  if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0) != nullptr) {
    out = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
  }
  sqlite3_finalize(st);
  sqlite3_close(raw);
  return out;
}

// ids finished in one scope, as a worker's batch finishes them; `canceled`
// among them canceled.
void finish_in_scope(Store& store, std::vector<std::string> ids, std::int64_t lease_ms,
                     std::int64_t* at_ms = nullptr, const std::string& canceled = "") {
  SAGA_ASSERT_OK(store.begin_scope());
  std::vector<Transition> finish;
  for (const std::string& id : ids) {
    InsertResult inserted{};
    SAGA_ASSERT_OK(insert_one(store, spec(id), "w1", lease_ms, inserted));
    ASSERT_EQ(inserted, InsertResult::inserted);
    finish.push_back({id, TransferState::initial,
                      id == canceled ? TransferState::canceled : TransferState::done,
                      id == canceled ? Reason::insufficient_funds : Reason::none, "w1", 1});
  }
  std::vector<std::uint8_t> applied(finish.size());
  SAGA_ASSERT_OK(store.transition(finish, lease_ms, applied, at_ms));
  SAGA_ASSERT_OK(store.end_scope(true));
}

}  // namespace

// Schema version 1 had no reservation: `sagactl init` adds it, filled from
// the pending debits that may still be reversed, and a second init changes
// nothing.
TEST(SqliteStore, InitUpgradesAVersionOneFileWithItsReservations) {
  TempDir dir("sagapool-upgrade");
  const std::string path = (dir.path() / "store.db").string();
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
  exec(raw, R"(
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
    INSERT INTO meta VALUES ('schema_version', '1');
    CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL,
      opening_balance INTEGER NOT NULL, min_balance INTEGER NOT NULL, currency TEXT NOT NULL,
      locked INTEGER NOT NULL) WITHOUT ROWID;
    CREATE TABLE postings (transfer_id TEXT NOT NULL, account_id TEXT NOT NULL, kind TEXT NOT NULL,
      amount INTEGER NOT NULL, at INTEGER NOT NULL,
      PRIMARY KEY (transfer_id, account_id, kind)) WITHOUT ROWID;
    CREATE TABLE pending (account_id TEXT NOT NULL, transfer_id TEXT NOT NULL,
      PRIMARY KEY (account_id, transfer_id)) WITHOUT ROWID;
    INSERT INTO accounts VALUES ('a', 450, 1000, 0, '', 0), ('b', 350, 0, 0, '', 0);
    -- t-1 debited and credited (both entries pending), t-2 debited, t-3
    -- debited and reversed (no entry), t-4 done (entries released).
    INSERT INTO postings VALUES ('t-1', 'a', 'debit', 300, 1), ('t-1', 'b', 'credit', 300, 2),
      ('t-2', 'a', 'debit', 200, 3), ('t-3', 'a', 'debit', 50, 4),
      ('t-3', 'a', 'reverse_debit', 50, 5), ('t-4', 'a', 'debit', 50, 6),
      ('t-4', 'b', 'credit', 50, 7);
    INSERT INTO pending VALUES ('a', 't-1'), ('b', 't-1'), ('a', 't-2');
  )");
  sqlite3_close(raw);

  std::unique_ptr<Store> store;
  SAGA_ASSERT_OK(open_store("sqlite:" + path, store));
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("init #" + std::to_string(round + 1));
    SAGA_ASSERT_OK(store->init_schema());
    std::optional<Account> a, b;
    SAGA_ASSERT_OK(store->load_account("a", a));
    SAGA_ASSERT_OK(store->load_account("b", b));
    ASSERT_TRUE(a && b);
    EXPECT_EQ(a->reserved, 500);
    EXPECT_EQ(a->balance, 450);
    EXPECT_EQ(b->reserved, 0);
  }
  // The upgraded rows follow the rules: a release gives back t-1's debit.
  const LegRequest release{LegOp::release, "t-1", "a", 300, ""};
  LegResult r;
  SAGA_ASSERT_OK(store->apply_legs(std::span(&release, 1), std::span(&r, 1)));
  EXPECT_EQ(r.status, LegStatus::released);
  std::optional<Account> a;
  SAGA_ASSERT_OK(store->load_account("a", a));
  ASSERT_TRUE(a);
  EXPECT_EQ(a->reserved, 200);
}

// A file as version 2 left it (no workers table, no schema_expanded): init
// expands it and keeps the version version-2 builds require; the contract
// raises it.
TEST(SqliteStore, InitExpandsAVersionTwoFileAndContractRaisesItsFloor) {
  TempDir dir("sagapool-expand");
  const std::string path = current_file(dir);
  std::unique_ptr<Store> store;
  exec(path, "DROP TABLE workers; UPDATE meta SET value = '2' WHERE key = 'schema_version'; "
             "DELETE FROM meta WHERE key = 'schema_expanded';");

  SAGA_ASSERT_OK(open_store("sqlite:" + path, store));
  std::optional<Topology> t;
  SAGA_ASSERT_OK(store->read_topology(t));
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->schema_expanded, 2);
  EXPECT_FALSE(schema_runs(*t, kSchemaVersion));
  EXPECT_EQ(store->contract_schema().kind(), ErrorKind::fatal);  // init first
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("init #" + std::to_string(round + 1));
    SAGA_ASSERT_OK(store->init_schema());
    SAGA_ASSERT_OK(store->read_topology(t));
    ASSERT_TRUE(t.has_value());
    EXPECT_EQ(t->schema_version, 2);
    EXPECT_EQ(t->schema_expanded, kSchemaVersion);
    EXPECT_TRUE(schema_runs(*t, kSchemaVersion));
  }
  SAGA_ASSERT_OK(store->register_worker({"w", "v", "r", kSchemaVersion, 1000, 0}));
  SAGA_ASSERT_OK(store->contract_schema());
  SAGA_ASSERT_OK(store->read_topology(t));
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->schema_version, kSchemaVersion);
  EXPECT_FALSE(schema_runs(*t, 2));
}

// A worker that opens the file while another connection holds a lock on it
// (two workers starting at once: one switching a fresh copy to WAL) waits for
// the lock instead of failing at start.
TEST(SqliteStore, OpeningWaitsForALockAnotherConnectionHolds) {
  TempDir dir("sagapool-open-locked");
  const std::string path = (dir.path() / "store.db").string();
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
  exec(raw, "CREATE TABLE t (x); BEGIN EXCLUSIVE; INSERT INTO t VALUES (1);");
  std::thread release([raw] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    exec(raw, "COMMIT");
  });
  std::unique_ptr<Store> store;
  const Status s = open_store("sqlite:" + path, store);
  release.join();
  sqlite3_close(raw);
  EXPECT_TRUE(s.is_ok()) << s.message();
}

// Each posting links to its account's one before: the latest are read from
// the account's head, newest first, whether posted in a scope or alone; a
// scope rolled back leaves the chain as it was.
TEST(SqliteStore, AnAccountsPostingsAreReadFromItsChainNewestFirst) {
  TempDir dir("sagapool-chain");
  const std::string path = (dir.path() / "store.db").string();
  std::unique_ptr<Store> store;
  SAGA_ASSERT_OK(open_store("sqlite:" + path, store));
  SAGA_ASSERT_OK(store->init_schema());
  EXPECT_FALSE(has_account_index(path));
  const std::vector<Account> accounts{make_account("a", 1000), make_account("b", 1000)};
  SAGA_ASSERT_OK(store->create_accounts(accounts));
  apply_in_scope(*store, {{LegOp::debit, "t-1", "a", 10, ""}, {LegOp::credit, "t-1", "b", 10, ""},
                          {LegOp::debit, "t-2", "b", 20, ""}, {LegOp::credit, "t-2", "a", 20, ""},
                          {LegOp::debit, "t-3", "a", 30, ""}});
  const LegRequest alone{LegOp::credit, "t-3", "b", 30, ""};
  LegResult r;
  SAGA_ASSERT_OK(store->apply_legs(std::span(&alone, 1), std::span(&r, 1)));
  EXPECT_EQ(r.status, LegStatus::posted);
  apply_in_scope(*store, {{LegOp::debit, "t-4", "a", 40, ""}}, false);
  apply_in_scope(*store, {{LegOp::cancel_debit, "t-3", "a", 30, ""}, {LegOp::debit, "t-5", "b", 5, ""}});

  EXPECT_EQ(recent(*store, "a"),
            (std::vector<std::string>{"t-3/reverse_debit", "t-3/debit", "t-2/credit", "t-1/debit"}));
  EXPECT_EQ(recent(*store, "b"),
            (std::vector<std::string>{"t-5/debit", "t-3/credit", "t-2/debit", "t-1/credit"}));
  EXPECT_EQ(recent(*store, "a", 2), (std::vector<std::string>{"t-3/reverse_debit", "t-3/debit"}));
  EXPECT_TRUE(recent(*store, "a", 0).empty());
  EXPECT_TRUE(recent(*store, "nobody").empty());
}

// A file as version 3 left it: no chain, postings_account. Init adds the
// columns and keeps the index, which reads use while builds of version 3 may
// still post unlinked; the contract links every posting in time order and
// drops the index, and postings made after it extend the chain.
TEST(SqliteStore, ContractLinksTheOlderPostingsAndDropsTheAccountIndex) {
  TempDir dir("sagapool-chain-upgrade");
  const std::string path = current_file(dir);
  std::unique_ptr<Store> store;
  exec(path, R"(
    ALTER TABLE accounts DROP COLUMN last_transfer; ALTER TABLE accounts DROP COLUMN last_kind;
    ALTER TABLE postings DROP COLUMN prev_transfer; ALTER TABLE postings DROP COLUMN prev_kind;
    CREATE INDEX postings_account ON postings(account_id, at);
    UPDATE meta SET value = '3' WHERE key IN ('schema_version', 'schema_expanded');
    INSERT INTO accounts VALUES ('a', 940, 1000, 0, '', 0, 60), ('b', 1060, 1000, 0, '', 0, 0);
    INSERT INTO postings VALUES ('t-1', 'a', 'debit', 10, 1), ('t-1', 'b', 'credit', 10, 2),
      ('t-2', 'a', 'debit', 20, 3), ('t-2', 'b', 'credit', 20, 3), ('t-3', 'a', 'debit', 30, 3);
  )");

  SAGA_ASSERT_OK(open_store("sqlite:" + path, store));
  SAGA_ASSERT_OK(store->init_schema());
  std::optional<Topology> t;
  SAGA_ASSERT_OK(store->read_topology(t));
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->schema_version, 3);
  EXPECT_EQ(t->schema_expanded, kSchemaVersion);
  EXPECT_TRUE(has_account_index(path));
  EXPECT_EQ(recent(*store, "a"), (std::vector<std::string>{"t-3/debit", "t-2/debit", "t-1/debit"}));

  // In the window: this build posts (linked to an empty head), and a build
  // of version 3 posts unlinked, later.
  apply_in_scope(*store, {{LegOp::debit, "t-4", "a", 40, ""}});
  exec(path, "INSERT INTO postings(transfer_id, account_id, kind, amount, at) "
             "VALUES ('t-5', 'a', 'credit', 50, 9000000000000)");
  EXPECT_EQ(recent(*store, "a").size(), 5U);

  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("contract #" + std::to_string(round + 1));
    SAGA_ASSERT_OK(store->contract_schema());
    EXPECT_FALSE(has_account_index(path));
    EXPECT_EQ(recent(*store, "a"), (std::vector<std::string>{"t-5/credit", "t-4/debit", "t-3/debit",
                                                             "t-2/debit", "t-1/debit"}));
    EXPECT_EQ(recent(*store, "b"), (std::vector<std::string>{"t-2/credit", "t-1/credit"}));
  }
  SAGA_ASSERT_OK(store->read_topology(t));
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->schema_version, kSchemaVersion);
  apply_in_scope(*store, {{LegOp::credit, "t-6", "b", 60, ""}, {LegOp::debit, "t-7", "a", 70, ""}});
  EXPECT_EQ(recent(*store, "a", 3), (std::vector<std::string>{"t-7/debit", "t-5/credit", "t-4/debit"}));
  EXPECT_EQ(recent(*store, "b"), (std::vector<std::string>{"t-6/credit", "t-2/credit", "t-1/credit"}));
}

// Finished in a batch on a store whose floor is 7: one outbox row lists the
// batch's finished transfers, whose rows say published from the start and
// are never written again, yet read as unpublished (documents, audit scan,
// gauges) until the outcomes are marked; a partial mark shrinks the row, the
// last one deletes it.
TEST(SqliteStore, FinishedBatchesAreListedInTheOutboxUntilTheirOutcomesAreMarked) {
  TempDir dir("sagapool-outbox");
  const std::string path = current_file(dir);
  std::unique_ptr<Store> s;
  SAGA_ASSERT_OK(open_store("sqlite:" + path, s));
  SAGA_ASSERT_OK(s->begin_scope());
  InsertResult inserted{};
  SAGA_ASSERT_OK(insert_one(*s, spec("t-open"), "w1", 60'000, inserted));
  SAGA_ASSERT_OK(s->end_scope(true));
  std::int64_t at_ms = 0;
  finish_in_scope(*s, {"t-a", "t-b", "t-c"}, 60'000, &at_ms, "t-c");

  // The ids in order (a batch lists them in any).
  const std::string listed = "(SELECT group_concat(value, ',') FROM (SELECT j.value FROM outbox o, "
                             "json_each(o.done) j ORDER BY 1)) || '/' || canceled";
  EXPECT_EQ(value(path, "SELECT " + listed + " || '/' || (finished_at = " + std::to_string(at_ms) +
                            ") FROM outbox"),
            R"(t-a,t-b/["t-c"]/1)");
  EXPECT_EQ(value(path, "SELECT group_concat(id || ':' || notified, ',') FROM "
                        "(SELECT * FROM transfers WHERE id <> 't-open' ORDER BY id)"),
            "t-a:1,t-b:1,t-c:1");
  const auto unpublished = [&] { return unpublished_ids(*s); };
  const auto gauges = [&] { return unpublished_counts(*s, at_ms); };  // t-open still initial
  std::optional<TransferDoc> doc;
  SAGA_ASSERT_OK(s->load_transfer("t-b", doc));
  ASSERT_TRUE(doc);
  EXPECT_FALSE(doc->notified);
  EXPECT_EQ(unpublished(), "t-a,t-b,t-c,");
  EXPECT_EQ(gauges(), "2/1");
  // A second connection (another worker, sagactl) reads the same.
  std::unique_ptr<Store> other;
  SAGA_ASSERT_OK(open_store("sqlite:" + path, other));
  SAGA_ASSERT_OK(other->load_transfer("t-a", doc));
  EXPECT_FALSE(doc->notified);

  // Marked across two calls, as delivery reports come; an id twice, one
  // never finished and one unknown change nothing.
  SAGA_ASSERT_OK(s->mark_notified(std::vector<std::string_view>{"t-b", "t-open", "t-b", "t-none"}));
  EXPECT_EQ(value(path, "SELECT " + listed + " FROM outbox"), R"(t-a/["t-c"])");
  SAGA_ASSERT_OK(s->load_transfer("t-b", doc));
  EXPECT_TRUE(doc->notified);
  EXPECT_EQ(unpublished(), "t-a,t-c,");
  EXPECT_EQ(gauges(), "1/1");
  SAGA_ASSERT_OK(s->mark_notified(std::vector<std::string_view>{"t-c", "t-a"}));
  EXPECT_EQ(value(path, "SELECT count(*) FROM outbox"), "0");
  EXPECT_EQ(unpublished(), "");
  EXPECT_EQ(gauges(), "0/0");
  EXPECT_EQ(value(path, "SELECT count(*) FROM transfers WHERE notified = 0"), "1");  // t-open
}

// A worker that stopped before its outcomes were delivered leaves its outbox
// row: once the row's lease ends, recovery claims those transfers like any
// unpublished one (epoch and attempts up, its own lease), and the outcomes
// are then marked on their rows. The stopped worker's late mark finds its
// row gone and flags the row it delivered; a row rolled back is forgotten.
TEST(SqliteStore, RecoveryClaimsTheTransfersOfAnOutboxRowWhoseLeaseEnded) {
  TempDir dir("sagapool-outbox-recovery");
  const std::string path = current_file(dir);
  std::unique_ptr<Store> stopped, s;
  SAGA_ASSERT_OK(open_store("sqlite:" + path, stopped));
  SAGA_ASSERT_OK(open_store("sqlite:" + path, s));
  finish_in_scope(*stopped, {"t-1", "t-2"}, 1'000);
  std::vector<TransferDoc> claimed;
  SAGA_ASSERT_OK(s->claim_expired("w2", 60'000, 10, claimed));
  EXPECT_TRUE(claimed.empty());  // the lease has not ended
  EXPECT_EQ(value(path, "SELECT count(*) FROM outbox"), "1");

  std::this_thread::sleep_for(std::chrono::milliseconds(1'100));
  SAGA_ASSERT_OK(s->claim_expired("w2", 60'000, 1, claimed));
  ASSERT_EQ(claimed.size(), 1u);  // the limit holds; the other waits for the next call
  EXPECT_EQ(value(path, "SELECT count(*) FROM outbox"), "0");
  std::vector<TransferDoc> rest;
  SAGA_ASSERT_OK(s->claim_expired("w2", 60'000, 10, rest));
  ASSERT_EQ(rest.size(), 1u);
  claimed.push_back(rest.front());
  expect_reclaimed(claimed, {"t-1", "t-2"}, "w2");
  SAGA_ASSERT_OK(stopped->mark_notified(std::vector<std::string_view>{"t-1"}));  // late
  EXPECT_EQ(value(path, "SELECT group_concat(id, ',') FROM transfers WHERE notified = 0"), "t-2");
  SAGA_ASSERT_OK(s->mark_notified(std::vector<std::string_view>{"t-2"}));  // the recovering one
  EXPECT_EQ(value(path, "SELECT count(*) FROM transfers WHERE notified = 0"), "0");
  SAGA_ASSERT_OK(s->claim_expired("w3", 60'000, 10, claimed));
  EXPECT_TRUE(claimed.empty());

  // A batch rolled back leaves no row, and its store forgets it: the next
  // row, another worker's, gets the same seq and is not this store's to
  // rewrite or delete.
  SAGA_ASSERT_OK(s->begin_scope());
  InsertResult inserted{};
  SAGA_ASSERT_OK(insert_one(*s, spec("t-3"), "w2", 60'000, inserted));
  const Transition t{"t-3", TransferState::initial, TransferState::done, Reason::none, "w2", 1};
  std::uint8_t applied = 0;
  SAGA_ASSERT_OK(s->transition(std::span(&t, 1), 60'000, std::span(&applied, 1), nullptr));
  SAGA_ASSERT_OK(s->mark_notified(std::vector<std::string_view>{"t-2"}));  // writes the batch behind
  SAGA_ASSERT_OK(s->end_scope(false));
  EXPECT_EQ(value(path, "SELECT count(*) FROM outbox") + "/" + value(path, "SELECT count(*) FROM transfers"),
            "0/2");
  finish_in_scope(*stopped, {"t-3"}, 60'000);
  SAGA_ASSERT_OK(s->mark_notified(std::vector<std::string_view>{"t-3"}));
  EXPECT_EQ(value(path, "SELECT done FROM outbox"), R"(["t-3"])");
  SAGA_ASSERT_OK(stopped->mark_notified(std::vector<std::string_view>{"t-3"}));
  EXPECT_EQ(value(path, "SELECT count(*) FROM outbox"), "0");
}

// Until the floor is 7, builds that read only the flags may share the file
// (a rolling upgrade between expand and contract): a finished batch leaves
// its flags 0 and the outbox empty. A store sees the contract before its
// next batch, once it reads the floor again.
TEST(SqliteStore, TheOutboxIsWrittenOnlyOnceTheFloorIsSeven) {
  TempDir dir("sagapool-outbox-floor");
  const std::string path = current_file(dir);
  exec(path, "UPDATE meta SET value = '6' WHERE key = 'schema_version'");
  std::unique_ptr<Store> worker;
  SAGA_ASSERT_OK(open_store("sqlite:" + path, worker));
  finish_in_scope(*worker, {"t-before"}, 5'000);
  EXPECT_EQ(value(path, "SELECT count(*) FROM outbox"), "0");
  EXPECT_EQ(value(path, "SELECT notified FROM transfers WHERE id = 't-before'"), "0");
  std::unique_ptr<Store> admin;
  SAGA_ASSERT_OK(open_store("sqlite:" + path, admin));
  SAGA_ASSERT_OK(admin->contract_schema());
  std::this_thread::sleep_for(std::chrono::milliseconds(10'100));  // kFloorRecheckMs
  finish_in_scope(*worker, {"t-after"}, 5'000);
  EXPECT_EQ(value(path, "SELECT done FROM outbox"), R"(["t-after"])");
  EXPECT_EQ(value(path, "SELECT notified FROM transfers WHERE id = 't-after'"), "1");
}

}  // namespace sagapool::test
