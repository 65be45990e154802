// saga-worker end to end on PostgreSQL: a real Kafka node, two shards on two
// throwaway servers, three workers; cross-shard transfers, overdrafts and
// unknown accounts; the round trips of one batch; and how the programs meet
// a bad configuration.
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <span>
#include <string>
#include <thread>

#include "ledger_cluster.hpp"
#include "sagapool/saga_engine.hpp"

namespace sagapool::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

TEST(PostgresE2E, TwoShardsThreeWorkersEveryIdOneOutcome) {
  LedgerCluster cluster(2, 400);
  const auto transfers = cluster.plan(8000, 1);
  // Half of the ordinary transfers cross shards, so every stage runs on both.
  EXPECT_GT(cluster.cross_shard(transfers), transfers.size() / 3);

  std::vector<Process> workers;
  for (int i = 0; i < 3; ++i) workers.push_back(cluster.start_worker("w" + std::to_string(i)));
  const auto started = Clock::now();
  std::thread producer = cluster.produce_paced(transfers, 1000, 100ms);
  producer.join();
  ASSERT_TRUE(cluster.wait_finished(transfers.size(), 75s))
      << read_file(cluster.log_of("w0")).substr(0, 4000);
  std::cout << transfers.size() << " transfers finished in " << seconds_since(started) << " s\n";

  for (Process& w : workers) EXPECT_EQ(w.stop(20s), 0);
  cluster.expect_outcomes(transfers);
  cluster.expect_balances(transfers);
  cluster.expect_audit_passes();
}

// ---- round trips -------------------------------------------------------------

