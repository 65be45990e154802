// A real Prometheus (Debian's `prometheus`) on loopback scrapes two real
// workers during a small run, with monitoring/rules loaded (the stuck
// alert's threshold shortened for the test). Through its HTTP API: finished
// transfers increase, no alert is even pending on a healthy run, and a
// transfer left unfinished by a worker paused with SIGSTOP past its lease
// makes SagaTransfersStuck fire, then resolve once it is finished.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "http_get.hpp"
#include "kafka_client.hpp"
#include "process.hpp"
#include "sagapool/audit.hpp"
#include "sagapool/ledger.hpp"

namespace sagapool::test {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;

constexpr int kAccounts = 16;

std::string find_program(const std::string& name) {
  for (const char* dir : {"/usr/bin", "/usr/local/bin", "/bin"}) {
    const std::filesystem::path p = std::filesystem::path(dir) / name;
    if (std::filesystem::exists(p)) return p.string();
  }
  return {};
}

std::string request(const std::string& id, int from, int to, long long amount) {
  return R"({"id":")" + id + R"(","from":"p)" + std::to_string(from) + R"(","to":"p)" + std::to_string(to) +
         R"(","amount":)" + std::to_string(amount) + "}";
}

std::vector<std::pair<std::string, std::string>> transfers(const std::string& prefix, int first, int count) {
  std::vector<std::pair<std::string, std::string>> out;
  for (int i = first; i < first + count; ++i) {
    const int from = i % kAccounts;
    const int to = (from + 1 + (i / kAccounts) % (kAccounts - 1)) % kAccounts;
    out.emplace_back("p" + std::to_string(from), request(prefix + std::to_string(i), from, to, 1 + i % 97));
  }
  return out;
}

// monitoring/rules/alerts.yml with SagaTransfersStuck's threshold (120 s)
// and wait (1m) shortened; fails loudly if the rule no longer reads as
// expected. The monitoring files themselves are not touched.
std::string test_alerts() {
  std::string rules = read_file(source_dir() / "monitoring/rules/alerts.yml");
  const std::size_t begin = rules.find("- alert: SagaTransfersStuck");
  const std::size_t end = rules.find("- alert:", begin + 1);
  if (begin == std::string::npos || end == std::string::npos) throw std::runtime_error("no SagaTransfersStuck rule");
  std::string block = rules.substr(begin, end - begin);
  auto replace_once = [&](const std::string& from, const std::string& to) {
    const std::size_t at = block.find(from);
    if (at == std::string::npos || block.find(from, at + 1) != std::string::npos) {
      throw std::runtime_error("SagaTransfersStuck: expected exactly one '" + from + "'");
    }
    block.replace(at, from.size(), to);
  };
  replace_once("> 120\n", "> 3\n");
  replace_once("for: 1m\n", "for: 2s\n");
  return rules.substr(0, begin) + block + rules.substr(end);
}

class PrometheusLiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prometheus_bin_ = find_program("prometheus");
    promtool_bin_ = find_program("promtool");
    ASSERT_FALSE(prometheus_bin_.empty() || promtool_bin_.empty())
        << "prometheus/promtool not found: install Debian's prometheus package";
    broker_ = std::make_unique<Broker>(Broker::kafka(dir_, 4));
    // Two shards: stages commit one by one, so a paused worker can leave a
    // transfer visibly half-way.
    ASSERT_TRUE(Ledger::open(stores_, ledger_).is_ok());
    ASSERT_TRUE(ledger_->init().is_ok());
    for (int i = 0; i < kAccounts; ++i) {
      Account a;
      a.id = "p" + std::to_string(i);
      a.balance = a.opening_balance = 1'000'000'000'000;
      ASSERT_TRUE(ledger_->shard_for(a.id).create_accounts({&a, 1}).is_ok());
    }
  }

  Process start_worker(const std::string& name, int port) {
    std::vector<std::string> argv = {bin("saga-worker").string(), "--brokers", broker_->bootstrap(), "--group",
                                     "live", "--worker-id", name, "--metrics-addr",
                                     "127.0.0.1:" + std::to_string(port), "--lease", "15s",
                                     "--recovery-interval", "500ms", "--batch-size", "200",
                                     "--kafka-opt", "statistics.interval.ms=500"};
    for (const std::string& s : stores_) {
      argv.push_back("--store");
      argv.push_back(s);
    }
    return Process::start(argv, dir_ / (name + ".log"));
  }

  void start_prometheus(const std::vector<int>& worker_ports) {
    const auto rules = dir_ / "rules";
    std::filesystem::create_directories(rules);
    std::ofstream(rules / "alerts.yml") << test_alerts();
    std::filesystem::copy_file(source_dir() / "monitoring/rules/recording.yml", rules / "recording.yml");
    RunResult check = run({promtool_bin_, "check", "rules", (rules / "alerts.yml").string(),
                           (rules / "recording.yml").string()});
    ASSERT_EQ(check.exit_code, 0) << check.output;

    std::string targets;
    for (int p : worker_ports) targets += "          - 127.0.0.1:" + std::to_string(p) + "\n";
    std::ofstream(dir_ / "prometheus.yml")
        << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
        << "rule_files:\n  - " << (rules / "recording.yml").string() << "\n  - " << (rules / "alerts.yml").string()
        << "\nscrape_configs:\n  - job_name: saga-worker\n    static_configs:\n      - targets:\n"
        << targets;
    prom_port_ = free_loopback_port();
    prometheus_ = Process::start({prometheus_bin_, "--config.file=" + (dir_ / "prometheus.yml").string(),
                                  "--storage.tsdb.path=" + (dir_ / "prometheus-data").string(),
                                  "--web.listen-address=127.0.0.1:" + std::to_string(prom_port_),
                                  "--log.level=warn"},
                                 dir_ / "prometheus.log");
    ASSERT_TRUE(eventually([&] { return http_get(prom_port_, "/-/ready").status == 200; }, 30s))
        << read_file(dir_ / "prometheus.log");
  }

  // An instant query's result vector ([] on any failure).
  json query(const std::string& promql) {
    HttpReply r = http_get(prom_port_, "/api/v1/query?query=" + url_encode(promql));
    if (r.status != 200) return json::array();
    json j = json::parse(r.body, nullptr, false);
    if (j.is_discarded() || j.value("status", "") != "success") return json::array();
    return j["data"]["result"];
  }
  // The single value of a query that returns one sample; -1 otherwise.
  double scalar(const std::string& promql) {
    json result = query(promql);
    if (result.size() != 1) return -1;
    return std::stod(result[0]["value"][1].get<std::string>());
  }
  // Alerts as Prometheus holds them now ("name/state" each).
  std::vector<std::string> alerts() {
    std::vector<std::string> out;
    HttpReply r = http_get(prom_port_, "/api/v1/alerts");
    json j = json::parse(r.body, nullptr, false);
    if (j.is_discarded()) return {"<no answer from /api/v1/alerts>"};
    for (const json& a : j["data"]["alerts"]) {
      out.push_back(a["labels"]["alertname"].get<std::string>() + "/" + a["state"].get<std::string>());
    }
    return out;
  }
  bool firing(const std::string& alertname) {
    for (const std::string& a : alerts()) {
      if (a == alertname + "/firing") return true;
    }
    return false;
  }

  // Transfers in the store: all terminal with their outcome published.
  bool all_finished(std::int64_t expected) {
    std::int64_t finished = 0;
    bool open = false;
    Status s = ledger_->transfers().scan_transfer_states([&](std::string_view, TransferState st, bool notified) {
      if (is_terminal(st) && notified) ++finished;
      else open = true;
    });
    return s.is_ok() && !open && finished == expected;
  }

  std::string logs() {
    return "--- wA\n" + read_file(dir_ / "wA.log") + "--- wB\n" + read_file(dir_ / "wB.log") + "--- prometheus\n" +
           read_file(dir_ / "prometheus.log");
  }

  TempDir dir_;
  std::string prometheus_bin_, promtool_bin_;
  std::unique_ptr<Broker> broker_;
  std::vector<std::string> stores_ = {"sqlite:" + (dir_ / "shard0.db").string(),
                                      "sqlite:" + (dir_ / "shard1.db").string()};
  std::unique_ptr<Ledger> ledger_;
  int prom_port_ = 0;
  Process prometheus_;  // declared after dir_: killed before the folder goes
};

