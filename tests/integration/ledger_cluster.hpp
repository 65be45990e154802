#pragma once
// What the end-to-end and fault tests share: a ledger of N shards, each on
// its own throwaway PostgreSQL server (or one SQLite file, or one database
// of a throwaway FerretDB that all shards share), a saga-broker,
// saga-worker processes on every shard, a workload whose outcome is known
// in advance, and the checks run at the end (every id one outcome, exact
// balances, the audit).
//
// The servers are started, stopped and restarted on the test's main thread:
// a server's death signal is tied to the thread that started it.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ferret_server.hpp"
#include "kafka_client.hpp"
#include "kafka_cluster.hpp"
#include "pg_server.hpp"
#include "process.hpp"
#include "sagapool/audit.hpp"
#include "sagapool/ledger.hpp"

namespace sagapool::test {

// One request and the outcome it must reach, whatever the interleaving: the
// accounts hold far more than the ordinary transfers can take out, so only
// the overdrafts (more money than the ledger holds) and the transfers
// naming an unknown account are canceled.
struct PlannedTransfer {
  std::string id;
  std::string from;
  std::string to;
  std::int64_t amount = 0;
  std::string state;   // done | canceled
  std::string reason;  // "" for done
};

class LedgerCluster {
 public:
  static constexpr std::int64_t kOpening = 10'000'000;

  enum class Backend { postgresql, sqlite, mongodb };
  struct Options {
    int partitions = 6;
    int brokers = 1;  // real Kafka nodes (1 or 3), or saga-broker's mock brokers
    // Real Apache Kafka (tools/kafka/kafka.sh): topics with replication
    // min(3, brokers) and min.insync.replicas min(2, brokers). false:
    // saga-broker, for tests that inject faults through its control channel.
    bool real_kafka = true;
    // Real Kafka only: more configs of transfers.dlq (max.message.bytes, ...).
    std::vector<std::pair<std::string, std::string>> dlq_configs;
    // Real Kafka only: SASL_SSL and ACLs; the test's own clients are "admin".
    std::optional<SaslSsl> sasl_ssl;
    Backend backend = Backend::postgresql;  // SQLite: one shard
  };

  LedgerCluster(int shards, int accounts) : LedgerCluster(shards, accounts, Options{}) {}
  LedgerCluster(int shards, int accounts, const Options& options) : accounts_(accounts) {
    if (options.real_kafka) {
      kafka_ = std::make_unique<KafkaCluster>(dir_, options.brokers, options.sasl_ssl);
      bootstrap_ = kafka_->bootstrap();
      client_config_ = kafka_->admin_config();
      const int replication = std::min(3, options.brokers);
      const std::string min_insync = std::to_string(std::min(2, options.brokers));
      for (const std::string topic : {"transfers.requests", "transfers.results", "transfers.dlq"}) {
        std::vector<std::pair<std::string, std::string>> configs = {
            {"min.insync.replicas", min_insync}};
        if (topic == "transfers.dlq") {
          configs.insert(configs.end(), options.dlq_configs.begin(), options.dlq_configs.end());
        }
        kafka_->create_topic(topic, options.partitions, replication, configs);
      }
    } else {
      broker_ = std::make_unique<Broker>(Broker::start(dir_, options.partitions, options.brokers));
      bootstrap_ = broker_->bootstrap();
    }
    std::vector<std::string> own_urls;
    for (int i = 0; i < shards; ++i) {
      if (options.backend == Backend::sqlite) {
        urls_.push_back("sqlite:" + (dir_ / ("ledger-" + std::to_string(i) + ".db")).string());
        own_urls.push_back(urls_.back());
        continue;
      }
      if (options.backend == Backend::mongodb) {
        if (!ferret_) ferret_ = std::make_unique<FerretServer>();
        urls_.push_back(ferret_->url("ledger" + std::to_string(i)));
        own_urls.push_back(urls_.back());
        continue;
      }
      servers_.push_back(std::make_unique<PgServer>());
      urls_.push_back(servers_.back()->create_database("ledger"));
      // The test's own connections carry another application_name, so that
      // faults aimed at the workers' connections spare them.
      own_urls.push_back(urls_.back() + "?application_name=sagapool-test");
    }
    Status s = Ledger::open(own_urls, ledger_);
    if (s) s = ledger_->init();
    if (!s) throw std::runtime_error("ledger set-up: " + s.message());
    std::vector<std::vector<Account>> per_shard(ledger_->shard_count());
    for (int i = 0; i < accounts_; ++i) {
      Account& a = per_shard[ledger_->shard_index(account_id(i))].emplace_back();
      a.id = account_id(i);
      a.balance = a.opening_balance = kOpening;
      opening_[a.id] = kOpening;
    }
    for (std::size_t i = 0; i < per_shard.size() && s; ++i) {
      s = ledger_->shard(i).create_accounts(per_shard[i]);
    }
    if (!s) throw std::runtime_error("create accounts: " + s.message());
  }

  static std::string account_id(int i) { return "acct-" + std::to_string(i); }