// One batch through the saga engine on two shards, counted by the server
// (pg_stat_statements): one statement, so one round trip and one
// transaction, per stage per shard, whatever the batch's size.
TEST(PostgresE2E, OneRoundTripPerStagePerShard) {
  PgServer server({"shared_preload_libraries=pg_stat_statements"});
  std::vector<std::string> urls;
  for (const char* db : {"shard1", "shard2"}) {
    urls.push_back(server.create_database(db));
    ASSERT_EQ(server.psql(db, "CREATE EXTENSION pg_stat_statements").exit_code, 0);
  }
  std::unique_ptr<Ledger> ledger;
  ASSERT_TRUE(Ledger::open(urls, ledger).is_ok());
  ASSERT_TRUE(ledger->init().is_ok());

  // 400 accounts; transfer i moves between accounts no other transfer
  // touches (one wave). Every tenth overdraws and every tenth names an
  // unknown destination, from sources on both shards: both compensate.
  constexpr int kTransfers = 200;
  std::vector<std::vector<Account>> accounts(2);
  for (int i = 0; i < 2 * kTransfers; ++i) {
    const std::string id = "acct-" + std::to_string(i);
    accounts[ledger->shard_index(id)].push_back({id, 1000, 1000, 0, "", false});
  }
  for (std::size_t s = 0; s < 2; ++s)
    ASSERT_TRUE(ledger->shard(s).create_accounts(accounts[s]).is_ok());
  std::vector<std::string> ids, from, to;
  std::vector<std::int64_t> amount;
  for (int i = 0; i < kTransfers; ++i) {
    ids.push_back("rt-" + std::to_string(i));
    from.push_back("acct-" + std::to_string(2 * i));
    to.push_back(i % 10 == 5 ? "ghost-" + std::to_string(i) : "acct-" + std::to_string(2 * i + 1));
    amount.push_back(i % 10 == 3 ? 5000 : 10);
  }
  std::vector<NewTransfer> batch(kTransfers);
  for (std::size_t i = 0; i < batch.size(); ++i) {
    batch[i].request.id = ids[i];
    batch[i].request.from = from[i];
    batch[i].request.to = to[i];
    batch[i].request.amount = amount[i];
    batch[i].request.metadata = "{}";
    batch[i].payload_hash = payload_hash(batch[i].request);
    batch[i].origin_topic = "transfers.requests";
  }
  // Warm up: each statement is prepared once per connection (one more round
  // trip, the first time only).
  std::vector<InsertResult> inserted(batch.size());
  ASSERT_TRUE(
      ledger->transfers()
          .insert_transfers(std::span(batch).first(1), "rt", 30'000, std::span(inserted).first(1))
          .is_ok());
  for (const char* db : {"shard1", "shard2"}) {
    ASSERT_EQ(server.psql(db, "SELECT pg_stat_statements_reset()").exit_code, 0);
  }

  ASSERT_TRUE(ledger->transfers()
                  .insert_transfers(std::span(batch).subspan(1), "rt", 30'000,
                                    std::span(inserted).subspan(1))
                  .is_ok());
  std::vector<SagaItem> items(batch.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    items[i].id = ids[i];
    items[i].source = from[i];
    items[i].destination = to[i];
    items[i].amount = amount[i];
    items[i].epoch = 1;
  }
  SagaEngine engine(*ledger, {"rt", 30'000, 5}, nullptr);
  ASSERT_TRUE(engine.run(items).is_ok());
  std::map<std::string, int> states;
  for (const SagaItem& it : items) {
    ASSERT_FALSE(it.dropped) << it.id;
    ++states[std::string(to_string(it.state)) + "/" + std::string(to_string(it.reason))];
  }
  EXPECT_EQ(states, (std::map<std::string, int>{{"done/none", 160},
                                                {"canceled/insufficient_funds", 20},
                                                {"canceled/unknown_account", 20}}));

  // Statement name -> calls, on each shard (psql's own queries left out).
  const auto calls = [&](const char* db) {
    const RunResult r = server.psql(
        db,
        "SELECT CASE WHEN query LIKE '%saga_insert_transfers(%' THEN 'insert_transfers' "
        "WHEN query LIKE '%saga_transition_at(%' THEN 'transition' "
        "WHEN query LIKE '%saga_apply_legs(%' THEN 'apply_legs' "
        "WHEN query LIKE '%FROM saga_accounts WHERE id = ANY%' THEN 'load_accounts' "
        "ELSE query END, sum(calls) FROM pg_stat_statements "
        "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        "AND query NOT LIKE '%pg_stat_statements%' GROUP BY 1 ORDER BY 1");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output;
  };
  // Shard 1 holds the transfers: insert, then `canceling` (this batch has
  // transfers to cancel) and the finish; the claim and `applied` are not
  // written on several stores. Both shards plan once and run debit /
  // credit / cleanup / compensate legs.
  EXPECT_EQ(calls("shard1"), "apply_legs|4\ninsert_transfers|1\nload_accounts|1\ntransition|2\n");
  EXPECT_EQ(calls("shard2"), "apply_legs|4\nload_accounts|1\n");
  AuditReport report;
  ASSERT_TRUE(run_audit(*ledger, {}, report).is_ok());
  EXPECT_TRUE(report.ok()) << report.to_text();
}

// ---- bad configuration ------------------------------------------------------

struct Exit {
  int code = -1;
  std::string output;
  double seconds = 0;
};

Exit run_timed(const std::vector<std::string>& argv) {
  const auto t = Clock::now();
  RunResult r = run(argv, {}, 60s);
  return {r.exit_code, std::move(r.output), seconds_since(t)};
}

std::vector<std::string> worker_argv(const std::vector<std::string>& stores) {
  std::vector<std::string> argv = {
      bin("saga-worker").string(), "--brokers", "127.0.0.1:1", "--group", "g", "--metrics-addr", "",
      "--broker-timeout",          "2s"};
  for (const auto& s : stores) argv.insert(argv.end(), {"--store", s});
  return argv;
}

std::vector<std::string> sagactl_argv(const std::vector<std::string>& stores,
                                      const std::string& command) {
  std::vector<std::string> argv = {bin("sagactl").string()};
  for (const auto& s : stores) argv.insert(argv.end(), {"--store", s});
  argv.push_back(command);
  return argv;
}

TEST(PostgresConfig, MalformedUrlWrongPasswordAndMissingDatabaseFailAtOnce) {
  PgServer server;
  const std::string url = server.create_database("ledger");
  const std::string port = std::to_string(server.port());
  const std::string secret = "sekrit-never-shown";

  // A URL libpq cannot parse: refused before any connection, not echoed.
  for (const std::string& bad :
       {"postgresql://saga:" + secret + "@127.0.0.1:" + port + "/ledger?no_such_option=1",
        "host=127.0.0.1 password='" + secret}) {
    for (const auto& argv : {worker_argv({bad}), sagactl_argv({bad}, "init")}) {
      const Exit e = run_timed(argv);
      EXPECT_EQ(e.code, 2) << e.output;
      EXPECT_TRUE(contains(e.output, "cannot parse the PostgreSQL store URL")) << e.output;
      EXPECT_FALSE(contains(e.output, secret)) << e.output;
      EXPECT_LT(e.seconds, 5.0);
    }
  }

  // A wrong password, a database that does not exist: permanent, no retry.
  for (const auto& [bad, why] :
       {std::pair{"postgresql://saga:" + secret + "@127.0.0.1:" + port + "/ledger",
                  std::string("password authentication failed")},
        std::pair{"postgresql://saga:" + server.password() + "@127.0.0.1:" + port + "/nodb",
                  std::string("does not exist")}}) {
    for (const auto& argv : {worker_argv({bad}), sagactl_argv({bad}, "init")}) {
      const Exit e = run_timed(argv);
      EXPECT_EQ(e.code, 2) << e.output;
      EXPECT_TRUE(contains(e.output, why)) << e.output;
      EXPECT_TRUE(contains(e.output, "127.0.0.1:" + port)) << e.output;  // which store
      EXPECT_FALSE(contains(e.output, secret)) << e.output;
      EXPECT_FALSE(contains(e.output, server.password())) << e.output;
      EXPECT_LT(e.seconds, 5.0) << e.output;
    }
  }
}

TEST(PostgresConfig, UnreachableServerIsRetriedForConnectTimeoutThenRefused) {
  // Nothing listens there: retried with backoff for connect_timeout, then a
  // clear message and exit 2.
  const std::string closed =
      "postgresql://saga:pw@127.0.0.1:" + std::to_string(free_loopback_port()) + "/ledger";
  for (const auto& argv : {worker_argv({closed + "?connect_timeout=3"}),
                           sagactl_argv({closed + "?connect_timeout=3"}, "audit")}) {
    const Exit e = run_timed(argv);
    EXPECT_EQ(e.code, 2) << e.output;
    EXPECT_TRUE(contains(e.output, "cannot connect")) << e.output;
    EXPECT_TRUE(contains(e.output, "gave up after")) << e.output;
    EXPECT_GE(e.seconds, 2.0) << e.output;
    EXPECT_LT(e.seconds, 10.0) << e.output;
  }

  // A server that comes up within the wait is used: the worker starts.
  PgServer server;
  const std::string url = server.create_database("ledger");
  ASSERT_EQ(run(sagactl_argv({url}, "init")).exit_code, 0);
  TempDir dir("sagapool-pg-late");
  Broker broker = Broker::kafka(dir, 2);
  server.stop(PgServer::StopMode::fast);
  Process worker = Process::start(
      {bin("saga-worker").string(), "--brokers", broker.bootstrap(), "--group", "g", "--store",
       url + "?connect_timeout=30", "--metrics-addr", "", "--worker-id", "late"},
      dir / "late.log");
  std::this_thread::sleep_for(2s);
  EXPECT_TRUE(worker.running()) << read_file(dir / "late.log");
  server.start();
  EXPECT_TRUE(
      eventually([&] { return contains(read_file(dir / "late.log"), "worker late started"); }, 20s))
      << read_file(dir / "late.log");
  EXPECT_EQ(worker.stop(20s), 0) << read_file(dir / "late.log");
}

TEST(PostgresConfig, StoresInAnotherOrderOrNumberAreRefused) {
  PgServer a;
  PgServer b;
  const std::string url_a = a.create_database("ledger");
  const std::string url_b = b.create_database("ledger");
  const Exit init = run_timed(sagactl_argv({url_a, url_b}, "init"));
  ASSERT_EQ(init.code, 0) << init.output;

  for (const auto& stores : {std::vector<std::string>{url_b, url_a},
                             std::vector<std::string>{url_a}, std::vector<std::string>{url_b}}) {
    for (const auto& argv : {worker_argv(stores), sagactl_argv(stores, "audit")}) {
      const Exit e = run_timed(argv);
      EXPECT_EQ(e.code, 2) << e.output;
      EXPECT_TRUE(
          contains(e.output, "pass the stores in the order and number used at `sagactl init`"))
          << e.output;
      EXPECT_FALSE(contains(e.output, a.password())) << e.output;
      EXPECT_FALSE(contains(e.output, b.password())) << e.output;
    }
  }
  // Re-initialising in another order would re-shard: refused too.
  const Exit reinit = run_timed(sagactl_argv({url_b, url_a}, "init"));
  EXPECT_NE(reinit.code, 0) << reinit.output;
  EXPECT_TRUE(contains(reinit.output, "re-sharding needs a migration")) << reinit.output;
  // The right order still works.
  EXPECT_EQ(run_timed(sagactl_argv({url_a, url_b}, "audit")).code, 0);
}

}  // namespace
}  // namespace sagapool::test
