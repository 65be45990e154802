// Bad configuration gives one clear line and a non-zero exit.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace sagapool::test