  TempDir& dir() { return dir_; }
  Broker& broker() { return *broker_; }        // saga-broker only (real_kafka = false)
  KafkaCluster& kafka() { return *kafka_; }    // real Kafka only
  const std::string& bootstrap() const { return bootstrap_; }
  // librdkafka settings of the test's own clients (security, if any).
  const KafkaConfig& client_config() const { return client_config_; }
  Ledger& ledger() { return *ledger_; }
  PgServer& server(std::size_t shard) { return *servers_.at(shard); }
  const std::vector<std::string>& urls() const { return urls_; }

  // saga-worker on every shard, short leases so that recovery is quick; no
  // HTTP listener unless `metrics_addr` names one. `extra` arguments come
  // last (a flag there replaces its default above), `env` is added to the
  // environment.
  Process start_worker(const std::string& name, const std::string& metrics_addr = "",
                       const std::vector<std::string>& extra = {},
                       const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv = {bin("saga-worker").string(),
                                     "--brokers",
                                     bootstrap_,
                                     "--group",
                                     "g",
                                     "--worker-id",
                                     name,
                                     "--metrics-addr",
                                     metrics_addr,
                                     "--lease",
                                     "2s",
                                     "--recovery-interval",
                                     "200ms",
                                     "--batch-size",
                                     "200",
                                     "--drain-timeout",
                                     "10s"};
    for (const std::string& url : urls_) argv.insert(argv.end(), {"--store", url});
    for (const std::string& flag : extra) {
      const auto at = std::find(argv.begin(), argv.end(), flag);
      if (flag.starts_with("--") && flag != "--store" && at != argv.end()) argv.erase(at, at + 2);
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    return Process::start(argv, log_of(name), env, /*die_with_parent=*/true);
  }
  std::filesystem::path log_of(const std::string& worker) const { return dir_ / (worker + ".log"); }
  // The worker's log says it was assigned partitions: it joined the group.
  // A join can take tens of seconds on a loaded host (it once took over
  // 30 s on saga-broker, before any request was sent).
  bool joined(const std::string& worker) const {
    return eventually([&] { return read_file(log_of(worker)).find("assigned") != std::string::npos; },
                      std::chrono::seconds(60));
  }
  // Every worker's and Kafka node's log tail, for a failing test's output.
  std::string log_tails(std::size_t lines = 40) const { return test::log_tails(dir_.path(), lines); }

  // `n` requests: mostly ordinary transfers (many across shards), 3% that
  // overdraw, 3% that name an unknown account (as source or destination).
  std::vector<PlannedTransfer> plan(int n, std::uint64_t seed) const {
    std::mt19937_64 rng(seed);
    std::vector<PlannedTransfer> out;
    for (int i = 0; i < n; ++i) {
      PlannedTransfer t;
      t.id = "t-" + std::to_string(seed) + "-" + std::to_string(i);
      const int from = static_cast<int>(rng() % static_cast<std::uint64_t>(accounts_));
      const int to =
          (from + 1 + static_cast<int>(rng() % static_cast<std::uint64_t>(accounts_ - 1))) %
          accounts_;
      t.from = account_id(from);
      t.to = account_id(to);
      t.amount = 1 + static_cast<std::int64_t>(rng() % 1000);
      t.state = "done";
      const auto dice = rng() % 100;
      if (dice < 3) {
        t.amount = kOpening * accounts_ + 1;  // more than the whole ledger holds
        t.state = "canceled";
        t.reason = "insufficient_funds";
      } else if (dice < 6) {
        (dice % 2 == 0 ? t.from : t.to) = "ghost-" + std::to_string(i);
        t.state = "canceled";
        t.reason = "unknown_account";
      }
      out.push_back(std::move(t));
    }
    return out;
  }

  std::size_t cross_shard(const std::vector<PlannedTransfer>& transfers) const {
    std::size_t n = 0;
    for (const auto& t : transfers) {
      if (ledger_->shard_index(t.from) != ledger_->shard_index(t.to)) ++n;
    }
    return n;
  }

  static std::string request(const PlannedTransfer& t) {
    return R"({"id":")" + t.id + R"(","from":")" + t.from + R"(","to":")" + t.to +
           R"(","amount":)" + std::to_string(t.amount) + "}";
  }

  // Publishes in chunks of `chunk`, `pause` apart (so faults land while
  // requests are still arriving). Runs on a background thread. Keyed by the
  // source account, as upstream systems do, or by id: with a few accounts
  // the source keys fill only some partitions, and maybe only one worker's.
  enum class Key { source, id };
  std::thread produce_paced(const std::vector<PlannedTransfer>& transfers, std::size_t chunk,
                            std::chrono::milliseconds pause, Key key = Key::source) {
    std::vector<std::pair<std::string, std::string>> messages;
    for (const auto& t : transfers) messages.emplace_back(key == Key::id ? t.id : t.from, request(t));
    return std::thread([this, messages = std::move(messages), chunk, pause] {
      // As upstream producers should: idempotent, acks from all in-sync
      // replicas, and patient enough to ride out a whole-cluster restart.
      std::vector<std::pair<std::string, std::string>> config = {
          {"enable.idempotence", "true"}, {"acks", "all"}, {"message.timeout.ms", "180000"}};
      config.insert(config.end(), client_config_.begin(), client_config_.end());
      try {
        for (std::size_t i = 0; i < messages.size(); i += chunk) {
          const auto end = messages.begin() + static_cast<long>(std::min(i + chunk, messages.size()));
          produce(bootstrap_, "transfers.requests", {messages.begin() + static_cast<long>(i), end}, config);
          std::this_thread::sleep_for(pause);
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << "publishing the requests: " << e.what();
      }
    });
  }

  // Repeats a call the store asks to repeat: the test's own connection to a
  // restarted server is found closed on its next use, and reopened.
  template <typename Call>
  static Status retrying(Call&& call) {
    Status s;
    for (int attempt = 0; attempt < 20; ++attempt) {
      s = call();
      if (!s.is_transient()) return s;
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    return s;
  }

  // Terminal and published, as the first store sees it; store errors (a
  // shard being restarted) count as "not yet".
  std::size_t finished(bool& open) {
    std::size_t done = 0;
    open = false;
    const Status s = ledger_->transfers().scan_transfer_states(
        [&](std::string_view, TransferState state, bool notified) {
          if (is_terminal(state) && notified)
            ++done;
          else
            open = true;
        });
    if (!s) open = true;
    return done;
  }
  bool wait_finished(std::size_t n, std::chrono::milliseconds timeout) {
    return eventually(
        [&] {
          bool open = false;
          return finished(open) == n && !open;
        },
        timeout);
  }

  // Every id reaches exactly one outcome (republished copies agree), the one
  // planned; no outcome for an id never requested.
  void expect_outcomes(const std::vector<PlannedTransfer>& transfers) {
    std::map<std::string, std::set<std::string>> seen;
    std::size_t messages = 0;
    std::set<std::string> ids;
    for (const auto& t : transfers) ids.insert(t.id);
    for (const Record& r :
         consume_keys(bootstrap_, "transfers.results", ids, std::chrono::seconds(60), client_config_)) {
      const auto j = nlohmann::json::parse(r.value);
      const std::string id = j.at("id").get<std::string>();
      EXPECT_EQ(r.key, id);
      const std::string reason = j.at("reason").is_null() ? "" : j.at("reason").get<std::string>();
      seen[id].insert(j.at("state").get<std::string>() + "/" + reason);
      ++messages;
    }
    EXPECT_EQ(seen.size(), transfers.size());
    std::size_t wrong = 0;
    for (const auto& t : transfers) {
      const auto it = seen.find(t.id);
      if (it == seen.end()) {
        ADD_FAILURE() << "no outcome for " << t.id;
        if (++wrong > 10) break;
        continue;
      }
      const std::set<std::string> expected{t.state + "/" + t.reason};
      if (it->second != expected) {
        std::string got;
        for (const auto& o : it->second) got += o + " ";
        ADD_FAILURE() << t.id << ": expected " << *expected.begin() << ", got " << got;
        if (++wrong > 10) break;
      }
      seen.erase(it);
    }
    for (const auto& [id, outcomes] : seen) ADD_FAILURE() << "outcome for unknown id " << id;
    std::cout << "outcomes: " << transfers.size() << " ids, " << (messages - transfers.size())
              << " published more than once\n";
  }

  // Each account ends at opening + what the done transfers moved: nothing
  // lost, nothing applied twice.
  void expect_balances(const std::vector<PlannedTransfer>& transfers) {
    std::map<std::string, std::int64_t> expected = opening_;
    for (const auto& t : transfers) {
      if (t.state != "done") continue;
      expected[t.from] -= t.amount;
      expected[t.to] += t.amount;
    }
    std::map<std::string, std::int64_t> actual;
    for (std::size_t s = 0; s < ledger_->shard_count(); ++s) {
      const Status st = retrying([&] {
        return ledger_->shard(s).scan_accounts([&](const Account& a) { actual[a.id] = a.balance; });
      });
      ASSERT_TRUE(st.is_ok()) << st.message();
    }
    EXPECT_EQ(actual, expected);
  }

  void expect_audit_passes() {
    AuditReport report;
    const Status s = retrying([&] { return run_audit(*ledger_, {}, report); });
    ASSERT_TRUE(s.is_ok()) << s.message();
    EXPECT_TRUE(report.ok()) << report.to_text();
  }

 private:
  TempDir dir_{"sagapool-pg-e2e"};
  int accounts_;
  std::unique_ptr<Broker> broker_;
  std::unique_ptr<KafkaCluster> kafka_;
  std::string bootstrap_;
  KafkaConfig client_config_;
  std::vector<std::unique_ptr<PgServer>> servers_;
  std::unique_ptr<FerretServer> ferret_;  // Backend::mongodb: every shard's database
  std::vector<std::string> urls_;
  std::unique_ptr<Ledger> ledger_;
  std::map<std::string, std::int64_t> opening_;
};

}  // namespace sagapool::test
