// Bad configuration gives one clear line and a non-zero exit.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "http_get.hpp"
#include "kafka_client.hpp"
#include "process.hpp"
#include "sagapool/ledger.hpp"

namespace sagapool::test {
namespace {

using namespace std::chrono_literals;

int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

RunResult worker(std::vector<std::string> args) {
  args.insert(args.begin(), bin("saga-worker").string());
  return run(args, {}, 60s);
}

TEST(WorkerCli, BadFlagsExitTwoWithOneLine) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--brokers", "x", "--group", "g"},                                     // no --store
           {"--brokers", "x", "--group", "g", "--store", "sqlite:a", "--lease", "soon"},
           {"--brokers", "x", "--group", "g", "--store", "sqlite:a", "--batch-size", "0"},
           {"--brokers", "x", "--group", "g", "--store", "sqlite:a", "--log-format", "xml"},
           {"--brokers", "x", "--group", "g", "--store", "sqlite:a", "--store-lanes", "9"},
           {"--brokers", "x", "--group", "g", "--store", "sqlite:a", "--kafka-opt", "novalue"},
           {"--brokers", "x", "--group", "g", "--store", "mysql://h/db"},
           {"--no-such-flag"}}) {
    RunResult r = worker(args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_EQ(lines(r.output), 1) << r.output;
    EXPECT_NE(r.output.find("saga-worker"), std::string::npos) << r.output;
  }
}

