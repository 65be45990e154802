// What every program's command line promises operators: --version, a
// config file whose unknown keys are errors (by --config or SAGA_CONFIG),
// a validated, case-insensitive --log-level, and saga-broker's own
// environment prefix.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>

#include "process.hpp"

namespace sagapool::test {
namespace {

using namespace std::chrono_literals;

const std::vector<std::string> kPrograms = {"saga-worker", "saga-producer", "sagactl", "saga-broker"};

std::string env_prefix(const std::string& program) {
  return program == "saga-broker" ? "SAGA_BROKER_" : "SAGA_";
}

int lines(const std::string& s) { return static_cast<int>(std::count(s.begin(), s.end(), '\n')); }

void write(const std::filesystem::path& p, const std::string& text) { std::ofstream(p) << text; }

TEST(CliContract, EveryProgramReportsItsVersion) {
  for (const std::string& program : kPrograms) {
    RunResult r = run({bin(program).string(), "--version"});
    EXPECT_EQ(r.exit_code, 0) << program << ": " << r.output;
    EXPECT_EQ(r.output, program + " " + SAGAPOOL_VERSION + "\n");
  }
}

TEST(CliContract, AnUnknownConfigKeyIsAnErrorNamingItByFlagOrEnvironment) {
  TempDir dir;
  const auto file = dir / "typo.toml";
  write(file, "leese = \"1s\"\n");
  for (const std::string& program : kPrograms) {
    for (const bool by_env : {false, true}) {
      RunResult r = by_env ? run({bin(program).string()}, {env_prefix(program) + "CONFIG=" + file.string()})
                           : run({bin(program).string(), "--config", file.string()});
      SCOPED_TRACE(program + (by_env ? " with " + env_prefix(program) + "CONFIG" : " with --config"));
      EXPECT_EQ(r.exit_code, 2) << r.output;
      EXPECT_EQ(lines(r.output), 1) << r.output;
      EXPECT_NE(r.output.find("unknown key 'leese'"), std::string::npos) << r.output;
    }
  }
}

TEST(CliContract, SagaConfigIsReadLikeTheFlag) {
  TempDir dir;
  const auto db = dir / "ledger.db";
  const auto file = dir / "sagactl.toml";
  write(file, "store = \"sqlite:" + db.string() + "\"\n");
  RunResult r = run({bin("sagactl").string(), "init"}, {"SAGA_CONFIG=" + file.string()});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(db)) << r.output;

  RunResult missing = run({bin("sagactl").string(), "init"}, {"SAGA_CONFIG=" + (dir / "none.toml").string()});
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_NE(missing.output.find("none.toml"), std::string::npos) << missing.output;
}

TEST(CliContract, AnUnknownLogLevelIsAnError) {
  for (const std::string& program : kPrograms) {
    RunResult r = run({bin(program).string(), "--log-level", "loud"});
    EXPECT_EQ(r.exit_code, 2) << program << ": " << r.output;
    EXPECT_EQ(lines(r.output), 1) << r.output;
    EXPECT_NE(r.output.find("--log-level"), std::string::npos) << r.output;
  }
}

// saga-broker logs "stopped" at info when it exits. Before, SAGA_LOG_LEVEL
// went through spdlog's from_str, which turns an unknown name (any upper
// case) into `off`; and the broker read the worker's SAGA_BROKERS as its
// own --brokers count.
TEST(CliContract, LogLevelAnyCaseAndTheBrokersOwnEnvironment) {
  for (const auto& [level, logged] : std::vector<std::pair<std::string, bool>>{{"INFO", true}, {"Warn", false}}) {
    TempDir dir;
    const auto bootstrap = dir / "bootstrap";
    Process broker = Process::start({bin("saga-broker").string(), "--bootstrap-file", bootstrap.string()},
                                    dir / "broker.log",
                                    {"SAGA_BROKER_LOG_LEVEL=" + level, "SAGA_BROKERS=127.0.0.1:9092",
                                     "SAGA_PARTITIONS=0"});
    ASSERT_TRUE(eventually([&] { return std::filesystem::exists(bootstrap); }, 30s))
        << read_file(dir / "broker.log");
    EXPECT_EQ(broker.stop(30s), 0);
    const std::string log = read_file(dir / "broker.log");
    EXPECT_EQ(log.find("stopped") != std::string::npos, logged) << level << ":\n" << log;
  }
}

}  // namespace
}  // namespace sagapool::test