TEST_F(PrometheusLiveTest, HealthyRunThenAPausedWorkerFiresTheStuckAlert) {
  const int port_a = free_loopback_port();
  const int port_b = free_loopback_port();
  Process wa = start_worker("wA", port_a);
  Process wb = start_worker("wB", port_b);
  start_prometheus({port_a, port_b});
  ASSERT_TRUE(eventually(
      [&] { return http_get(port_a, "/readyz").status == 200 && http_get(port_b, "/readyz").status == 200; }, 40s))
      << logs();
  ASSERT_TRUE(eventually([&] { return scalar(R"(sum(up{job="saga-worker"}))") == 2; }, 20s)) << logs();

  // Warm-up, so request rates exist before the healthy window opens.
  produce(broker_->bootstrap(), "transfers.requests", transfers("warm-", 0, 200));
  ASSERT_TRUE(eventually([&] { return all_finished(200); }, 30s)) << logs();
  ASSERT_TRUE(eventually([&] { return scalar("sum(saga_transfers_finished_total)") == 200; }, 20s)) << logs();
  std::this_thread::sleep_for(2s);  // two rule evaluations on scraped data
  const std::time_t window_start = std::time(nullptr);

  // ---- healthy run: finished transfers increase, no alert at all ----------
  for (int i = 0; i < 6; ++i) {
    produce(broker_->bootstrap(), "transfers.requests", transfers("ok-", i * 100, 100));
    std::this_thread::sleep_for(300ms);
  }
  ASSERT_TRUE(eventually([&] { return all_finished(800); }, 30s)) << logs();
  ASSERT_TRUE(eventually([&] { return scalar("sum(saga_transfers_finished_total)") == 800; }, 20s)) << logs();
  EXPECT_GT(scalar("sum(increase(saga_transfers_finished_total[1m]))"), 0);
  EXPECT_EQ(scalar(R"(sum(saga_transfers_finished_total{outcome="done"}))"), 800);
  ASSERT_TRUE(eventually([&] { return scalar("max(saga_ledger_imbalance)") == 0; }, 20s)) << logs();
  // The store gauges are read at most once a second and scraped after that.
  EXPECT_TRUE(eventually([&] { return scalar("max(saga_transfers)") == 0; }, 10s))
      << "unfinished transfers still reported: " << scalar("max(saga_transfers)");
  EXPECT_GE(scalar("count(job_state:saga_transfers:max)"), 4);
  const auto healthy_s = std::time(nullptr) - window_start + 1;
  json during = query("count_over_time(ALERTS[" + std::to_string(healthy_s) + "s])");
  EXPECT_TRUE(during.empty()) << "alerts pending or firing on a healthy run: " << during.dump();
  EXPECT_TRUE(alerts().empty()) << ::testing::PrintToString(alerts());

  // ---- a worker paused half-way through a batch ----------------------------
  // Keep requests coming and pause wA until it holds an unfinished transfer
  // in the store (it may just as well be waiting on Kafka: then let it go and
  // try again).
  std::atomic<bool> loading{true};
  std::mutex load_mu;
  std::string load_error;
  int produced = 0;
  std::jthread load([&] {
    for (int i = 0; loading.load(); ++i) {
      try {
        produce(broker_->bootstrap(), "transfers.requests", transfers("load-", i * 150, 150));
      } catch (const std::exception& e) {
        std::lock_guard lock(load_mu);
        load_error = e.what();
        return;
      }
      {
        std::lock_guard lock(load_mu);
        produced += 150;
      }
      std::this_thread::sleep_for(50ms);
    }
  });
  struct StopLoad {  // destroyed before `load` joins, even when an assertion returns
    std::atomic<bool>& flag;
    ~StopLoad() { flag = false; }
  } stop_load{loading};
  std::optional<TransferDoc> stuck;
  // The states unfinished transfers are in while wA is paused: wA may hold
  // several, and on SQLite a paused wA holding a shard's write lock stalls
  // wB's transfers too (a real stuck transfer, which the alert must name).
  std::set<std::string> held_states;
  const auto note_unfinished = [&] {
    std::vector<TransferDoc> open;
    if (!ledger_->transfers().list_stale(std::numeric_limits<std::int64_t>::max(), 10000, open).is_ok()) return;
    for (const TransferDoc& d : open) held_states.insert(std::string(to_string(d.state)));
  };
  std::mt19937 rng(11);
  const auto search_deadline = std::chrono::steady_clock::now() + 30s;
  int pauses = 0;
  while (!stuck && std::chrono::steady_clock::now() < search_deadline) {
    ++pauses;
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 120));
    wa.signal(SIGSTOP);
    std::this_thread::sleep_for(50ms);  // let a stage commit that was on its way
    std::vector<TransferDoc> open;
    ASSERT_TRUE(ledger_->transfers().list_stale(std::numeric_limits<std::int64_t>::max(), 10000, open).is_ok());
    for (const TransferDoc& d : open) {
      if (d.owner == "wA") stuck = d;
    }
    if (stuck) note_unfinished();
    if (!stuck) wa.signal(SIGCONT);
  }
  loading = false;
  load.join();
  {
    std::lock_guard lock(load_mu);
    ASSERT_TRUE(load_error.empty()) << load_error;
  }
  ASSERT_TRUE(stuck.has_value()) << "wA was never caught holding an unfinished transfer" << logs();
  std::printf("paused wA %d time(s) before it held an unfinished transfer (%s; states %s)\n",
              pauses, stuck->id.c_str(), ::testing::PrintToString(held_states).c_str());

  ASSERT_TRUE(eventually([&] { return firing("SagaTransfersStuck"); }, 30s))
      << ::testing::PrintToString(alerts()) << logs();
  json fired = query(R"(ALERTS{alertname="SagaTransfersStuck",alertstate="firing"})");
  ASSERT_FALSE(fired.empty());
  note_unfinished();
  for (const json& alert : fired) {
    EXPECT_EQ(held_states.count(alert["metric"]["state"].get<std::string>()), 1U)
        << alert.dump() << " names a state no unfinished transfer is in: "
        << ::testing::PrintToString(held_states);
    EXPECT_EQ(alert["metric"]["severity"].get<std::string>(), "critical");
  }

  // Past its lease on the store's clock, then let it go: recovery (or the
  // resumed worker, if nobody could claim it meanwhile) finishes it.
  ASSERT_TRUE(eventually(
      [&] {
        std::int64_t now = 0;
        return ledger_->transfers().now_ms(now).is_ok() && now > stuck->lease_until_ms + 500;
      },
      30s));
  wa.signal(SIGCONT);
  ASSERT_TRUE(eventually(
      [&] {
        std::optional<TransferDoc> d;
        return ledger_->transfers().load_transfer(stuck->id, d).is_ok() && d && is_terminal(d->state);
      },
      30s))
      << logs();
  ASSERT_TRUE(eventually([&] { return !firing("SagaTransfersStuck"); }, 20s))
      << ::testing::PrintToString(alerts()) << logs();

  // Every request finished once, and the ledger balances.
  const std::int64_t total = 800 + produced;
  ASSERT_TRUE(eventually([&] { return all_finished(total); }, 60s)) << logs();
  AuditReport report;
  ASSERT_TRUE(run_audit(*ledger_, {}, report).is_ok());
  EXPECT_TRUE(report.ok()) << report.to_text();
  ASSERT_TRUE(eventually([&] { return scalar("max(saga_ledger_imbalance)") == 0; }, 30s)) << logs();
  EXPECT_TRUE(eventually(
      [&] { return scalar("sum(saga_transfers_finished_total)") >= static_cast<double>(total); }, 20s));

  EXPECT_EQ(wa.stop(20s), 0) << logs();
  EXPECT_EQ(wb.stop(20s), 0) << logs();
  EXPECT_EQ(prometheus_.stop(10s), 0) << read_file(dir_ / "prometheus.log");
}

}  // namespace
}  // namespace sagapool::test
