// The conformance suite on the embedded default: no server, label `unit`.
// Also what only this backend has: upgrading a file made by an older schema.
#include <sqlite3.h>

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
  const std::string path = (dir.path() / "store.db").string();
  std::unique_ptr<Store> store;
  SAGA_ASSERT_OK(open_store("sqlite:" + path, store));
  SAGA_ASSERT_OK(store->init_schema());
  SAGA_ASSERT_OK(store->write_topology({"ledger-1", 0, 1, kSchemaVersion, kSchemaVersion}));
  store.reset();
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &raw), SQLITE_OK);
  exec(raw, "DROP TABLE workers; UPDATE meta SET value = '2' WHERE key = 'schema_version'; "
            "DELETE FROM meta WHERE key = 'schema_expanded';");
  sqlite3_close(raw);

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

}  // namespace sagapool::test