TEST(WorkerCli, HelpNamesEnvironmentVariablesAndPrecedence) {
  RunResult r = worker({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("SAGA_BATCH_SIZE"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("flag > environment > config file > default"), std::string::npos);
}

TEST(WorkerCli, UnusableStoreIsOneClearLine) {
  TempDir dir;
  RunResult missing_dir = worker({"--brokers", "127.0.0.1:1", "--group", "g", "--store",
                                  "sqlite:" + (dir / "no/such/dir/ledger.db").string()});
  EXPECT_EQ(missing_dir.exit_code, 2) << missing_dir.output;
  EXPECT_NE(missing_dir.output.find("cannot open"), std::string::npos) << missing_dir.output;
  EXPECT_EQ(lines(missing_dir.output), 1) << missing_dir.output;

  RunResult uninitialised = worker({"--brokers", "127.0.0.1:1", "--group", "g", "--store",
                                    "sqlite:" + (dir / "fresh.db").string()});
  EXPECT_EQ(uninitialised.exit_code, 2) << uninitialised.output;
  EXPECT_NE(uninitialised.output.find("sagactl init"), std::string::npos) << uninitialised.output;
}

// Lanes run a batch as concurrent transactions: SQLite takes one writer at
// a time, and shards commit each step on its own.
TEST(WorkerCli, LanesOnAStoreThatCannotTakeThemAreRefused) {
  TempDir dir;
  const std::string url = "sqlite:" + (dir / "ledger.db").string();
  std::unique_ptr<Ledger> ledger;
  ASSERT_TRUE(Ledger::open({url}, ledger).is_ok());
  ASSERT_TRUE(ledger->init().is_ok());
  RunResult r = worker({"--brokers", "127.0.0.1:1", "--group", "g", "--store", url, "--store-lanes", "2"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--store-lanes: more than 1 needs a single PostgreSQL store"), std::string::npos)
      << r.output;
  EXPECT_EQ(lines(r.output), 1) << r.output;
}

TEST(WorkerCli, UnreachableBrokerIsOneClearLine) {
  TempDir dir;
  std::unique_ptr<Ledger> ledger;
  ASSERT_TRUE(Ledger::open({"sqlite:" + (dir / "l.db").string()}, ledger).is_ok());
  ASSERT_TRUE(ledger->init().is_ok());
  RunResult r = worker({"--brokers", "127.0.0.1:1", "--group", "g", "--store",
                        "sqlite:" + (dir / "l.db").string(), "--broker-timeout", "2s",
                        "--metrics-addr", ""});
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("no Kafka broker answered at 127.0.0.1:1"), std::string::npos) << r.output;
  EXPECT_EQ(lines(r.output), 1) << r.output;
}

// librdkafka's consumer close waits for brokers without a deadline (a
// worker once took 16 minutes to stop in a benchmark); the worker must still
// leave within --drain-timeout (+ 10 s grace) of SIGTERM.
TEST(WorkerCli, SigtermWithTheBrokerGoneStillExits) {
  TempDir dir;
  const std::string store = "sqlite:" + (dir / "l.db").string();
  std::unique_ptr<Ledger> ledger;
  ASSERT_TRUE(Ledger::open({store}, ledger).is_ok());
  ASSERT_TRUE(ledger->init().is_ok());
  Broker broker = Broker::kafka(dir, 2);
  const int port = free_loopback_port();
  Process w = Process::start({bin("saga-worker").string(), "--brokers", broker.bootstrap(), "--group",
                              "g", "--store", store, "--drain-timeout", "2s", "--metrics-addr",
                              "127.0.0.1:" + std::to_string(port)},
                             dir / "worker.log");
  ASSERT_TRUE(eventually([&] { return http_get(port, "/readyz").status == 200; }, 60s))
      << read_file(dir / "worker.log");
  // Work done, so the drain has offsets to commit and outcomes to flush.
  Account a;
  a.id = "a";
  a.balance = a.opening_balance = 1000;
  ASSERT_TRUE(ledger->shard_for("a").create_accounts({&a, 1}).is_ok());
  std::vector<std::pair<std::string, std::string>> requests;
  for (int i = 0; i < 20; ++i) {
    requests.emplace_back("a", R"({"id":"t)" + std::to_string(i) + R"(","from":"a","to":"b","amount":1})");
  }
  produce(broker.bootstrap(), "transfers.requests", requests);
  ASSERT_TRUE(eventually(
      [&] {
        std::optional<TransferDoc> d;
        return ledger->transfers().load_transfer("t19", d).is_ok() && d && is_terminal(d->state);
      },
      30s))
      << read_file(dir / "worker.log");
  broker.kill();
  const auto sent = std::chrono::steady_clock::now();
  w.signal(SIGTERM);
  const std::optional<int> code = w.wait(40s);
  ASSERT_TRUE(code.has_value()) << "still running 40 s after SIGTERM\n" << read_file(dir / "worker.log");
  EXPECT_LT(std::chrono::steady_clock::now() - sent, 2s + 10s + 5s);
  const std::string log = read_file(dir / "worker.log");
  // Either the drain finished (0) or the deadline cut it short (1, one line).
  if (*code != 0) {
    EXPECT_EQ(*code, 1);
    EXPECT_NE(log.find("the drain did not finish within --drain-timeout"), std::string::npos) << log;
  }
}

// librdkafka 2.0 aborts in rd_kafka_destroy when a cooperative-sticky member
// joined the group but never received an assignment (its issue #4312): the
// chaos test saw a worker stopped during a rebalance die with SIGABRT after
// draining. SyncGroup is made to fail here, so the worker never gets one.
TEST(WorkerCli, SigtermBeforeAnyAssignmentExitsZero) {
  TempDir dir;
  const std::string store = "sqlite:" + (dir / "l.db").string();
  std::unique_ptr<Ledger> ledger;
  ASSERT_TRUE(Ledger::open({store}, ledger).is_ok());
  ASSERT_TRUE(ledger->init().is_ok());
  const auto bootstrap = dir / "bootstrap";
  const auto control = dir / "control";
  Process broker = Process::start({bin("saga-broker").string(), "--partitions", "2", "--bootstrap-file",
                                   bootstrap.string(), "--control-fifo", control.string()},
                                  dir / "broker.log");
  ASSERT_TRUE(eventually([&] { return std::filesystem::exists(bootstrap) && std::filesystem::exists(control); },
                         30s))
      << read_file(dir / "broker.log");
  {
    std::ofstream fifo(control);
    fifo << "errors 14 100000 REBALANCE_IN_PROGRESS\n";  // 14: SyncGroup
  }
  ASSERT_TRUE(eventually([&] { return read_file(dir / "broker.log").find("fail with") != std::string::npos; }, 10s))
      << read_file(dir / "broker.log");
  std::string brokers = read_file(bootstrap);
  while (!brokers.empty() && (brokers.back() == '\n' || brokers.back() == ' ')) brokers.pop_back();
  Process w = Process::start({bin("saga-worker").string(), "--brokers", brokers, "--group", "g", "--store",
                              store, "--metrics-addr", ""},
                             dir / "worker.log");
  ASSERT_TRUE(eventually([&] { return read_file(dir / "worker.log").find(" started") != std::string::npos; }, 30s))
      << read_file(dir / "worker.log");
  std::this_thread::sleep_for(5s);  // joined, SyncGroup refused again and again
  const std::string before = read_file(dir / "worker.log");
  EXPECT_EQ(before.find("rebalance: assigned"), std::string::npos) << before;
  EXPECT_EQ(w.stop(30s), 0) << read_file(dir / "worker.log");
}

// The Helm chart gives the stores only as SAGA_STORE, one URL a line in
// shard order, so that no URL (nor its password) is on the command line.
TEST(WorkerCli, SeveralStoresThroughSagaStoreOneALine) {
  TempDir dir;
  const std::string a = "sqlite:" + (dir / "a.db").string();
  const std::string b = "sqlite:" + (dir / "b.db").string();
  std::unique_ptr<Ledger> ledger;
  ASSERT_TRUE(Ledger::open({a, b}, ledger).is_ok());
  ASSERT_TRUE(ledger->init().is_ok());
  const std::vector<std::string> base{bin("saga-worker").string(), "--brokers", "127.0.0.1:1", "--group", "g",
                                      "--broker-timeout", "2s", "--metrics-addr", ""};

  // Swapped lines: refused by the topology check, so the order is kept.
  RunResult swapped = run(base, {"SAGA_STORE=" + b + "\n" + a}, 60s);
  EXPECT_EQ(swapped.exit_code, 2) << swapped.output;
  EXPECT_NE(swapped.output.find("store #1 (" + b + ") is shard 2 of 2"), std::string::npos) << swapped.output;

  // In order: both stores pass the topology check, and only the broker is missing.
  RunResult ordered = run(base, {"SAGA_STORE=" + a + "\n" + b}, 60s);
  EXPECT_EQ(ordered.exit_code, 3) << ordered.output;
  EXPECT_NE(ordered.output.find("no Kafka broker answered"), std::string::npos) << ordered.output;

  // Against a broker: the worker starts on the two stores.
  Broker broker = Broker::kafka(dir, 2);
  const int port = free_loopback_port();
  Process w = Process::start({bin("saga-worker").string(), "--brokers", broker.bootstrap(), "--group", "g",
                              "--drain-timeout", "2s", "--metrics-addr", "127.0.0.1:" + std::to_string(port)},
                             dir / "worker.log", {"SAGA_STORE=" + a + "\n" + b});
  ASSERT_TRUE(eventually([&] { return http_get(port, "/readyz").status == 200; }, 60s))
      << read_file(dir / "worker.log");
  EXPECT_TRUE(eventually([&] { return read_file(dir / "worker.log").find("2 store(s)") != std::string::npos; }, 10s))
      << read_file(dir / "worker.log");
  EXPECT_EQ(w.stop(), 0) << read_file(dir / "worker.log");
}

// One SQLite file takes one writer at a time, so a batch there defaults to
// 10,000 requests; any other layout to 5,000. A bound that is set is kept
// (here by flag and by environment).
TEST(WorkerCli, TheBatchBoundDefaultsTo10000OnOneSqliteStoreOnly) {
  TempDir dir;
  const std::string one = "sqlite:" + (dir / "one.db").string();
  const std::vector<std::string> shards{"sqlite:" + (dir / "s1.db").string(), "sqlite:" + (dir / "s2.db").string()};
  for (const std::vector<std::string>& stores : {std::vector<std::string>{one}, shards}) {
    std::unique_ptr<Ledger> ledger;
    ASSERT_TRUE(Ledger::open(stores, ledger).is_ok());
    ASSERT_TRUE(ledger->init().is_ok());
  }
  Broker broker = Broker::kafka(dir, 2);
  int run_no = 0;
  auto batch_of = [&](std::vector<std::string> args, std::vector<std::string> env) {
    const auto log = dir / ("worker-" + std::to_string(++run_no) + ".log");
    args.insert(args.begin(), {bin("saga-worker").string(), "--brokers", broker.bootstrap(), "--group",
                               "g" + std::to_string(run_no), "--drain-timeout", "2s", "--metrics-addr", ""});
    Process w = Process::start(args, log, env);
    std::smatch m;
    std::string text;
    const bool started = eventually([&] {
      text = read_file(log);
      return std::regex_search(text, m, std::regex(" started: .*, batch (\\d+),"));
    }, 60s);
    EXPECT_EQ(w.stop(), 0) << read_file(log);
    return started ? m[1].str() : "not started: " + text;
  };
  EXPECT_EQ(batch_of({"--store", one}, {}), "10000");
  EXPECT_EQ(batch_of({"--store", one, "--batch-size", "5000"}, {}), "5000");
  EXPECT_EQ(batch_of({"--store", one}, {"SAGA_BATCH_SIZE=700"}), "700");
  EXPECT_EQ(batch_of({"--store", shards[0], "--store", shards[1]}, {}), "5000");
}

}  // namespace
}  // namespace sagapool::test
