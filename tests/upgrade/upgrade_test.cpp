// A rolling upgrade, for real: the previous release's saga-worker and
// sagactl (tests/upgrade/previous-release, built by build_previous.sh) set
// up the ledger and run three workers while transfers flow; this build's
// `sagactl init` expands the schema under them; each is then replaced by a
// worker of this build, one at a time; `sagactl migrate --contract` is
// refused while an old worker lives and succeeds once they are gone. Every
// id must reach exactly one outcome and the audit must pass.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kafka_client.hpp"
#include "pg_server.hpp"
#include "process.hpp"
#include "sagapool/store.hpp"

namespace sagapool::test {
namespace {

using namespace std::chrono_literals;

constexpr int kAccounts = 20;
constexpr int kWorkers = 3;
constexpr std::int64_t kOpening = 1'000'000'000;

std::filesystem::path previous(const std::string& program) {
  return std::filesystem::path(SAGA_PREVIOUS_BIN_DIR) / program;
}

std::string account(int i) { return "acct-" + std::to_string(i); }

// Transfer i: between two of the accounts (which hold far more than all of
// them move), except every 25th, whose destination does not exist.
struct Planned {
  std::string id, from, to, request, state, reason;
};
Planned planned(int i) {
  Planned t;
  t.id = "u-" + std::to_string(i);
  t.from = account(i % kAccounts);
  t.to = i % 25 == 24 ? "ghost-" + std::to_string(i) : account((i * 7 + 3) % kAccounts);
  if (t.to == t.from) t.to = account((i + 1) % kAccounts);
  t.state = i % 25 == 24 ? "canceled" : "done";
  t.reason = i % 25 == 24 ? "unknown_account" : "";
  t.request = R"({"id":")" + t.id + R"(","from":")" + t.from + R"(","to":")" + t.to +
              R"(","amount":)" + std::to_string(1 + i % 97) + "}";
  return t;
}

class RollingUpgrade : public testing::Test {
 protected:
  void SetUp() override {
    for (const char* program : {"saga-worker", "sagactl"}) {
      ASSERT_TRUE(std::filesystem::exists(previous(program)))
          << previous(program) << " is missing: the upgrade_build_previous_release test builds it";
    }
    broker_ = std::make_unique<Broker>(Broker::start(dir_, /*partitions=*/6));
  }

  void TearDown() override {
    stop_producing();
    for (auto& [name, p] : workers_) p.stop();
    if (HasFailure()) std::cout << log_tails(dir_.path(), 30);
  }

  RunResult ctl(const std::filesystem::path& program, std::vector<std::string> args) {
    std::vector<std::string> argv = {program.string(), "--store", url_};
    argv.insert(argv.end(), args.begin(), args.end());
    return run(argv);
  }

  Process start_worker(const std::filesystem::path& program, const std::string& name) {
    return Process::start({program.string(), "--brokers", broker_->bootstrap(), "--group", "g",
                           "--worker-id", name, "--metrics-addr", "", "--lease", "2s",
                           "--recovery-interval", "200ms", "--batch-size", "100",
                           "--drain-timeout", "10s", "--store", url_},
                          dir_ / (name + ".log"), {}, /*die_with_parent=*/true);
  }

