// The conformance suite on PostgreSQL (label `integration`), plus what only
// this backend has: connection handling, secrets, schema versions, one
// transaction per batch call.
#include <algorithm>
#include <atomic>
#include <iostream>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>

#include "pg_server.hpp"
#include "store_test.hpp"

namespace sagapool::test {

INSTANTIATE_TEST_SUITE_P(postgresql, StoreTest, testing::Values(std::string("postgresql")),
                         [](const testing::TestParamInfo<std::string>& p) { return p.param; });

namespace {

// Unique per process run, so `--gtest_repeat` works on the shared server.
std::string unique_name(const std::string& base) {
  static int counter = 0;
  return base + "_" + std::to_string(++counter);
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::string psql_value(const PgServer& server, const std::string& db, const std::string& sql) {
  const RunResult r = server.psql(db, sql);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::string out = r.output;
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

std::unique_ptr<Store> open_initialised(const std::string& url) {
  std::unique_ptr<Store> s;
  const Status st = open_store(url, s);
  EXPECT_TRUE(st.is_ok()) << st.message();
  if (s) {
    const Status init = s->init_schema();
    EXPECT_TRUE(init.is_ok()) << init.message();
  }
  return s;
}

// Finished transfers t-1 .. t-n, every outcome published but t-7's, each
// publication leaving a dead entry in the recovery index, as in a running
// store.
void insert_published_history(const PgServer& server, const std::string& db, int n) {
  psql_value(server, db,
             "INSERT INTO saga_transfers (id, source, destination, amount, currency, metadata, "
             "payload_hash, state, owner, epoch, lease_until_ms, created_at_ms, last_modified_ms, "
             "requested_at_ms, finished_at_ms, attempts, notified, origin_topic, origin_partition, "
             "origin_offset) SELECT 't-' || g, 'a', 'b', 1, '', '', 0, 'done', 'w', 1, g, g, g, g, g, "
             "1, false, 'transfers.requests', 0, g FROM generate_series(1, " +
                 std::to_string(n) + ") AS g; UPDATE saga_transfers SET notified = true WHERE id <> 't-7'");
}

// The last plan auto_explain logged for a statement whose text starts with
// `query` (empty if none): from its "Query Text:" line to the next entry.
std::string logged_plan(const PgServer& server, const std::string& query) {
  const std::string log = server.log();
  const std::size_t at = log.rfind("Query Text: " + query);
  return at == std::string::npos ? std::string() : log.substr(at, log.find("LOG:", at) - at);
}

// A server of the case's own whose log holds the plan of every statement,
// those run inside functions too (read back with logged_plan).
PgServer plan_logging_server(std::vector<std::string> settings = {}) {
  settings.insert(settings.begin(), {"shared_preload_libraries=auto_explain", "auto_explain.log_min_duration=0",
                                     "auto_explain.log_nested_statements=on"});
  return PgServer(std::move(settings));
}

// A case's own database on the shared server, named after `base`,
// initialised, and a store on it (null if that failed).
struct FreshDatabase {
  PgServer& server;
  std::string name;
  std::unique_ptr<Store> store;
};
FreshDatabase fresh_database(const std::string& base) {
  PgServer& server = shared_pg_server();
  std::string name = unique_name(base);
  std::unique_ptr<Store> store = open_initialised(server.create_database(name));
  return {server, std::move(name), std::move(store)};
}

// The database's current transaction id; reading it takes one of its own.
long long current_xid(const PgServer& server, const std::string& db) {
  return std::stoll(psql_value(server, db, "SELECT pg_current_xact_id()::text"));
}

TEST(PgStore, DisplayNameAndErrorsNeverShowThePassword) {
  PgServer& server = shared_pg_server();
  const std::string port = std::to_string(server.port());
  const std::string db = unique_name("secrets");
  const std::string url = server.create_database(db);
  ASSERT_TRUE(contains(url, server.password()));

  std::unique_ptr<Store> s;
  SAGA_ASSERT_OK(open_store(url, s));
  EXPECT_FALSE(contains(s->display_name(), server.password())) << s->display_name();
  EXPECT_EQ(s->display_name(), "postgresql://saga@127.0.0.1:" + port + "/" + db);

  // A key=value conninfo, and a URI with the password as a query parameter.
  const std::string conninfo = "host=127.0.0.1 port=" + port + " dbname=" + db +
                               " user=saga sslmode=disable password='" + server.password() + "'";
  SAGA_ASSERT_OK(open_store(conninfo, s));
  EXPECT_FALSE(contains(s->display_name(), server.password())) << s->display_name();
  EXPECT_TRUE(contains(s->display_name(), "sslmode=disable")) << s->display_name();
  SAGA_ASSERT_OK(open_store(
      "postgresql://127.0.0.1:" + port + "/" + db + "?user=saga&password=" + server.password(), s));
  EXPECT_FALSE(contains(s->display_name(), server.password())) << s->display_name();

  // A wrong password: fatal (retrying will not help), and not repeated.
  const std::string wrong = "not-the-password-4711";
  std::unique_ptr<Store> bad;
  Status st = open_store("postgresql://saga:" + wrong + "@127.0.0.1:" + port + "/" + db, bad);
  EXPECT_EQ(st.kind(), ErrorKind::fatal) << st.message();
  EXPECT_FALSE(contains(st.message(), wrong)) << st.message();
  EXPECT_TRUE(contains(st.message(), "127.0.0.1")) << st.message();
  EXPECT_EQ(bad, nullptr);

  // A connection string libpq cannot parse is not echoed either.
  st = open_store("host=127.0.0.1 password='secret-" + wrong, bad);
  EXPECT_EQ(st.kind(), ErrorKind::fatal);
  EXPECT_FALSE(contains(st.message(), wrong)) << st.message();

  // A missing database is a configuration error too.
  st = open_store("postgresql://saga:" + server.password() + "@127.0.0.1:" + port + "/nodb", bad);
  EXPECT_EQ(st.kind(), ErrorKind::fatal) << st.message();
  EXPECT_FALSE(contains(st.message(), server.password())) << st.message();
}

TEST(PgStore, NoServerListeningIsTransient) {
  const int port = free_loopback_port();
  std::unique_ptr<Store> s;
  const Status st = open_store("postgresql://saga:pw@127.0.0.1:" + std::to_string(port) + "/x", s);
  EXPECT_EQ(st.kind(), ErrorKind::retry_stage) << st.message();
}

TEST(PgStore, ReconnectsAfterTheServerComesBack) {
  PgServer server;  // its own: this test stops it
  const std::string url = server.create_database("reconnect");
  auto s = open_initialised(url);
  ASSERT_NE(s, nullptr);
  const Account a{"acct-a", 700, 700, 0, "", false};
  SAGA_ASSERT_OK(s->create_accounts(std::span(&a, 1)));

  std::int64_t expected_balance = 700;
  for (const auto mode : {PgServer::StopMode::fast, PgServer::StopMode::immediate}) {
    server.stop(mode);
    std::int64_t now = 0;
    Status st = s->now_ms(now);
    EXPECT_TRUE(st.is_transient()) << to_string(st.kind()) << ": " << st.message();
    EXPECT_FALSE(contains(st.message(), server.password()));
    std::optional<Account> loaded;
    st = s->load_account("acct-a", loaded);
    EXPECT_TRUE(st.is_transient()) << to_string(st.kind()) << ": " << st.message();

    server.start();
    EXPECT_TRUE(eventually([&] { return s->now_ms(now).is_ok(); }, std::chrono::seconds(30)));
    SAGA_ASSERT_OK(s->load_account("acct-a", loaded));
    ASSERT_TRUE(loaded.has_value());
    EXPECT_EQ(loaded->balance, expected_balance) << "committed work survives the stop";
    // Prepared statements are re-prepared on the new connection.
    LegRequest req{LegOp::debit, mode == PgServer::StopMode::fast ? "t-1" : "t-2", "acct-a", 100,
                   ""};
    LegResult r;
    SAGA_ASSERT_OK(s->apply_legs(std::span(&req, 1), std::span(&r, 1)));
    EXPECT_EQ(r.status, LegStatus::posted);
    expected_balance -= 100;
  }
  std::optional<Account> loaded;
  SAGA_ASSERT_OK(s->load_account("acct-a", loaded));
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->balance, 500);
}

TEST(PgStore, AnUninitialisedDatabaseIsFatalWithAHint) {
  PgServer& server = shared_pg_server();
  std::unique_ptr<Store> s;
  SAGA_ASSERT_OK(open_store(server.create_database(unique_name("uninitialised")), s));
  std::optional<TransferDoc> d;
  const Status st = s->load_transfer("t-1", d);
  EXPECT_EQ(st.kind(), ErrorKind::fatal);
  EXPECT_TRUE(contains(st.message(), "sagactl init")) << st.message();
  // The failed statement leaves the connection usable.
  SAGA_ASSERT_OK(s->init_schema());
  SAGA_ASSERT_OK(s->load_transfer("t-1", d));
  EXPECT_FALSE(d.has_value());
}

TEST(PgStore, SchemaIsVersionedAndConcurrentInitsAreSerialised) {
  PgServer& server = shared_pg_server();
  const std::string db = unique_name("versioned");
  const std::string url = server.create_database(db);
  std::vector<std::unique_ptr<Store>> stores;
  for (int i = 0; i < 3; ++i) {
    stores.emplace_back();
    SAGA_ASSERT_OK(open_store(url, stores.back()));
  }
  std::vector<Status> results(stores.size());
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < stores.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = stores[i]->init_schema(); });
  }
  for (auto& t : threads) t.join();
  for (const Status& st : results) EXPECT_TRUE(st.is_ok()) << st.message();

  EXPECT_EQ(psql_value(server, db, "SELECT schema_version FROM saga_meta"),
            std::to_string(kSchemaVersion));
  EXPECT_EQ(psql_value(server, db,
                       "SELECT string_agg(table_name, ',' ORDER BY table_name) FROM "
                       "information_schema.tables WHERE table_name LIKE 'saga\\_%'"),
            "saga_accounts,saga_batch_links,saga_decisions,saga_leg_voids,saga_meta,saga_outbox,saga_owners_seen,"
            "saga_pending,saga_postings,saga_transfers,saga_workers");