  // Requests in chunks of 20, 50 ms apart, until stop_producing().
  void start_producing() {
    producer_ = std::thread([this] {
      try {
        while (!stop_.load()) {
          std::vector<std::pair<std::string, std::string>> chunk;
          for (int k = 0; k < 20; ++k) {
            const Planned t = planned(sent_.load() + k);
            chunk.emplace_back(t.id, t.request);  // every partition gets work
          }
          produce(broker_->bootstrap(), "transfers.requests", chunk,
                  {{"enable.idempotence", "true"}, {"acks", "all"}});
          sent_ += static_cast<int>(chunk.size());
          std::this_thread::sleep_for(50ms);
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << "publishing the requests: " << e.what();
      }
    });
  }
  void stop_producing() {
    stop_ = true;
    if (producer_.joinable()) producer_.join();
  }

  // Terminal and published, as the store sees it.
  bool all_finished(Store& store, int n) {
    int done = 0;
    bool open = false;
    const Status s = store.scan_transfer_states([&](std::string_view, TransferState st, bool notified) {
      if (is_terminal(st) && notified)
        ++done;
      else
        open = true;
    });
    return s && !open && done == n;
  }

  void replace(const std::string& old_name, const std::string& new_name) {
    Process& old = workers_.at(old_name);
    old.signal(SIGTERM);
    const std::optional<int> code = old.wait(30s);
    EXPECT_EQ(code, std::optional<int>(0)) << old_name << " did not drain cleanly";
    workers_.erase(old_name);
    workers_.emplace(new_name, start_worker(bin("saga-worker"), new_name));
  }

  void run_scenario() {
    // The previous release sets up the ledger and runs the pool.
    RunResult r = ctl(previous("sagactl"), {"init"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    {
      std::unique_ptr<Store> store;
      ASSERT_TRUE(open_store(url_, store).is_ok());
      std::vector<Account> accounts;
      for (int i = 0; i < kAccounts; ++i) {
        Account& a = accounts.emplace_back();
        a.id = account(i);
        a.balance = a.opening_balance = kOpening;
      }
      const Status s = store->create_accounts(accounts);
      ASSERT_TRUE(s.is_ok()) << s.message();
    }
    for (int i = 0; i < kWorkers; ++i) {
      const std::string name = "old-" + std::to_string(i);
      workers_.emplace(name, start_worker(previous("saga-worker"), name));
    }
    start_producing();
    ASSERT_TRUE(eventually([&] { return sent_.load() >= 200; }, 60s));

    // helm upgrade's pre-upgrade hook: this build's init, the expand step.
    r = ctl(bin("sagactl"), {"init"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("upgraded schema from version 3"), std::string::npos) << r.output;
    // The old workers run on: a store error they cannot retry would have
    // stopped them.
    std::this_thread::sleep_for(3s);
    for (auto& [name, p] : workers_) EXPECT_TRUE(p.running()) << name << " stopped after the expand";
    // A restarted old pod starts on the expanded schema too (a rollback).
    {
      Process extra = start_worker(previous("saga-worker"), "old-restarted");
      std::this_thread::sleep_for(3s);
      EXPECT_TRUE(extra.running()) << "the previous release refused the expanded schema";
      extra.signal(SIGTERM);
      EXPECT_EQ(extra.wait(30s), std::optional<int>(0));
    }
    r = ctl(bin("sagactl"), {"migrate", "--contract", "--unregistered-gone-after", "5s"});
    EXPECT_EQ(r.exit_code, 3) << r.output;
    EXPECT_NE(r.output.find("worker old-"), std::string::npos) << r.output;

    // The pods roll, one at a time, while requests keep coming.
    for (int i = 0; i < kWorkers; ++i) {
      replace("old-" + std::to_string(i), "new-" + std::to_string(i));
      std::this_thread::sleep_for(2s);
      // The last old worker may hold no partition (and so no lease): the
      // registry sees it regardless.
      if (i == kWorkers - 2) {
        r = ctl(bin("sagactl"), {"migrate", "--contract", "--unregistered-gone-after", "5s"});
        EXPECT_EQ(r.exit_code, 3) << "refused while old-" << kWorkers - 1 << " runs\n" << r.output;
        EXPECT_NE(r.output.find("worker old-" + std::to_string(kWorkers - 1) + " "), std::string::npos)
            << r.output;
      }
    }
    r = ctl(bin("sagactl"), {"workers"});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    for (int i = 0; i < kWorkers; ++i) {
      EXPECT_NE(r.output.find("new-" + std::to_string(i) + "  build "), std::string::npos) << r.output;
    }
    std::this_thread::sleep_for(2s);
    stop_producing();
    const int n = sent_.load();
    std::cout << "requests sent: " << n << "\n";

    std::unique_ptr<Store> store;
    ASSERT_TRUE(open_store(url_, store).is_ok());
    ASSERT_TRUE(eventually([&] { return all_finished(*store, n); }, 120s))
        << "not every transfer finished";

    // Once the old workers' last leases are past the window: the contract.
    const auto contract_started = std::chrono::steady_clock::now();
    ASSERT_TRUE(eventually(
        [&] {
          r = ctl(bin("sagactl"), {"migrate", "--contract", "--unregistered-gone-after", "5s"});
          return r.exit_code == 0;
        },
        60s))
        << r.output;
    std::cout << "contract accepted "
              << std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() -
                                                                  contract_started)
                     .count()
              << "s after the last outcome\n";
    // The previous release now refuses to start; this build runs on.
    r = run({previous("saga-worker").string(), "--brokers", broker_->bootstrap(), "--group", "g",
             "--metrics-addr", "", "--store", url_},
            {}, 60s);
    EXPECT_NE(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("newer than this program knows"), std::string::npos) << r.output;
    for (auto& [name, p] : workers_) EXPECT_TRUE(p.running()) << name;

    // Every id exactly one outcome, the planned one.
    std::map<std::string, std::set<std::string>> seen;
    for (const Record& rec : consume(broker_->bootstrap(), "transfers.results",
                                     static_cast<std::size_t>(n), 60s)) {
      const auto j = nlohmann::json::parse(rec.value);
      const std::string reason = j.at("reason").is_null() ? "" : j.at("reason").get<std::string>();
      seen[j.at("id").get<std::string>()].insert(j.at("state").get<std::string>() + "/" + reason);
    }
    EXPECT_EQ(seen.size(), static_cast<std::size_t>(n));
    int wrong = 0;
    for (int i = 0; i < n && wrong < 10; ++i) {
      const Planned t = planned(i);
      const std::set<std::string> want{t.state + "/" + t.reason};
      if (seen[t.id] != want) {
        ++wrong;
        ADD_FAILURE() << t.id << ": expected " << *want.begin() << ", got "
                      << testing::PrintToString(seen[t.id]);
      }
    }
    r = ctl(bin("sagactl"), {"audit"});
    EXPECT_EQ(r.exit_code, 0) << r.output;

    // An account's latest postings, as `sagactl accounts show` reads them,
    // are all of its postings: on SQLite, old builds posted unlinked until
    // the contract linked them.
    std::map<std::string, std::multiset<std::string>> by_account;
    ASSERT_TRUE(store
                    ->scan_postings([&](const Posting& p) {
                      by_account[p.account_id].insert(p.transfer_id + "/" + std::string(to_string(p.kind)));
                    })
                    .is_ok());
    EXPECT_EQ(by_account.size(), static_cast<std::size_t>(kAccounts));
    for (const auto& [id, want] : by_account) {
      std::vector<Posting> latest;
      ASSERT_TRUE(store->postings_for_account(id, want.size() + 1, latest).is_ok());
      std::multiset<std::string> got;
      for (const Posting& p : latest) got.insert(p.transfer_id + "/" + std::string(to_string(p.kind)));
      EXPECT_EQ(got, want) << id;
    }

    for (auto& [name, p] : workers_) EXPECT_EQ(p.stop(30s), 0) << name;
    workers_.clear();
  }

  TempDir dir_{"sagapool-upgrade"};
  std::unique_ptr<Broker> broker_;
  std::string url_;
  std::map<std::string, Process> workers_;
  std::thread producer_;
  std::atomic<bool> stop_{false};
  std::atomic<int> sent_{0};
};

TEST_F(RollingUpgrade, OnSqlite) {
  url_ = "sqlite:" + (dir_ / "ledger.db").string();
  run_scenario();
}

TEST_F(RollingUpgrade, OnPostgresql) {
  PgServer server;
  url_ = server.create_database("ledger");
  run_scenario();
  stop_producing();
  for (auto& [name, p] : workers_) p.stop();
  workers_.clear();
}

}  // namespace
}  // namespace sagapool::test