  // A schema newer than this build is refused, not downgraded.
  EXPECT_EQ(server.psql(db, "UPDATE saga_meta SET schema_version = 99").exit_code, 0);
  const Status st = stores[0]->init_schema();
  EXPECT_EQ(st.kind(), ErrorKind::fatal);
  EXPECT_TRUE(contains(st.message(), "99")) << st.message();
  EXPECT_EQ(psql_value(server, db, "SELECT schema_version FROM saga_meta"), "99");
}

// Schema version 1 had no reservation: init's migration adds it, filled from
// the pending debits that may still be reversed; a second init is a no-op.
TEST(PgStore, InitUpgradesAVersionOneSchemaWithItsReservations) {
  auto [server, db, s] = fresh_database("upgrade");
  ASSERT_NE(s, nullptr);
  SAGA_ASSERT_OK(s->create_accounts(std::vector<Account>{make_account("a", 1000), make_account("b", 0)}));
  const LegRequest legs[] = {
      {LegOp::debit, "t-1", "a", 300, ""},       {LegOp::credit, "t-1", "b", 300, ""},
      {LegOp::debit, "t-2", "a", 200, ""},       {LegOp::debit, "t-3", "a", 50, ""},
      {LegOp::cancel_debit, "t-3", "a", 50, ""},
  };
  LegResult results[5];
  SAGA_ASSERT_OK(s->apply_legs(legs, results));
  // Back to what version 1 had.
  ASSERT_EQ(server.psql(db, "ALTER TABLE saga_accounts DROP COLUMN reserved; "
                            "ALTER TABLE saga_pending DROP COLUMN reserved; "
                            "UPDATE saga_meta SET schema_version = 1, schema_expanded = NULL")
                .exit_code,
            0);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("init #" + std::to_string(round + 1));
    SAGA_ASSERT_OK(s->init_schema());
    // Version 2 is one step (the floor follows it); versions 3 and 4 are
    // expand steps that version-2 builds run beside.
    EXPECT_EQ(psql_value(server, db, "SELECT schema_version || '/' || schema_expanded FROM saga_meta"),
              "2/" + std::to_string(kSchemaVersion));
    EXPECT_EQ(psql_value(server, db, "SELECT id || '=' || reserved FROM saga_accounts ORDER BY id"),
              "a=500\nb=0");
  }
  const LegRequest release{LegOp::release, "t-1", "a", 300, ""};
  LegResult r;
  SAGA_ASSERT_OK(s->apply_legs(std::span(&release, 1), std::span(&r, 1)));
  EXPECT_EQ(r.status, LegStatus::released);
  std::optional<Account> a;
  SAGA_ASSERT_OK(s->load_account("a", a));
  ASSERT_TRUE(a);
  EXPECT_EQ(a->reserved, 200);
  EXPECT_EQ(a->balance, 500);
}

// A store as version 2 left it (no registry, no schema_expanded, the call
// of schema 2's first builds installed): init expands it to version 3 (and
// 4, empty on PostgreSQL) and keeps everything version-2 builds use, so they run on; the contract then
// drops the old call and raises the floor, which version-2 builds refuse.
TEST(PgStore, InitExpandsAVersionTwoSchemaAndContractFinishesIt) {
  auto [server, db, s] = fresh_database("expand_contract");
  ASSERT_NE(s, nullptr);
  ASSERT_EQ(server.psql(db, R"(
      DROP TABLE saga_workers;
      DROP TABLE saga_owners_seen;
      UPDATE saga_meta SET schema_version = 2, schema_expanded = NULL;
      CREATE FUNCTION saga_transition(p_id text[], p_from text[], p_to text[],
          p_reason text[], p_owner text[], p_epoch bigint[], p_lease_ms bigint)
        RETURNS SETOF bigint LANGUAGE sql VOLATILE AS $$
        SELECT saga_transition_at(p_id, p_from, p_to, p_reason, p_owner, p_epoch, p_lease_ms,
                                  NULL::bigint) $$;)")
                .exit_code,
            0);
  const std::string has_old_call =
      "SELECT count(*) FROM pg_proc WHERE proname = 'saga_transition'";
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("init #" + std::to_string(round + 1));
    SAGA_ASSERT_OK(s->init_schema());
    EXPECT_EQ(psql_value(server, db, "SELECT schema_version || '/' || schema_expanded FROM saga_meta"),
              "2/" + std::to_string(kSchemaVersion));
    EXPECT_EQ(psql_value(server, db, has_old_call), "1");
    EXPECT_EQ(psql_value(server, db, "SELECT to_regclass('saga_workers') IS NOT NULL"), "t");
  }
  // What version-2 builds read at start: the version they require.
  EXPECT_EQ(psql_value(server, db, "SELECT schema_version FROM saga_meta"), "2");
  SAGA_ASSERT_OK(s->contract_schema());
  EXPECT_EQ(psql_value(server, db, "SELECT schema_version || '/' || schema_expanded FROM saga_meta"),
            std::to_string(kSchemaVersion) + "/" + std::to_string(kSchemaVersion));
  EXPECT_EQ(psql_value(server, db, has_old_call), "0");
  // A later init does not bring it back.
  SAGA_ASSERT_OK(s->init_schema());
  EXPECT_EQ(psql_value(server, db, has_old_call), "0");
}

// A worker of version 2 never registers, and when idle holds no lease: its
// recovery pass (saga_claim_expired, reinstalled by init) is what shows it.
TEST(PgStore, ARecoveryPassMakesItsCallerARecentOwner) {
  auto s = fresh_database("owners_seen").store;
  ASSERT_NE(s, nullptr);
  std::int64_t before = 0;
  SAGA_ASSERT_OK(s->now_ms(before));
  std::vector<TransferDoc> claimed;
  SAGA_ASSERT_OK(s->claim_expired("idle-old-worker", 2'000, 10, claimed));
  EXPECT_TRUE(claimed.empty());
  std::vector<std::string> owners;
  SAGA_ASSERT_OK(s->recent_owners(before, owners));
  EXPECT_EQ(owners, std::vector<std::string>{"idle-old-worker"});
  SAGA_ASSERT_OK(s->recent_owners(before + 60'000, owners));
  EXPECT_TRUE(owners.empty());
}

TEST(PgStore, RecoveryAndStaleQueriesUseTheirPartialIndexes) {
  auto [server, db, s] = fresh_database("plans");
  ASSERT_NE(s, nullptr);
  // Each query, planned without sequential scans, and the index it must use.
  const std::pair<std::string, std::string> queries[] = {
      {"SELECT id FROM saga_transfers c WHERE c.lease_until_ms < 5 AND (c.state IN ('initial', "
       "'pending', 'applied', 'canceling') OR NOT c.notified) ORDER BY c.lease_until_ms LIMIT 10",
       "saga_transfers_recovery"},
      {"SELECT id FROM saga_transfers WHERE state IN ('initial', 'pending', 'applied', 'canceling') "
       "AND last_modified_ms < 5 ORDER BY last_modified_ms, id LIMIT 10",
       "saga_transfers_stale"},
  };
  for (const auto& [query, index] : queries) {
    const std::string plan = psql_value(server, db, "SET enable_seqscan = off; EXPLAIN " + query);
    EXPECT_TRUE(contains(plan, index)) << plan;
  }
}

// The gauges are read every scrape: their cost must follow the work since
// the last reading, not the ledger's size. A history of 200,000 finished
// transfers whose outcomes were published (each update leaves a dead entry
// in the recovery index, as in a running store), never analysed, as a
// store is until autovacuum first gets to it. Before, the planner read the
// whole table for the unpublished ones on every scrape. Now the first
// reading visits the rows of the dead entries, once: the next one reads
// only the index, a few percent of the table's pages.
TEST(PgStore, TheStateGaugesNeverReadTheWholeTable) {
  PgServer server({"shared_preload_libraries=pg_stat_statements"});
  const std::string db = "gauges";
  auto s = open_initialised(server.create_database(db));
  ASSERT_NE(s, nullptr);
  insert_published_history(server, db, 200000);
  psql_value(server, db, "CREATE EXTENSION pg_stat_statements");
  const long long table_pages =
      std::stoll(psql_value(server, db, "SELECT pg_relation_size('saga_transfers') / 8192"));
  ASSERT_GT(table_pages, 4000);
  const auto reading = [&] {
    psql_value(server, db, "SELECT pg_stat_statements_reset()");
    StateStatsTable stats;
    EXPECT_TRUE(s->state_stats(stats).is_ok());
    const StateStats& done = stats[static_cast<std::size_t>(TransferState::done)];
    EXPECT_EQ(done.count, 1);  // t-7, still unpublished
    EXPECT_EQ(done.oldest_ms, 7);
    const std::string blocks = psql_value(
        server, db,
        "SELECT shared_blks_hit + shared_blks_read FROM pg_stat_statements "
        "WHERE query LIKE '%FROM saga_transfers%GROUP BY state%'");
    EXPECT_FALSE(blocks.empty()) << "the gauges' statement was not seen";
    return blocks.empty() ? table_pages : std::stoll(blocks);
  };
  EXPECT_LT(reading(), table_pages * 3 / 4);
  EXPECT_LT(reading(), table_pages / 10);
}

// The store's statements are never JIT-compiled. A batch's statements take
// arrays of thousands of ids, so their estimated cost passed jit_above_cost,
// and the server compiled their expressions again on every call: 5.6-13 %
// of the machine's CPU samples at full load in libLLVM (docs/postgres.md,
// "Speed"). Here the server compiles every statement it may; a session of
// its own shows that it does.
TEST(PgStore, TheStoresStatementsAreNeverJitCompiled) {
  PgServer server({"shared_preload_libraries=pg_stat_statements", "pg_stat_statements.track=all", "jit=on",
                   "jit_above_cost=0", "jit_inline_above_cost=0", "jit_optimize_above_cost=0"});
  const std::string db = "no_jit";
  auto s = open_initialised(server.create_database(db));
  ASSERT_NE(s, nullptr);
  psql_value(server, db, "CREATE EXTENSION pg_stat_statements");
  psql_value(server, db, "SELECT pg_stat_statements_reset()");
  SAGA_ASSERT_OK(s->create_accounts(std::vector<Account>{make_account("a", 100), make_account("b", 0)}));
  std::optional<Account> a;
  SAGA_ASSERT_OK(s->load_account("a", a));
  ASSERT_TRUE(a.has_value());
  StateStatsTable stats;
  SAGA_ASSERT_OK(s->state_stats(stats));
  psql_value(server, db, "SELECT sum(balance) AS no_jit_control FROM saga_accounts");
  const auto sum_of = [&](const std::string& column, const std::string& filter) {
    return std::stoll(psql_value(server, db, "SELECT coalesce(sum(" + column + "), 0) FROM pg_stat_statements "
                                             "WHERE query NOT LIKE '%pg_stat_statements%' AND " + filter));
  };
  const std::string control = "query LIKE '%no_jit_control%'";
  const std::string store = "query NOT LIKE '%no_jit_control%' AND query NOT LIKE 'CREATE EXTENSION%'";
  ASSERT_EQ(sum_of("calls", control), 1);
  ASSERT_GT(sum_of("jit_functions", control), 0)
      << "the server compiled nothing for its own session: the test would show nothing";
  EXPECT_GT(sum_of("calls", store), 0) << "none of the store's statements was seen";
  EXPECT_EQ(sum_of("jit_functions", store), 0);
}

// Marking outcomes published finds its rows by primary key, whatever the
// statistics say. An autovacuum that saw every outcome published made the
// recovery index look empty, and the statement's generic plan (a prepared
// statement's plan after five calls) then walked that index, comparing
// each entry with the id list one element at a time: 0.3-18 s a call for
// 5,000 ids, until the run's end (bench/REPORT.md, "The slow runs"). Here
// every plan is generic but where the store's function asks for custom
// ones, and auto_explain logs the store's own, inside its function too.
TEST(PgStore, MarkingOutcomesPublishedFindsThemByIdWhateverTheStatistics) {
  PgServer server = plan_logging_server({"plan_cache_mode=force_generic_plan"});
  const std::string db = "notified";
  auto s = open_initialised(server.create_database(db));
  ASSERT_NE(s, nullptr);
  insert_published_history(server, db, 20000);
  psql_value(server, db, "VACUUM ANALYZE saga_transfers");  // what autovacuum does
  const std::vector<std::string_view> ids = {"t-7"};
  SAGA_ASSERT_OK(s->mark_notified(ids));
  EXPECT_EQ(psql_value(server, db, "SELECT count(*) FROM saga_transfers WHERE NOT notified"), "0");
  const std::string plan = logged_plan(server, "UPDATE saga_transfers SET notified = true WHERE id = ANY");
  ASSERT_FALSE(plan.empty()) << "auto_explain logged no plan of the store's statement";
  EXPECT_TRUE(contains(plan, "saga_transfers_pkey")) << plan;
  EXPECT_FALSE(contains(plan, "saga_transfers_recovery")) << plan;
}

// Applying legs finds each pair's pending entry by primary key, whatever
// the statistics say. An autovacuum that found saga_pending with pages but
// almost no live entry made the planner take it for one row, and
// the legs' generic plan then compared every pair with every entry of a
// whole-index scan: as cross-shard sagas filled the table, 0.6-2.3 s a call
// until the next autovacuum (bench/REPORT.md, "The eleventh session").
// Here the table gets that state, the session makes its generic plan (the
// sixth call), and the table fills before the last call.
TEST(PgStore, ApplyingLegsFindsPendingEntriesByKeyWhateverTheStatistics) {
  PgServer server = plan_logging_server();
  const std::string db = "pending_plan";
  auto s = open_initialised(server.create_database(db));
  ASSERT_NE(s, nullptr);
  constexpr int kAccounts = 200;
  std::vector<Account> accounts;
  for (int i = 0; i < kAccounts; ++i) accounts.push_back(make_account("a" + std::to_string(i), 1'000'000));
  SAGA_ASSERT_OK(s->create_accounts(accounts));
  psql_value(server, db,
             "INSERT INTO saga_pending SELECT 'a' || (g % 200), 'old-' || g, 1 "
             "FROM generate_series(1, 1300) AS g; DELETE FROM saga_pending; ANALYZE saga_pending");
  ASSERT_EQ(psql_value(server, db, "SELECT reltuples FROM pg_class WHERE relname = 'saga_pending'"), "0");
  std::vector<std::string> ids;
  std::vector<LegRequest> legs;
  std::vector<LegResult> results(kAccounts);
  for (int call = 0; call < 8; ++call) {
    if (call == 7) {
      psql_value(server, db,
                 "INSERT INTO saga_pending SELECT 'a' || (g % 200), 'live-' || g, 1 "
                 "FROM generate_series(1, 5000) AS g");
    }
    ids.clear();
    legs.clear();
    for (int i = 0; i < kAccounts; ++i) ids.push_back("t" + std::to_string(call) + "-" + std::to_string(i));
    for (int i = 0; i < kAccounts; ++i) legs.push_back({LegOp::debit, ids[i], accounts[i].id, 1, ""});
    SAGA_ASSERT_OK(s->apply_legs(legs, results));
    for (const LegResult& r : results) ASSERT_EQ(r.status, LegStatus::posted);
  }
  const std::string plan = logged_plan(server, "SELECT array_agg(x.debit)");
  ASSERT_FALSE(plan.empty()) << "auto_explain logged no plan of the legs' journal read";
  EXPECT_TRUE(contains(plan, "Index Scan using saga_pending_pkey on saga_pending e")) << plan;
  EXPECT_TRUE(contains(plan, "Index Cond: ((account_id = y.acc) AND (transfer_id = y.tr))")) << plan;
  EXPECT_FALSE(contains(plan, "(e.account_id = y.acc)")) << plan;  // a join filter: every entry, each pair
}

// Every batch call is one statement and so one transaction: a write
// transaction takes exactly one transaction id. psql's own reads of the
// counter take one each.
TEST(PgStore, EveryBatchCallIsOneTransaction) {
  PgServer& server = shared_pg_server();
  const std::string db = unique_name("round_trips");
  auto s = open_initialised(server.create_database(db));
  ASSERT_NE(s, nullptr);
  const auto expect_one_transaction = [&](const char* what, const auto& call) {
    const long long before = current_xid(server, db);
    const Status st = call();
    EXPECT_TRUE(st.is_ok()) << what << ": " << st.message();
    EXPECT_EQ(current_xid(server, db), before + 2) << what << " used more than one transaction";
  };

  std::vector<Account> accounts;
  for (int i = 0; i < 20; ++i) {
    accounts.push_back({"a" + std::to_string(i), 1000, 1000, 0, "", false});
  }
  expect_one_transaction("create_accounts", [&] { return s->create_accounts(accounts); });

  std::vector<TransferSpec> specs;
  for (int i = 0; i < 50; ++i) specs.push_back(spec("t-" + std::to_string(i)));
  std::vector<NewTransfer> batch;
  for (const auto& t : specs) batch.push_back(t.to_new());
  std::vector<InsertResult> inserted(batch.size());
  // Warm up: the first call on a connection also prepares its statement.
  SAGA_ASSERT_OK(
      s->insert_transfers(std::span(batch).first(1), "w1", 0, std::span(inserted).first(1)));
  expect_one_transaction("insert_transfers",
                         [&] { return s->insert_transfers(batch, "w1", 0, inserted); });

  std::vector<Transition> moves;
  for (const auto& t : specs)
    moves.push_back({t.id, TransferState::initial, TransferState::pending, Reason::none, "w1", 1});
  std::vector<std::uint8_t> applied(moves.size());
  SAGA_ASSERT_OK(s->transition({}, 0, applied));
  SAGA_ASSERT_OK(s->transition(std::span(moves).first(1), 0, std::span(applied).first(1)));
  expect_one_transaction("transition", [&] { return s->transition(moves, 0, applied); });

  std::vector<LegRequest> legs;
  for (int i = 0; i < 100; ++i) {
    legs.push_back({i % 2 == 0 ? LegOp::debit : LegOp::credit,
                    specs[static_cast<std::size_t>(i / 2)].id,
                    accounts[static_cast<std::size_t>(i % 20)].id, 10, ""});
  }
  std::vector<LegResult> results(legs.size());
  SAGA_ASSERT_OK(s->apply_legs(std::span(legs).first(1), std::span(results).first(1)));
  expect_one_transaction("apply_legs", [&] { return s->apply_legs(legs, results); });

  std::vector<TransferDoc> claimed;
  std::this_thread::sleep_for(std::chrono::milliseconds(5));  // leases of 0 ms expire
  SAGA_ASSERT_OK(s->claim_expired("w2", 60'000, 1, claimed));
  expect_one_transaction("claim_expired",
                         [&] { return s->claim_expired("w2", 60'000, 100, claimed); });
  EXPECT_EQ(claimed.size(), 49U);
}

TEST(PgStore, NulBytesAreRefusedNotTruncated) {
  auto s = fresh_database("nul_bytes").store;
  ASSERT_NE(s, nullptr);
  TransferSpec t = spec("t-1");
  static constexpr char kWithNul[] = "{\"a\":\"x\0y\"}";
  t.metadata = std::string(kWithNul, sizeof kWithNul - 1);
  ASSERT_EQ(t.metadata.size(), 11U);
  InsertResult r = InsertResult::inserted;
  const Status st = insert_one(*s, t, "w1", 1000, r);
  EXPECT_EQ(st.kind(), ErrorKind::fatal) << st.message();
  std::optional<TransferDoc> d;
  SAGA_ASSERT_OK(s->load_transfer("t-1", d));
  EXPECT_FALSE(d.has_value());
}

TEST(PgStore, ScanCallbacksCannotReenterTheStore) {
  auto s = fresh_database("reentry").store;
  ASSERT_NE(s, nullptr);
  const Account a{"acct-a", 1, 1, 0, "", false};
  SAGA_ASSERT_OK(s->create_accounts(std::span(&a, 1)));
  Status inner;
  SAGA_ASSERT_OK(s->scan_accounts([&](const Account& acc) {
    std::optional<Account> again;
    inner = s->load_account(acc.id, again);
  }));
  EXPECT_EQ(inner.kind(), ErrorKind::fatal);
  EXPECT_TRUE(contains(inner.message(), "scan callback")) << inner.message();
  // A throwing callback leaves the connection usable.
  EXPECT_THROW(s->scan_accounts([](const Account&) { throw std::runtime_error("boom"); }).ignore(),
               std::runtime_error);
  std::optional<Account> loaded;
  SAGA_ASSERT_OK(s->load_account("acct-a", loaded));
  EXPECT_TRUE(loaded.has_value());
}

// The same seeded sequence of batches on PostgreSQL and on SQLite: every
// per-record result, balance, posting and pending entry must agree.
TEST(PgStore, AgreesWithTheSqliteBackendOnRandomBatches) {
  auto pg = fresh_database("versus_sqlite").store;
  TempDir dir("sagapool-versus");
  auto lite = open_initialised("sqlite:" + (dir / "store.db").string());
  ASSERT_NE(pg, nullptr);
  ASSERT_NE(lite, nullptr);
  std::vector<Account> accounts = {
      {"v0", 5000, 5000, 0, "", false}, {"v1", 100, 100, -250, "EUR", false},
      {"v2", 0, 0, 0, "USD", false},    {"v3", 9'000'000'000'000'000'000, 0, 0, "", false},
      {"v4", 300, 300, 0, "EUR", true},
  };
  SAGA_ASSERT_OK(pg->create_accounts(accounts));
  SAGA_ASSERT_OK(lite->create_accounts(accounts));
  const std::vector<std::string> account_ids = {"v0", "v1", "v2", "v3", "v4", "ghost"};
  const std::vector<std::string> currencies = {"", "EUR", "USD"};

  std::mt19937 rng(4242);
  for (int round = 0; round < 30; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    // Transfers: a few new ids, some repeated (duplicates) or changed (conflicts).
    std::vector<TransferSpec> specs;
    for (int i = 0; i < 6; ++i) {
      TransferSpec t = spec("x-" + std::to_string(rng() % 60));
      t.amount = 1 + static_cast<std::int64_t>(rng() % 3);
      specs.push_back(t);
    }
    std::vector<NewTransfer> batch;
    for (const auto& t : specs) batch.push_back(t.to_new());
    std::vector<InsertResult> r1(batch.size()), r2(batch.size());
    SAGA_ASSERT_OK(pg->insert_transfers(batch, "w1", 60'000, r1));
    SAGA_ASSERT_OK(lite->insert_transfers(batch, "w1", 60'000, r2));
    EXPECT_EQ(r1, r2);

    const std::size_t size = 1 + rng() % 30;
    std::vector<std::string> transfer_ids;  // the legs view into these
    std::vector<LegRequest> legs;
    for (std::size_t i = 0; i < size; ++i)
      transfer_ids.push_back("x-" + std::to_string(rng() % 50));
    for (std::size_t i = 0; i < size; ++i) {
      const LegOp op = leg_op_for_roll(rng() % 100);
      // A transfer always moves one amount; every tenth is huge, so the edge
      // accounts overflow or run out.
      const auto t = std::hash<std::string>{}(transfer_ids[i]) % 1000;
      const std::int64_t amount =
          t % 10 == 0 ? 500'000'000'000'000'000 : static_cast<std::int64_t>(1 + t % 700);
      legs.push_back({op, transfer_ids[i], account_ids[rng() % account_ids.size()], amount,
                      currencies[rng() % currencies.size()]});
    }
    std::vector<LegResult> l1(legs.size()), l2(legs.size());
    SAGA_ASSERT_OK(pg->apply_legs(legs, l1));
    SAGA_ASSERT_OK(lite->apply_legs(legs, l2));
    for (std::size_t i = 0; i < legs.size(); ++i) {
      EXPECT_EQ(l1[i].status, l2[i].status) << "leg " << i;
      EXPECT_EQ(l1[i].reason, l2[i].reason) << "leg " << i;
      EXPECT_EQ(l1[i].account_currency, l2[i].account_currency) << "leg " << i;
    }
  }
  const auto ledger = [](Store& s) {
    std::map<std::string, std::int64_t> balances;
    std::set<std::tuple<std::string, std::string, PostingKind, std::int64_t>> postings;
    std::set<std::pair<std::string, std::string>> pending;
    EXPECT_TRUE(s.scan_accounts([&](const Account& a) { balances[a.id] = a.balance; }).is_ok());
    EXPECT_TRUE(s.scan_postings([&](const Posting& p) {
                   postings.emplace(p.transfer_id, p.account_id, p.kind, p.amount);
                 }).is_ok());
    EXPECT_TRUE(s.scan_pending([&](const PendingEntry& e) {
                   pending.emplace(e.account_id, e.transfer_id);
                 }).is_ok());
    return std::make_tuple(balances, postings, pending);
  };
  const auto a = ledger(*pg);
  const auto b = ledger(*lite);
  EXPECT_EQ(std::get<0>(a), std::get<0>(b));
  EXPECT_EQ(std::get<1>(a), std::get<1>(b));
  EXPECT_EQ(std::get<2>(a), std::get<2>(b));
  EXPECT_GT(std::get<1>(a).size(), 30U);
}


// ---- batch transactions (scopes) -------------------------------------------

Account scope_account(const std::string& id, std::int64_t balance) {
  return Account{id, balance, balance, 0, "", false};
}

std::int64_t pg_balance(Store& s, const std::string& id) {
  std::optional<Account> a;
  EXPECT_TRUE(s.load_account(id, a).is_ok());
  return a ? a->balance : -1;
}

// A scope is one transaction: every call inside it takes no transaction
// id of its own, and other sessions see nothing until the commit.
TEST(PgStore, AScopeIsOneTransactionInvisibleUntilCommitted) {
  auto [server, db, s] = fresh_database("scope_one_tx");
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->supports_scope());
  const Account accounts[] = {scope_account("a", 1000), scope_account("b", 0)};
  SAGA_ASSERT_OK(s->create_accounts(accounts));
  const long long before = current_xid(server, db);
  SAGA_ASSERT_OK(s->begin_scope());
  InsertResult inserted{};
  SAGA_ASSERT_OK(insert_one(*s, spec("t-1", "a", "b", 300), "w1", 60'000, inserted));
  ASSERT_EQ(inserted, InsertResult::inserted);
  const LegRequest legs[] = {{LegOp::debit, "t-1", "a", 300, ""}, {LegOp::credit, "t-1", "b", 300, ""}};
  LegResult results[2];
  SAGA_ASSERT_OK(s->apply_legs(legs, results));
  EXPECT_EQ(results[0].status, LegStatus::posted);
  EXPECT_EQ(results[1].status, LegStatus::posted);
  const Transition done{"t-1", TransferState::initial, TransferState::done, Reason::none, "w1", 1};
  std::uint8_t applied = 0;
  SAGA_ASSERT_OK(s->transition(std::span(&done, 1), 60'000, std::span(&applied, 1)));
  EXPECT_EQ(applied, 1);
  // Not visible outside the scope yet.
  EXPECT_EQ(psql_value(server, db, "SELECT count(*) FROM saga_transfers"), "0");
  EXPECT_EQ(psql_value(server, db, "SELECT balance FROM saga_accounts WHERE id = 'a'"), "1000");
  SAGA_ASSERT_OK(s->end_scope(true));
  // One id for the whole scope, one for psql's own read of the counter.
  EXPECT_EQ(current_xid(server, db), before + 2);
  EXPECT_EQ(psql_value(server, db, "SELECT state FROM saga_transfers"), "done");
  EXPECT_EQ(pg_balance(*s, "a"), 700);
  EXPECT_EQ(pg_balance(*s, "b"), 300);
}

// Leases are measured on the clock when they are written, not at the start
// of a long batch transaction (clock_timestamp(), not now()).
TEST(PgStore, LeasesInsideALongScopeUseTheCurrentClock) {
  auto s = fresh_database("scope_clock").store;
  ASSERT_NE(s, nullptr);
  std::int64_t start = 0;
  SAGA_ASSERT_OK(s->begin_scope());
  SAGA_ASSERT_OK(s->now_ms(start));
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  InsertResult inserted{};
  SAGA_ASSERT_OK(insert_one(*s, spec("t-1"), "w1", 5'000, inserted));
  std::optional<TransferDoc> d;
  SAGA_ASSERT_OK(s->load_transfer("t-1", d));
  SAGA_ASSERT_OK(s->end_scope(true));
  ASSERT_TRUE(d.has_value());
  EXPECT_GE(d->created_at_ms, start + 1000);
  EXPECT_EQ(d->lease_until_ms, d->created_at_ms + 5'000);
}

// Transfers inserted in a scope are written behind: one finished in it is
// written once, in its final state (the first row version of a fresh table:
// ctid (0,1)), not inserted as `initial` and then updated; one left as
// inserted is written at the commit as insert_transfers would have stored it.
TEST(PgStore, ATransferInsertedAndFinishedInOneScopeIsWrittenOnce) {
  auto [server, db, s] = fresh_database("written_once");
  ASSERT_NE(s, nullptr);
  SAGA_ASSERT_OK(s->begin_scope());
  InsertResult inserted{};
  SAGA_ASSERT_OK(insert_one(*s, spec("t-done"), "w1", 5'000, inserted));
  EXPECT_EQ(inserted, InsertResult::inserted);
  SAGA_ASSERT_OK(insert_one(*s, spec("t-left"), "w1", 5'000, inserted));
  SAGA_ASSERT_OK(insert_one(*s, spec("t-done"), "w1", 5'000, inserted));
  EXPECT_EQ(inserted, InsertResult::duplicate);  // named twice in one scope
  const Transition finish{"t-done", TransferState::initial, TransferState::done, Reason::none, "w1", 1};
  std::uint8_t applied = 0;
  std::int64_t at_ms = 0;
  SAGA_ASSERT_OK(s->transition(std::span(&finish, 1), 5'000, std::span(&applied, 1), &at_ms));
  EXPECT_EQ(applied, 1);
  SAGA_ASSERT_OK(s->end_scope(true));

  EXPECT_EQ(psql_value(server, db, "SELECT ctid FROM saga_transfers WHERE id = 't-done'"), "(0,1)");
  std::optional<TransferDoc> done, left;
  SAGA_ASSERT_OK(s->load_transfer("t-done", done));
  SAGA_ASSERT_OK(s->load_transfer("t-left", left));
  ASSERT_TRUE(done && left);
  EXPECT_EQ(done->state, TransferState::done);
  EXPECT_EQ(done->finished_at_ms, at_ms);
  EXPECT_EQ(done->lease_until_ms, at_ms + 5'000);
  EXPECT_FALSE(done->notified);
  EXPECT_EQ(done->epoch, 1);
  EXPECT_EQ(left->state, TransferState::initial);
  EXPECT_EQ(left->lease_until_ms, left->created_at_ms + 5'000);
  EXPECT_EQ(left->owner, "w1");
}

// Finished in a batch on a store whose floor is 6: one outbox row lists the
// batch's finished transfers, and their rows are written once, flagged, yet
// read as unpublished (documents, audit scan, gauges) until the outcomes
// are marked; a partial mark shrinks the row, the last one deletes it.
TEST(PgStore, FinishedBatchesAreListedInTheOutboxUntilTheirOutcomesAreMarked) {
  auto [server, db, s] = fresh_database("outbox");
  ASSERT_NE(s, nullptr);
  SAGA_ASSERT_OK(s->begin_scope());
  InsertResult inserted{};
  for (const char* id : {"t-a", "t-b", "t-c", "t-open"}) {
    SAGA_ASSERT_OK(insert_one(*s, spec(id), "w1", 60'000, inserted));
  }
  const Transition finish[] = {
      {"t-a", TransferState::initial, TransferState::done, Reason::none, "w1", 1},
      {"t-b", TransferState::initial, TransferState::done, Reason::none, "w1", 1},
      {"t-c", TransferState::initial, TransferState::canceled, Reason::insufficient_funds, "w1", 1},
  };
  std::uint8_t applied[3] = {};
  std::int64_t at_ms = 0;
  SAGA_ASSERT_OK(s->transition(finish, 60'000, applied, &at_ms));
  SAGA_ASSERT_OK(s->end_scope(true));

  EXPECT_EQ(psql_value(server, db, "SELECT array_to_string(done, ',') || '/' || array_to_string(canceled, ',') "
                                   "|| '/' || (finished_at_ms = " + std::to_string(at_ms) + ") FROM saga_outbox"),
            "t-a,t-b/t-c/true");
  EXPECT_EQ(psql_value(server, db, "SELECT string_agg(id || ':' || notified || ':' || ctid, ',' ORDER BY id) "
                                   "FROM saga_transfers WHERE id <> 't-open'"),
            "t-a:true:(0,1),t-b:true:(0,2),t-c:true:(0,3)");
  const auto unpublished = [&] { return unpublished_ids(*s); };
  const auto gauges = [&] { return unpublished_counts(*s, at_ms); };  // t-open still initial
  std::optional<TransferDoc> doc;
  SAGA_ASSERT_OK(s->load_transfer("t-b", doc));
  ASSERT_TRUE(doc);
  EXPECT_FALSE(doc->notified);
  EXPECT_EQ(unpublished(), "t-a,t-b,t-c,");
  EXPECT_EQ(gauges(), "2/1");

  // Marked across two calls, as delivery reports come; an id twice, one
  // never finished and one unknown change nothing.
  SAGA_ASSERT_OK(s->mark_notified(std::vector<std::string_view>{"t-b", "t-open", "t-b", "t-none"}));
  EXPECT_EQ(psql_value(server, db, "SELECT array_to_string(done, ',') || '/' || array_to_string(canceled, ',') "
                                   "FROM saga_outbox"),
            "t-a/t-c");
  SAGA_ASSERT_OK(s->load_transfer("t-b", doc));
  EXPECT_TRUE(doc->notified);
  EXPECT_EQ(unpublished(), "t-a,t-c,");
  EXPECT_EQ(gauges(), "1/1");
  SAGA_ASSERT_OK(s->mark_notified(std::vector<std::string_view>{"t-c", "t-a"}));
  EXPECT_EQ(psql_value(server, db, "SELECT count(*) FROM saga_outbox"), "0");
  EXPECT_EQ(unpublished(), "");
  EXPECT_EQ(gauges(), "0/0");
  // The flags were never written again: each row is still its first version.
  EXPECT_EQ(psql_value(server, db, "SELECT string_agg(ctid::text, ',' ORDER BY id) FROM saga_transfers "
                                   "WHERE id <> 't-open'"),
            "(0,1),(0,2),(0,3)");
}

// A worker that stopped before its outcomes were delivered leaves its outbox
// row: once the row's lease ends, recovery claims those transfers like any
// unpublished one (epoch and attempts up, its own lease), and the outcomes
// are then marked on their rows. The stopped worker's late mark is harmless.
TEST(PgStore, RecoveryClaimsTheTransfersOfAnOutboxRowWhoseLeaseEnded) {
  auto [server, db, s] = fresh_database("outbox_recovery");
  ASSERT_NE(s, nullptr);
  SAGA_ASSERT_OK(s->begin_scope());
  InsertResult inserted{};
  std::vector<Transition> finish;
  for (const char* id : {"t-1", "t-2"}) {
    SAGA_ASSERT_OK(insert_one(*s, spec(id), "w1", 300, inserted));
    finish.push_back({id, TransferState::initial, TransferState::done, Reason::none, "w1", 1});
  }
  std::vector<std::uint8_t> applied(finish.size());
  SAGA_ASSERT_OK(s->transition(finish, 300, applied, nullptr));
  SAGA_ASSERT_OK(s->end_scope(true));
  std::vector<TransferDoc> claimed;
  SAGA_ASSERT_OK(s->claim_expired("w2", 60'000, 10, claimed));
  EXPECT_TRUE(claimed.empty());  // the lease has not ended
  EXPECT_EQ(psql_value(server, db, "SELECT count(*) FROM saga_outbox"), "1");

  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  SAGA_ASSERT_OK(s->claim_expired("w2", 60'000, 1, claimed));
  ASSERT_EQ(claimed.size(), 1u);  // the limit holds; the other waits for the next call
  EXPECT_EQ(psql_value(server, db, "SELECT count(*) FROM saga_outbox"), "0");
  std::vector<TransferDoc> rest;
  SAGA_ASSERT_OK(s->claim_expired("w2", 60'000, 10, rest));
  ASSERT_EQ(rest.size(), 1u);
  claimed.push_back(rest.front());
  expect_reclaimed(claimed, {"t-1", "t-2"}, "w2");
  SAGA_ASSERT_OK(s->mark_notified(std::vector<std::string_view>{"t-1"}));  // the stopped worker, late
  SAGA_ASSERT_OK(s->mark_notified(std::vector<std::string_view>{"t-1", "t-2"}));  // the recovering one
  EXPECT_EQ(psql_value(server, db, "SELECT count(*) FROM saga_transfers WHERE NOT notified"), "0");
  SAGA_ASSERT_OK(s->claim_expired("w3", 60'000, 10, claimed));
  EXPECT_TRUE(claimed.empty());
}

// Until the floor is 6, builds that read only the flags may run on the
// store (a rolling upgrade between expand and contract): a finished batch
// leaves its flags false and the outbox empty. A store sees the contract
// before its next batch, once the floor is read again.
TEST(PgStore, TheOutboxIsWrittenOnlyOnceTheFloorIsSix) {
  auto [server, db, s] = fresh_database("outbox_floor");
  ASSERT_NE(s, nullptr);
  psql_value(server, db, "UPDATE saga_meta SET schema_version = 5");
  std::unique_ptr<Store> worker;
  SAGA_ASSERT_OK(open_store(server.url(db), worker));
  const auto finish_one = [&](const char* id) {
    SAGA_ASSERT_OK(worker->begin_scope());
    InsertResult inserted{};
    SAGA_ASSERT_OK(insert_one(*worker, spec(id), "w1", 5'000, inserted));
    const Transition t{id, TransferState::initial, TransferState::done, Reason::none, "w1", 1};
    std::uint8_t applied = 0;
    SAGA_ASSERT_OK(worker->transition(std::span(&t, 1), 5'000, std::span(&applied, 1), nullptr));
    SAGA_ASSERT_OK(worker->end_scope(true));
  };
  finish_one("t-before");
  EXPECT_EQ(psql_value(server, db, "SELECT count(*) FROM saga_outbox"), "0");
  EXPECT_EQ(psql_value(server, db, "SELECT notified FROM saga_transfers WHERE id = 't-before'"), "f");
  SAGA_ASSERT_OK(s->contract_schema());
  // Read again after kFloorRecheck (10 s).
  std::this_thread::sleep_for(std::chrono::milliseconds(10'100));
  finish_one("t-after");
  EXPECT_EQ(psql_value(server, db, "SELECT array_to_string(done, ',') FROM saga_outbox"), "t-after");
  EXPECT_EQ(psql_value(server, db, "SELECT notified FROM saga_transfers WHERE id = 't-after'"), "t");
}

// Two batches take the same new transfer at once (a partition handed over
// mid-batch): the check lets both through, since neither has written it
// yet. The one that waits on the other's journal rows fails on their key
// when the other commits, as transient, not fatal; run again, it finds a
// duplicate. The money moved once.
TEST(PgStore, TwoBatchesTakingOneNewTransferMoveItsMoneyOnce) {
  auto [server, db, a] = fresh_database("racing_duplicate");
  ASSERT_NE(a, nullptr);
  std::unique_ptr<Store> b = open_initialised(server.url(db));
  ASSERT_NE(b, nullptr);
  SAGA_ASSERT_OK(a->create_accounts(std::vector<Account>{make_account("acct-a", 1000), make_account("acct-b", 0)}));
  const SettleRequest settle{"t-1", "acct-a", "acct-b", 100, ""};
  const Transition finish{"t-1", TransferState::initial, TransferState::done, Reason::none, "w1", 1};
  InsertResult inserted{};
  SettleResult result_a, result_b;
  std::uint8_t applied = 0;

  SAGA_ASSERT_OK(a->begin_scope());
  SAGA_ASSERT_OK(insert_one(*a, spec("t-1"), "w1", 5'000, inserted));
  SAGA_ASSERT_OK(a->settle_sagas(std::span(&settle, 1), std::span(&result_a, 1)));
  SAGA_ASSERT_OK(b->begin_scope());
  SAGA_ASSERT_OK(insert_one(*b, spec("t-1"), "w2", 5'000, inserted));
  EXPECT_EQ(inserted, InsertResult::inserted);  // a's is not written yet
  Status settled_b;
  std::thread waits([&] { settled_b = b->settle_sagas(std::span(&settle, 1), std::span(&result_b, 1)); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // b waits on a's postings
  SAGA_ASSERT_OK(a->transition(std::span(&finish, 1), 5'000, std::span(&applied, 1), nullptr));
  SAGA_ASSERT_OK(a->end_scope(true));
  waits.join();
  EXPECT_TRUE(settled_b.is_transient()) << settled_b.message();
  SAGA_ASSERT_OK(b->end_scope(false));

  SAGA_ASSERT_OK(b->begin_scope());
  SAGA_ASSERT_OK(insert_one(*b, spec("t-1"), "w2", 5'000, inserted));
  EXPECT_EQ(inserted, InsertResult::duplicate);
  SAGA_ASSERT_OK(b->end_scope(true));
  std::optional<Account> from, to;
  SAGA_ASSERT_OK(a->load_account("acct-a", from));
  SAGA_ASSERT_OK(a->load_account("acct-b", to));
  ASSERT_TRUE(from && to);
  EXPECT_EQ(from->balance, 900);
  EXPECT_EQ(to->balance, 100);
}

// saga_settle's UPDATE takes the accounts' row locks, so it must take them
// in one order for every batch (id order, as a_id is) or two batches could
// wait on each other: a nested loop over a_id into the primary key, on a
// ledger of 100,000 analysed accounts.
TEST(PgStore, TheSettleLocksItsAccountsInIdOrder) {
  PgServer server = plan_logging_server();
  const std::string db = "settle_lock_order";
  auto s = open_initialised(server.create_database(db));
  ASSERT_NE(s, nullptr);
  psql_value(server, db,
             "INSERT INTO saga_accounts (id, balance, opening_balance, min_balance, currency, locked) "
             "SELECT 'acct-' || g, 1000000, 1000000, 0, '', false FROM generate_series(0, 99999) AS g; "
             "ANALYZE saga_accounts");
  // SettleRequest holds views: the strings live here.
  std::vector<std::string> ids, sources, destinations;
  for (int i = 0; i < 500; ++i) {
    ids.push_back("t-" + std::to_string(i));
    sources.push_back("acct-" + std::to_string(i * 7 % 100000));
    destinations.push_back("acct-" + std::to_string(i * 13 % 100000 + 1));
  }
  std::vector<SettleRequest> batch;
  for (std::size_t i = 0; i < ids.size(); ++i) batch.push_back({ids[i], sources[i], destinations[i], 1, ""});
  std::vector<SettleResult> results(batch.size());
  SAGA_ASSERT_OK(s->begin_scope());
  SAGA_ASSERT_OK(s->settle_sagas(batch, results));
  SAGA_ASSERT_OK(s->end_scope(true));
  for (const SettleResult& r : results) ASSERT_EQ(r.outcome, TransferState::done);
  const std::string plan = logged_plan(server, "WITH checked AS (");
  ASSERT_FALSE(plan.empty()) << "auto_explain logged no plan of saga_settle's UPDATE";
  const std::size_t loop = plan.find("Nested Loop");
  const std::size_t outer = plan.find("Function Scan on x ");
  const std::size_t inner = plan.find("Index Scan using saga_accounts_pkey on saga_accounts a");
  EXPECT_NE(loop, std::string::npos) << plan;
  EXPECT_NE(inner, std::string::npos) << plan;
  EXPECT_TRUE(loop < outer && outer < inner) << plan;  // the outer side first: a_id's order
  EXPECT_FALSE(contains(plan, "Sort")) << plan;
}

// Begins a scope with these new transfers inserted and settled.
Status settle_new(Store& s, std::span<const SettleRequest> batch, std::span<SettleResult> results) {
  InsertResult inserted{};
  EXPECT_TRUE(s.begin_scope().is_ok());
  for (const SettleRequest& t : batch) {
    EXPECT_TRUE(insert_one(s, spec(std::string(t.transfer_id), std::string(t.source), std::string(t.destination),
                                   t.amount),
                           "w", 5'000, inserted)
                    .is_ok());
  }
  return s.settle_sagas(batch, results);
}

// Writes the settled transfers' outcomes and commits the scope.
Status finish_settled(Store& s, std::span<const SettleRequest> batch, std::span<const SettleResult> results) {
  std::uint8_t applied = 0;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const Transition t{std::string(batch[i].transfer_id), TransferState::initial, results[i].outcome,
                       results[i].reason, "w", 1};
    EXPECT_TRUE(s.transition(std::span(&t, 1), 5'000, std::span(&applied, 1), nullptr).is_ok());
  }
  return s.end_scope(true);
}

// saga_settle_batch walks a batch on accounts read unlocked and locks them
// last (store/postgres/sql/functions.sql). Here another batch changes acct-a
// between the two: it holds acct-a's lock, uncommitted, while t-1's batch
// walks on acct-a's committed balance, and commits before t-1's batch takes
// its locks. t-1 must come out as if it ran after the other batch, and no
// money may be made or lost. `other_from`/`other_to`: the other batch's
// transfer of `other_amount` (acct-c holds 1000). A leg refused for a
// balance makes a walk take its locks in its own call: the other batch has
// one (from acct-d, empty), so it holds its locks; t-1's batch has one too
// unless `deferred`, and then leaves its lock pass to its COMMIT, which
// fails when the walk no longer stands: the batch runs again, as a worker
// runs it.
struct SettleRace {
  SettleResult result;
  std::int64_t a = 0, b = 0, c = 0;
  std::size_t t1_postings = 0;
  bool first_commit_failed = false;
};
SettleRace settle_racing(std::int64_t opening_a, const std::string& other_from, const std::string& other_to,
                         std::int64_t other_amount, std::int64_t t1_amount, bool deferred = false) {
  SettleRace out;
  auto [server, db, walker] = fresh_database("settle_race");
  EXPECT_NE(walker, nullptr);
  if (!walker) return out;
  std::unique_ptr<Store> other = open_initialised(server.url(db));
  EXPECT_NE(other, nullptr);
  if (!other) return out;
  EXPECT_TRUE(walker->create_accounts(std::vector<Account>{make_account("acct-a", opening_a), make_account("acct-b", 0),
                                                           make_account("acct-c", 1000), make_account("acct-d", 0)})
                  .is_ok());
  const SettleRequest others[] = {{"t-other", other_from, other_to, other_amount, ""},
                                  {"t-other-refused", "acct-d", "acct-c", 1, ""}};
  SettleResult other_results[2];
  EXPECT_TRUE(settle_new(*other, others, other_results).is_ok());
  EXPECT_EQ(other_results[0].outcome, TransferState::done);
  EXPECT_EQ(other_results[1].reason, Reason::insufficient_funds);

  const SettleRequest t1s[] = {{"t-1", "acct-a", "acct-b", t1_amount, ""}, {"t-1-refused", "acct-d", "acct-c", 1, ""}};
  const std::span<const SettleRequest> t1(t1s, deferred ? 1 : 2);
  SettleResult t1_results[2];
  if (deferred) {
    // Returns while the other batch still holds acct-a: it took no lock.
    EXPECT_TRUE(settle_new(*walker, t1, t1_results).is_ok());
    EXPECT_TRUE(finish_settled(*other, others, other_results).is_ok());
  } else {
    Status settled;
    std::thread walks([&] { settled = settle_new(*walker, t1, t1_results); });
    bool waits = false;
    for (int i = 0; i < 200 && !waits; ++i) {
      waits = psql_value(server, db,
                         "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                         "AND wait_event_type = 'Lock'") == "1";
      if (!waits) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_TRUE(waits) << "t-1's batch never waited for acct-a's lock";
    EXPECT_TRUE(finish_settled(*other, others, other_results).is_ok());
    walks.join();
    EXPECT_TRUE(settled.is_ok()) << settled.message();
  }
  Status committed = finish_settled(*walker, t1, t1_results);
  if (!committed) {
    out.first_commit_failed = true;
    EXPECT_EQ(committed.kind(), ErrorKind::retry_stage) << committed.message();
    EXPECT_TRUE(settle_new(*walker, t1, t1_results).is_ok());
    committed = finish_settled(*walker, t1, t1_results);
  }
  EXPECT_TRUE(committed.is_ok()) << committed.message();
  out.result = t1_results[0];

  std::optional<Account> a, b, c;
  EXPECT_TRUE(walker->load_account("acct-a", a).is_ok());
  EXPECT_TRUE(walker->load_account("acct-b", b).is_ok());
  EXPECT_TRUE(walker->load_account("acct-c", c).is_ok());
  if (a && b && c) {
    out.a = a->balance;
    out.b = b->balance;
    out.c = c->balance;
  }
  std::vector<Posting> postings;
  EXPECT_TRUE(walker->postings_for_transfer("t-1", postings).is_ok());
  out.t1_postings = postings.size();
  return out;
}

// Deferred, t-1's lock pass waits for its COMMIT: a walk that no longer
// stands fails the commit, and the batch run again settles at once.
TEST(PgStore, AWalkOnABalanceThatFellMeanwhileRunsAgain) {
  for (const bool deferred : {false, true}) {
    SCOPED_TRACE(deferred ? "deferred" : "at once");
    // acct-a: 100, then 40 once the other batch took 60; t-1's 60 no longer fit.
    const SettleRace r = settle_racing(100, "acct-a", "acct-c", 60, 60, deferred);
    EXPECT_EQ(r.first_commit_failed, deferred);
    EXPECT_EQ(r.result.outcome, TransferState::canceled);
    EXPECT_EQ(r.result.reason, Reason::insufficient_funds);
    EXPECT_EQ(r.t1_postings, 0u);
    EXPECT_EQ(std::make_tuple(r.a, r.b, r.c), std::make_tuple(40, 0, 1060));
  }
}

TEST(PgStore, AWalkThatStillHoldsKeepsWhatAnotherBatchCommittedMeanwhile) {
  for (const bool deferred : {false, true}) {
    SCOPED_TRACE(deferred ? "deferred" : "at once");
    // acct-a: 100, then 150 once the other batch credited 50; t-1 takes 60 of it.
    const SettleRace r = settle_racing(100, "acct-c", "acct-a", 50, 60, deferred);
    EXPECT_FALSE(r.first_commit_failed);
    EXPECT_EQ(r.result.outcome, TransferState::done);
    EXPECT_EQ(r.t1_postings, 2u);
    EXPECT_EQ(std::make_tuple(r.a, r.b, r.c), std::make_tuple(90, 60, 950));
  }
}

TEST(PgStore, ARefusalForTheBalanceIsDecidedAgainWhenTheBalanceChanged) {
  // acct-a: 50, too little for t-1's 60 when walked, then 100 once credited.
  const SettleRace r = settle_racing(50, "acct-c", "acct-a", 50, 60);
  EXPECT_FALSE(r.first_commit_failed);
  EXPECT_EQ(r.result.outcome, TransferState::done);
  EXPECT_EQ(r.result.reason, Reason::none);
  EXPECT_EQ(std::make_tuple(r.a, r.b, r.c), std::make_tuple(40, 60, 950));
}

// A deferred walk's balances are moved before any later statement of its
// batch that could read them, not only at COMMIT: a read of one statement,
// and a scan.
TEST(PgStore, AReadAfterADeferredWalkSeesItsBalances) {
  auto [server, db, s] = fresh_database("settle_deferred_read");
  ASSERT_NE(s, nullptr);
  SAGA_ASSERT_OK(s->create_accounts(std::vector<Account>{make_account("acct-a", 100), make_account("acct-b", 0)}));
  InsertResult inserted{};
  const std::string ids[] = {"t-1", "t-2"};
  for (const std::string& id : ids) {
    SCOPED_TRACE(id);
    const bool scan = id == "t-2";
    const SettleRequest t{id, "acct-a", "acct-b", 30, ""};
    SettleResult result;
    SAGA_ASSERT_OK(s->begin_scope());
    SAGA_ASSERT_OK(insert_one(*s, spec(id, "acct-a", "acct-b", 30), "w1", 5'000, inserted));
    SAGA_ASSERT_OK(s->settle_sagas(std::span(&t, 1), std::span(&result, 1)));
    EXPECT_EQ(result.outcome, TransferState::done);
    std::map<std::string, std::int64_t> seen;
    if (scan) {
      SAGA_ASSERT_OK(s->scan_accounts([&](const Account& a) { seen[a.id] = a.balance; }));
    } else {
      const std::string_view names[] = {"acct-a", "acct-b"};
      std::vector<std::optional<Account>> read(2);
      SAGA_ASSERT_OK(s->load_accounts(names, read));
      ASSERT_TRUE(read[0] && read[1]);
      seen = {{"acct-a", read[0]->balance}, {"acct-b", read[1]->balance}};
    }
    EXPECT_EQ(seen["acct-a"], scan ? 40 : 70);
    EXPECT_EQ(seen["acct-b"], scan ? 60 : 30);
    SAGA_ASSERT_OK(s->end_scope(true));
  }
  EXPECT_EQ(pg_balance(*s, "acct-a"), 40);
  EXPECT_EQ(pg_balance(*s, "acct-b"), 60);
}

// Whether another session finds the account's row locked.
bool row_locked(const PgServer& server, const std::string& db, const std::string& id) {
  return server.psql(db, "SELECT id FROM saga_accounts WHERE id = '" + id + "' FOR UPDATE NOWAIT").exit_code != 0;
}

// A deferred walk holds no lock until its COMMIT. Once a batch with one
// failed, the next walk takes its locks in its own call; after that batch
// commits, walks defer again (in a temporary table the failed batch's
// rollback took away, made again).
TEST(PgStore, AfterADeferredWalkFailsTheNextBatchLocksAtOnce) {
  auto [server, db, walker] = fresh_database("settle_at_once");
  ASSERT_NE(walker, nullptr);
  std::unique_ptr<Store> other = open_initialised(server.url(db));
  ASSERT_NE(other, nullptr);
  SAGA_ASSERT_OK(walker->create_accounts(
      std::vector<Account>{make_account("acct-a", 100), make_account("acct-b", 0), make_account("acct-c", 1000)}));
  const auto settle = [](Store& s, const SettleRequest& t) {
    SettleResult result;
    SAGA_EXPECT_OK(settle_new(s, std::span(&t, 1), std::span(&result, 1)));
    EXPECT_EQ(result.outcome, TransferState::done);
    return result;
  };
  const auto commit = [](Store& s, const SettleRequest& t, const SettleResult& r) {
    return finish_settled(s, std::span(&t, 1), std::span(&r, 1));
  };

  const SettleRequest t1{"t-1", "acct-a", "acct-b", 60, ""};
  const SettleResult r1 = settle(*walker, t1);
  EXPECT_FALSE(row_locked(server, db, "acct-a"));
  const SettleRequest other_t{"t-other", "acct-a", "acct-c", 60, ""};
  SAGA_EXPECT_OK(commit(*other, other_t, settle(*other, other_t)));
  const Status failed = commit(*walker, t1, r1);  // acct-a holds 40
  EXPECT_EQ(failed.kind(), ErrorKind::retry_stage) << failed.message();

  const SettleRequest t2{"t-2", "acct-c", "acct-b", 10, ""};
  const SettleResult r2 = settle(*walker, t2);
  EXPECT_TRUE(row_locked(server, db, "acct-c"));
  SAGA_EXPECT_OK(commit(*walker, t2, r2));

  const SettleRequest t3{"t-3", "acct-c", "acct-b", 10, ""};
  const SettleResult r3 = settle(*walker, t3);
  EXPECT_FALSE(row_locked(server, db, "acct-c"));
  SAGA_EXPECT_OK(commit(*walker, t3, r3));

  EXPECT_EQ(pg_balance(*walker, "acct-a"), 40);
  EXPECT_EQ(pg_balance(*walker, "acct-b"), 20);
  EXPECT_EQ(pg_balance(*walker, "acct-c"), 1040);
  EXPECT_EQ(psql_value(server, db, "SELECT count(*) FROM saga_postings WHERE transfer_id = 't-1'"), "0");
}

// The database refuses to commit a deferred walk whose lock pass never ran
// (a caller that skipped saga_settle_apply): its journal would commit with
// balances never moved.
TEST(PgStore, ADeferredWalkNeverAppliedCannotCommit) {
  auto [server, db, s] = fresh_database("settle_never_applied");
  ASSERT_NE(s, nullptr);
  SAGA_ASSERT_OK(s->create_accounts(std::vector<Account>{make_account("acct-a", 100), make_account("acct-b", 0)}));
  const RunResult r = server.psql(
      db, "BEGIN; SELECT * FROM saga_settle_batch(ARRAY['t-1'], ARRAY['acct-a'], ARRAY['acct-b'], "
          "ARRAY[60::bigint], ARRAY[''], true); COMMIT;");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "a deferred settle was never applied")) << r.output;
  EXPECT_EQ(pg_balance(*s, "acct-a"), 100);
  EXPECT_EQ(psql_value(server, db, "SELECT count(*) FROM saga_postings"), "0");
}

// A connection lost inside a scope: that call and every later one fail as
// transient without running anywhere (never outside the transaction), the
// scope cannot commit, nothing of it is stored, and the store reconnects
// for the next batch.
TEST(PgStore, AConnectionLostInsideAScopeFailsTheWholeBatch) {
  auto [server, db, s] = fresh_database("scope_lost");
  ASSERT_NE(s, nullptr);
  const Account accounts[] = {scope_account("a", 1000), scope_account("b", 0)};
  SAGA_ASSERT_OK(s->create_accounts(accounts));
  for (const bool try_commit : {false, true}) {
    SCOPED_TRACE(try_commit ? "end_scope(true)" : "end_scope(false)");
    SAGA_ASSERT_OK(s->begin_scope());
    const LegRequest debit{LegOp::debit, try_commit ? "t-2" : "t-1", "a", 100, ""};
    LegResult r;
    SAGA_ASSERT_OK(s->apply_legs(std::span(&debit, 1), std::span(&r, 1)));
    EXPECT_EQ(r.status, LegStatus::posted);
    ASSERT_EQ(server.psql(db, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                              "datname = current_database() AND pid <> pg_backend_pid()")
                  .exit_code,
              0);
    const LegRequest credit{LegOp::credit, debit.transfer_id, "b", 100, ""};
    Status st = s->apply_legs(std::span(&credit, 1), std::span(&r, 1));
    EXPECT_EQ(st.kind(), ErrorKind::retry_stage) << st.message();
    st = s->apply_legs(std::span(&credit, 1), std::span(&r, 1));
    EXPECT_EQ(st.kind(), ErrorKind::retry_stage) << st.message();
    st = s->end_scope(try_commit);
    if (try_commit) {
      EXPECT_TRUE(st.is_transient()) << st.message();
    } else {
      SAGA_EXPECT_OK(st);
    }
    EXPECT_EQ(pg_balance(*s, "a"), 1000);  // reconnected; nothing was committed
    EXPECT_EQ(pg_balance(*s, "b"), 0);
    EXPECT_EQ(psql_value(server, db, "SELECT count(*) FROM saga_postings"), "0");
  }
}

// A statement that fails inside a scope aborts the transaction: later calls
// fail at once (not as "current transaction is aborted", which would read as
// fatal), the scope cannot commit, and after end_scope(false) the store is
// usable and the first part of the batch is gone.
TEST(PgStore, AFailedCallInsideAScopeFailsTheLaterCallsAndTheCommit) {
  auto [server, db, s] = fresh_database("scope_failed");
  ASSERT_NE(s, nullptr);
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  const Account accounts[] = {scope_account("a", 1000), scope_account("b", 0),
                              scope_account("c", kMax - 50)};
  SAGA_ASSERT_OK(s->create_accounts(accounts));
  SAGA_ASSERT_OK(s->begin_scope());
  const LegRequest debit{LegOp::debit, "t-1", "a", 100, ""};
  LegResult r;
  SAGA_ASSERT_OK(s->apply_legs(std::span(&debit, 1), std::span(&r, 1)));
  // A server-side error: reversing a debit of an account credited to the
  // brim since raises (an exception in saga_apply_legs). The debit's
  // reservation prevents that, unless its entry was released first, which
  // the engine never does.
  const LegRequest brim[] = {{LegOp::debit, "t-2", "c", 100, ""},
                             {LegOp::release, "t-2", "c", 100, ""},
                             {LegOp::credit, "t-3", "c", 150, ""}};
  LegResult brim_results[3];
  SAGA_ASSERT_OK(s->apply_legs(brim, brim_results));
  ASSERT_EQ(brim_results[2].status, LegStatus::posted);
  const LegRequest reverse{LegOp::cancel_debit, "t-2", "c", 100, ""};
  Status st = s->apply_legs(std::span(&reverse, 1), std::span(&r, 1));
  EXPECT_FALSE(st.is_ok());
  EXPECT_TRUE(contains(st.message(), "overflow")) << st.message();
  st = s->apply_legs(std::span(&debit, 1), std::span(&r, 1));
  EXPECT_EQ(st.kind(), ErrorKind::retry_stage) << st.message();
  st = s->end_scope(true);
  EXPECT_EQ(st.kind(), ErrorKind::retry_stage) << st.message();
  EXPECT_EQ(pg_balance(*s, "a"), 1000);
  // The same batch again commits as if for the first time.
  SAGA_ASSERT_OK(s->begin_scope());
  SAGA_ASSERT_OK(s->apply_legs(std::span(&debit, 1), std::span(&r, 1)));
  EXPECT_EQ(r.status, LegStatus::posted);
  SAGA_ASSERT_OK(s->end_scope(true));
  EXPECT_EQ(pg_balance(*s, "a"), 900);
}

// An account's history (`sagactl accounts show`) is found through the
// batches that posted to it (migrations/0009_batch_links.sql), in the order
// they locked it. Two stores settle overlapping batches at once on accounts
// that hold little, so walks run deferred, again on locked rows, and with
// refusals for the balance. Each account's history must be exactly its
// postings, and replayed from the oldest it must move the balance as the
// walks did: never below the minimum after a debit, ending at the balance.
TEST(PgStore, AnAccountsHistoryIsItsPostingsInTheOrderTheyMovedItsBalance) {
  auto [server, db, a] = fresh_database("history_order");
  ASSERT_NE(a, nullptr);
  std::unique_ptr<Store> b = open_initialised(server.url(db));
  ASSERT_NE(b, nullptr);
  constexpr int kAccounts = 6;
  constexpr std::int64_t kOpening = 100;
  std::vector<Account> accounts;
  for (int i = 0; i < kAccounts; ++i) accounts.push_back(make_account("acct-" + std::to_string(i), kOpening));
  SAGA_ASSERT_OK(a->create_accounts(accounts));
  std::atomic<int> retried{0}, refused{0};
  const auto work = [&](Store& s, int worker) {
    std::mt19937 rng(static_cast<unsigned>(worker));
    for (int batch = 0; batch < 150; ++batch) {
      std::vector<std::string> ids, from, to;
      for (int i = 0; i < 20; ++i) {
        const int src = static_cast<int>(rng() % kAccounts);
        ids.push_back("w" + std::to_string(worker) + "-" + std::to_string(batch) + "-" + std::to_string(i));
        from.push_back("acct-" + std::to_string(src));
        to.push_back("acct-" + std::to_string((src + 1 + static_cast<int>(rng() % (kAccounts - 1))) % kAccounts));
      }
      std::vector<SettleRequest> requests;
      for (std::size_t i = 0; i < ids.size(); ++i) {
        requests.push_back({ids[i], from[i], to[i], static_cast<std::int64_t>(1 + rng() % 60), ""});
      }
      std::vector<SettleResult> results(requests.size());
      for (;;) {
        Status st = settle_new(s, requests, results);
        if (!st.is_ok()) (void)s.end_scope(false);
        else st = finish_settled(s, requests, results);
        if (st.is_ok()) break;
        if (!st.is_transient() && st.kind() != ErrorKind::retry_stage) {
          ADD_FAILURE() << st.message();
          return;
        }
        ++retried;
      }
      for (const SettleResult& r : results) refused += r.reason == Reason::insufficient_funds ? 1 : 0;
    }
  };
  std::thread other([&] { work(*b, 2); });
  work(*a, 1);
  other.join();
  std::cout << "batches run again: " << retried << ", transfers refused for the balance: " << refused << "\n";
  EXPECT_GT(refused.load(), 0);  // the accounts hold little, as meant

  std::map<std::string, std::multiset<std::string>> scanned;
  SAGA_ASSERT_OK(a->scan_postings([&](const Posting& p) {
    scanned[p.account_id].insert(p.transfer_id + "/" + std::string(to_string(p.kind)));
  }));
  for (const Account& account : accounts) {
    SCOPED_TRACE(account.id);
    std::vector<Posting> history;
    SAGA_ASSERT_OK(a->postings_for_account(account.id, 100'000, history));
    std::multiset<std::string> got;
    for (const Posting& p : history) got.insert(p.transfer_id + "/" + std::string(to_string(p.kind)));
    EXPECT_EQ(got, scanned[account.id]);
    std::int64_t balance = kOpening;
    std::for_each(history.rbegin(), history.rend(), [&](const Posting& p) {
      balance += signed_amount(p.kind, p.amount);
      if (p.kind == PostingKind::debit) EXPECT_GE(balance, 0) << p.transfer_id;
    });
    EXPECT_EQ(balance, pg_balance(*a, account.id));
  }
  // Every batch's link row names each account once, and an account's
  // batches chain back without a fork: no two of its links name the same
  // batch before.
  EXPECT_EQ(psql_value(server, db,
                       "SELECT count(*) FROM (SELECT l.batch, u.acc FROM saga_batch_links l, "
                       "unnest(l.accounts) u(acc) GROUP BY 1, 2 HAVING count(*) > 1) d"),
            "0");
  EXPECT_EQ(psql_value(server, db,
                       "SELECT count(*) FROM (SELECT u.acc, u.prev FROM saga_batch_links l, "
                       "unnest(l.accounts, l.prevs) u(acc, prev) GROUP BY 1, 2 HAVING count(*) > 1) d"),
            "0");
  EXPECT_EQ(psql_value(server, db, "SELECT count(*) FROM saga_postings WHERE batch IS NULL"), "0");
}

// A deferred walk writes its postings before it locks (at COMMIT): here
// t-1's batch walks first, t-2's walks, locks and commits meanwhile, and
// then t-1's locks. acct-a's balance moved by t-2 first, so its history,
// newest first, gives t-1 first, though t-1's posting was written earlier.
TEST(PgStore, AnAccountsHistoryFollowsTheOrderItsBatchesLockedIt) {
  auto [server, db, walker] = fresh_database("history_lock_order");
  ASSERT_NE(walker, nullptr);
  std::unique_ptr<Store> other = open_initialised(server.url(db));
  ASSERT_NE(other, nullptr);
  SAGA_ASSERT_OK(walker->create_accounts(
      std::vector<Account>{make_account("acct-a", 100), make_account("acct-b", 0), make_account("acct-c", 1000)}));
  const SettleRequest t1{"t-1", "acct-a", "acct-b", 60, ""};
  const SettleRequest t2{"t-2", "acct-c", "acct-a", 50, ""};
  SettleResult r1, r2;
  SAGA_ASSERT_OK(settle_new(*walker, std::span(&t1, 1), std::span(&r1, 1)));
  EXPECT_FALSE(row_locked(server, db, "acct-a"));  // deferred: no lock yet
  SAGA_ASSERT_OK(settle_new(*other, std::span(&t2, 1), std::span(&r2, 1)));
  SAGA_ASSERT_OK(finish_settled(*other, std::span(&t2, 1), std::span(&r2, 1)));
  SAGA_ASSERT_OK(finish_settled(*walker, std::span(&t1, 1), std::span(&r1, 1)));
  std::vector<Posting> history;
  SAGA_ASSERT_OK(walker->postings_for_account("acct-a", 10, history));
  std::vector<std::string> got;
  for (const Posting& p : history) got.push_back(p.transfer_id + "/" + std::string(to_string(p.kind)));
  EXPECT_EQ(got, (std::vector<std::string>{"t-1/debit", "t-2/credit"}));
  EXPECT_EQ(pg_balance(*walker, "acct-a"), 90);
}

// Postings from before version 9 have no batch: an account's history gives
// them after its batches' postings, newest first, through their own index.
TEST(PgStore, PostingsFromBeforeBatchesComeAfterTheBatchedOnes) {
  auto [server, db, s] = fresh_database("history_unbatched");
  ASSERT_NE(s, nullptr);
  SAGA_ASSERT_OK(s->create_accounts(std::vector<Account>{make_account("acct-a", 1000), make_account("acct-b", 0)}));
  psql_value(server, db,
             "INSERT INTO saga_postings (transfer_id, account_id, kind, amount, at_ms) VALUES "
             "('old-1', 'acct-a', 'debit', 5, 1), ('old-2', 'acct-a', 'debit', 7, 2)");
  const SettleRequest t{"t-1", "acct-a", "acct-b", 10, ""};
  SettleResult result;
  SAGA_ASSERT_OK(settle_new(*s, std::span(&t, 1), std::span(&result, 1)));
  SAGA_ASSERT_OK(finish_settled(*s, std::span(&t, 1), std::span(&result, 1)));
  const auto recent = [&](std::size_t limit) {
    std::vector<Posting> postings;
    EXPECT_TRUE(s->postings_for_account("acct-a", limit, postings).is_ok());
    std::vector<std::string> out;
    for (const Posting& p : postings) out.push_back(p.transfer_id);
    return out;
  };
  EXPECT_EQ(recent(10), (std::vector<std::string>{"t-1", "old-2", "old-1"}));
  EXPECT_EQ(recent(2), (std::vector<std::string>{"t-1", "old-2"}));
  EXPECT_EQ(recent(1), (std::vector<std::string>{"t-1"}));
  EXPECT_EQ(psql_value(server, db, "SELECT to_regclass('saga_postings_account') IS NULL"), "t");
}

}  // namespace
}  // namespace sagapool::test
