// saga-worker with fail points (SAGA_FAILPOINTS, docs/RELIABILITY.md): a
// worker crashes exactly at a named point (SIGKILL, no cleanup), a worker
// without fail points takes over after the 2 s lease, and the ledger ends
// balanced with every request finished exactly once and its outcome
// published. Also: a worker paused past its lease while another finishes its
// work (a zombie), injected store errors, and bad specs refused at start-up.
// The same cases (bad specs aside) run on SQLite and on mongodb:// stores (a
// throwaway FerretDB, one database per store), where no store has a
// transaction: every stage commits on its own even with one store.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <map>
#include <random>
#include <set>

#include "ferret_server.hpp"
#include "http_get.hpp"
#include "kafka_client.hpp"
#include "pg_server.hpp"
#include "process.hpp"
#include "sagapool/audit.hpp"
#include "sagapool/ledger.hpp"
#include "sagapool/two_phase.hpp"

namespace sagapool::test {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;

constexpr int kRequests = 240;
constexpr int kAccounts = 8;

std::string request(const std::string& id, const std::string& from, const std::string& to, long long amount) {
  return R"({"id":")" + id + R"(","from":")" + from + R"(","to":")" + to + R"(","amount":)" +
         std::to_string(amount) + "}";
}

// postgres: one server, a database per store; on several, a batch runs in
// one transaction on each, committed by two-phase commit (TwoPhaseBatch).
enum class StoreKind { sqlite, mongodb, postgres };

class FailpointTest : public ::testing::Test {
 protected:
  void open_ledger(std::size_t stores, StoreKind kind = StoreKind::sqlite) {
    broker_ = std::make_unique<Broker>(Broker::kafka(dir_, 2));
    kind_ = kind;
    if (kind == StoreKind::mongodb) ferret_ = std::make_unique<FerretServer>();
    if (kind == StoreKind::postgres) pg_ = std::make_unique<PgServer>();
    for (std::size_t i = 0; i < stores; ++i) {
      const std::string name = "ledger" + std::to_string(i);
      store_args_.push_back("--store");
      store_args_.push_back(kind == StoreKind::mongodb    ? ferret_->url(name)
                            : kind == StoreKind::postgres ? pg_->create_database(name)
                                                          : "sqlite:" + (dir_ / (name + ".db")).string());
      urls_.push_back(store_args_.back());
    }
    ASSERT_TRUE(Ledger::open(urls_, ledger_).is_ok());
    ASSERT_TRUE(ledger_->init().is_ok());
    for (int i = 0; i < kAccounts; ++i) {
      Account a;
      a.id = "f" + std::to_string(i);
      a.balance = a.opening_balance = 3000;
      a.locked = i == kAccounts - 1;  // refuses its legs: compensation paths
      ASSERT_TRUE(ledger_->shard_for(a.id).create_accounts({&a, 1}).is_ok());
    }
  }

  // Requests that take every path: applied, insufficient funds, unknown
  // destination (debit reversed), locked account; some sent twice. With
  // `invalid_every`, a message that is no JSON after every so many
  // requests (kept in invalid_, each different). On two stores each has an
  // account on the second, so every point fires where stages commit one by
  // one (a transfer wholly on the first would run in the insert's
  // transaction there, Worker::write_batch).
  void produce_requests(int invalid_every = 0) {
    std::mt19937_64 rng(11);
    std::vector<std::pair<std::string, std::string>> messages;
    for (int i = 0; i < kRequests; ++i) {
      std::string src, dst;
      do {
        const int from = static_cast<int>(rng() % (kAccounts - 1));
        const int to = (from + 1 + static_cast<int>(rng() % (kAccounts - 1))) % kAccounts;
        src = "f" + std::to_string(from);
        dst = i % 17 == 0 ? "ghost" : "f" + std::to_string(to);
      } while (ledger_->shard_count() > 1 && ledger_->shard_index(src) == 0 && ledger_->shard_index(dst) == 0);
      const long long amount = 1 + static_cast<long long>(rng() % 700);
      const std::string id = "fp-" + std::to_string(i);
      ids_.insert(id);
      messages.emplace_back(src, request(id, src, dst, amount));
      if (i % 9 == 0) messages.emplace_back(src, request(id, src, dst, amount));  // a duplicate
      if (invalid_every > 0 && i % invalid_every == 0) {
        messages.emplace_back(src, "not json " + std::to_string(i));
        invalid_.insert(messages.back().second);
      }
    }
    produce(broker_->bootstrap(), "transfers.requests", messages);
  }

  // metrics_port 0: no /metrics.
  Process start_worker(const std::string& name, const std::vector<std::string>& env = {}, int metrics_port = 0) {
    const std::string metrics = metrics_port > 0 ? "127.0.0.1:" + std::to_string(metrics_port) : "";
    std::vector<std::string> argv = {bin("saga-worker").string(), "--brokers", broker_->bootstrap(), "--group", "g",
                                     "--worker-id", name, "--metrics-addr", metrics, "--lease", "2s",
                                     "--recovery-interval", "200ms", "--batch-size",
                                     // On FerretDB a batch of 40 takes longer than the
                                     // lease: the worker would keep taking over its own.
                                     kind_ == StoreKind::mongodb ? "10" : "40",
                                     // A crashed member leaves the group after 6 s (the
                                     // shortest Kafka's group.min.session.timeout.ms allows).
                                     "--kafka-opt", "session.timeout.ms=6000", "--kafka-opt",
                                     "heartbeat.interval.ms=300"};
    argv.insert(argv.end(), store_args_.begin(), store_args_.end());
    return Process::start(argv, dir_ / (name + ".log"), env);
  }

  // The worker's log says it holds a partition now: its last
  // "rebalance: ... N assigned now" has N > 0.
  bool holds_partitions(const std::string& name) {
    const std::string log = read_file(dir_ / (name + ".log"));
    const std::size_t end = log.rfind(" assigned now");
    if (end == std::string::npos) return false;
    const std::size_t begin = log.find_last_not_of("0123456789", end - 1) + 1;
    return begin < end && std::stoi(log.substr(begin, end - begin)) > 0;
  }

  bool all_finished_and_published() {
    std::size_t finished = 0;
    bool open = false;
    EXPECT_TRUE(ledger_->transfers()
                    .scan_transfer_states([&](std::string_view, TransferState s, bool notified) {
                      if (is_terminal(s) && notified) ++finished;
                      else open = true;
                    })
                    .is_ok());
    return !open && finished == ids_.size();
  }

  // On FerretDB every stage takes far longer, and under load a batch can
  // outlast its lease and be taken over again: more time there.
  std::chrono::seconds patience() const { return kind_ == StoreKind::mongodb ? 180s : 60s; }

  // Polled every 50 ms, on FerretDB every 500 ms: it reads the whole
  // collection for this, and would slow the workers down.
  bool wait_all_finished_and_published() {
    return eventually([&] { return all_finished_and_published(); }, patience(),
                      kind_ == StoreKind::mongodb ? 500ms : 50ms);
  }

  // Every request: one transfer, terminal, and every outcome message for it
  // the same as the ledger's.
  void expect_exactly_once() {
    std::map<std::string, std::vector<json>> by_id;
    for (const Record& r : consume_keys(broker_->bootstrap(), "transfers.results", ids_, 60s)) {
      json j = json::parse(r.value);
      by_id[j.at("id").get<std::string>()].push_back(std::move(j));
    }
    EXPECT_EQ(by_id.size(), ids_.size());
    for (const std::string& id : ids_) {
      std::optional<TransferDoc> d;
      ASSERT_TRUE(ledger_->transfers().load_transfer(id, d).is_ok());
      ASSERT_TRUE(d.has_value()) << id << " lost";
      EXPECT_TRUE(is_terminal(d->state)) << id;
      const auto it = by_id.find(id);
      ASSERT_NE(it, by_id.end()) << "no outcome for " << id;
      for (const json& o : it->second) {
        EXPECT_EQ(o.at("state").get<std::string>(), std::string(to_string(d->state))) << id;
        EXPECT_EQ(o.at("amount").get<std::int64_t>(), d->amount) << id;
      }
    }
    AuditReport report;
    ASSERT_TRUE(run_audit(*ledger_, {}, report).is_ok());
    EXPECT_TRUE(report.ok()) << report.to_text();
    // No batch across stores left prepared (its rows locked).
    for (std::size_t i = 0; i < ledger_->shard_count(); ++i) {
      std::vector<std::string> prepared;
      ASSERT_TRUE(ledger_->shard(i).list_prepared(kBatchGidPrefix, 0, prepared).is_ok());
      EXPECT_TRUE(prepared.empty()) << "store " << i << " holds " << prepared.size() << " prepared";
    }
  }

  // A zombie: paused after its debits for longer than its lease, while another
  // worker recovers and finishes its transfers; when it resumes, its stale
  // epoch fences it out. Two stores, so every stage commits on its own.
  void a_paused_worker_is_fenced_out_when_it_resumes(StoreKind kind) {
    open_ledger(2, kind);
    Process zombie = start_worker("zombie", {"SAGA_FAILPOINTS=after_debit=1*pause:5s"});
    Process other = start_worker("other");
    // Requests only once each worker holds one of the two partitions: a
    // zombie that joined late found its partition drained by the other
    // worker and never paused (seen once in CI).
    ASSERT_TRUE(eventually([&] { return holds_partitions("zombie") && holds_partitions("other"); }, patience()))
        << read_file(dir_ / "zombie.log") << read_file(dir_ / "other.log");
    produce_requests();
    ASSERT_TRUE(eventually([&] { return read_file(dir_ / "zombie.log").find("resuming") != std::string::npos; },
                           patience()))
        << read_file(dir_ / "zombie.log");
    EXPECT_TRUE(wait_all_finished_and_published());
    EXPECT_NE(read_file(dir_ / "other.log").find("recovered: its lease had expired transfer_id="), std::string::npos)
        << "the other worker should have taken over the paused one's transfers\n"
        << read_file(dir_ / "other.log");
    EXPECT_EQ(zombie.stop(20s), 0) << read_file(dir_ / "zombie.log");
    EXPECT_EQ(other.stop(20s), 0) << read_file(dir_ / "other.log");
    expect_exactly_once();
  }

  // Injected store errors leave the affected transfers to recovery.
  void injected_store_errors_are_recovered(StoreKind kind) {
    open_ledger(1, kind);
    produce_requests();
    Process w =
        start_worker("flaky", {"SAGA_FAILPOINTS=after_credit=2*error,before_finish=1*error,after_insert=1*error"});
    EXPECT_TRUE(wait_all_finished_and_published()) << read_file(dir_ / "flaky.log");
    EXPECT_NE(read_file(dir_ / "flaky.log").find("fail point after_credit: injected error"), std::string::npos);
    EXPECT_EQ(w.stop(20s), 0) << read_file(dir_ / "flaky.log");
    expect_exactly_once();
  }

  TempDir dir_;
  std::unique_ptr<Broker> broker_;
  StoreKind kind_ = StoreKind::sqlite;
  std::unique_ptr<FerretServer> ferret_;  // mongodb:// stores: one database each
  std::unique_ptr<PgServer> pg_;          // postgres: one database each
  std::vector<std::string> store_args_;
  std::vector<std::string> urls_;
  std::unique_ptr<Ledger> ledger_;
  std::set<std::string> ids_;
  std::set<std::string> invalid_;
};

struct CrashCase {
  std::string point;
  std::size_t stores;  // 1: SQLite with one transaction per batch; 2: every stage commits (MongoDB: either way)
  StoreKind kind = StoreKind::sqlite;
};

void PrintTo(const CrashCase& c, std::ostream* os) {
  const char* kinds[] = {" sqlite", " mongodb", " postgres"};
  *os << c.point << " on " << c.stores << kinds[static_cast<int>(c.kind)] << " store(s)";
}

std::string crash_case_name(const ::testing::TestParamInfo<CrashCase>& p) {
  return p.param.point + "_" + std::to_string(p.param.stores) + "_store" + (p.param.stores > 1 ? "s" : "");
}

class FailpointCrash : public FailpointTest, public ::testing::WithParamInterface<CrashCase> {};

TEST_P(FailpointCrash, CrashThereThenARestartFinishesEverythingExactlyOnce) {
  const CrashCase& c = GetParam();
  open_ledger(c.stores, c.kind);
  produce_requests();
  Process doomed = start_worker("doomed", {"SAGA_FAILPOINTS=" + c.point + "=crash"});
  const std::optional<int> code = doomed.wait(patience());
  ASSERT_TRUE(code.has_value()) << "the worker never reached " << c.point << ":\n" << read_file(dir_ / "doomed.log");
  EXPECT_EQ(*code, 128 + 9) << read_file(dir_ / "doomed.log");
  EXPECT_NE(read_file(dir_ / "doomed.log").find("fail point " + c.point + ": crash"), std::string::npos)
      << read_file(dir_ / "doomed.log");

  Process rescuer = start_worker("rescuer");
  EXPECT_TRUE(wait_all_finished_and_published()) << read_file(dir_ / "rescuer.log");
  EXPECT_EQ(rescuer.stop(20s), 0) << read_file(dir_ / "rescuer.log");
  expect_exactly_once();
}

INSTANTIATE_TEST_SUITE_P(
    Points, FailpointCrash,
    ::testing::Values(CrashCase{"after_insert", 1}, CrashCase{"after_insert", 2}, CrashCase{"before_finish", 2},
                      CrashCase{"after_debit", 1}, CrashCase{"after_debit", 2}, CrashCase{"after_credit", 2},
                      CrashCase{"after_apply", 2}, CrashCase{"after_cleanup", 2},
                      CrashCase{"after_compensate", 1}, CrashCase{"before_finish", 1},
                      CrashCase{"after_finish", 2}, CrashCase{"before_publish", 1},
                      CrashCase{"before_store_offsets", 1}),
    crash_case_name);

// On FerretDB a case takes ~40 s (SQLite: ~12 s), all of them ~8 minutes: a
// point of each kind of work a crash can leave behind instead. A batch
// inserted but not begun (re-consumed: its requests are duplicates); a debit
// posted on one shard whose credit on the other is not; a reversal written
// but the transfer not finished; a terminal transfer whose outcome is not
// published (the outbox). Every point of the list above passes there too.
INSTANTIATE_TEST_SUITE_P(MongoDB, FailpointCrash,
                         ::testing::Values(CrashCase{"after_insert", 1, StoreKind::mongodb},
                                           CrashCase{"after_debit", 2, StoreKind::mongodb},
                                           CrashCase{"after_compensate", 1, StoreKind::mongodb},
                                           CrashCase{"after_finish", 2, StoreKind::mongodb}),
                         crash_case_name);

// Two PostgreSQL stores: a batch in one transaction on each. A crash
// before the commit point (the first store's COMMIT) leaves the second
// store's transaction prepared, to be rolled back; one after it leaves it
// prepared, to be committed; the rescuer finds either after a lease.
INSTANTIATE_TEST_SUITE_P(Postgres, FailpointCrash,
                         ::testing::Values(CrashCase{"after_walk", 2, StoreKind::postgres},
                                           CrashCase{"after_prepare", 2, StoreKind::postgres},
                                           CrashCase{"after_commit_point", 2, StoreKind::postgres},
                                           CrashCase{"before_publish", 2, StoreKind::postgres}),
                         crash_case_name);

// Paused between prepare and commit for longer than the lease: the rescuer
// asks the first store for the decision and waits on the paused batch's
// open transaction, which the server ends after 5 s idle (the decision is
// then an abort); the paused worker's COMMIT fails when it resumes, and its
// batch runs again.
// The value of one series in a /metrics text, or -1 when it is missing.
double sample(const std::string& text, const std::string& series) {
  const std::string line = "\n" + series + " ";
  const std::size_t at = text.find(line);
  return at == std::string::npos ? -1 : std::stod(text.substr(at + line.size()));
}

TEST_F(FailpointTest, APausedBatchAcrossStoresIsRolledBackAndRunsAgain) {
  open_ledger(2, StoreKind::postgres);
  produce_requests();
  const int port = free_loopback_port();
  Process zombie = start_worker("zombie", {"SAGA_FAILPOINTS=after_prepare=1*pause:8s"}, port);
  ASSERT_TRUE(eventually([&] { return read_file(dir_ / "zombie.log").find("pausing") != std::string::npos; },
                         patience()))
      << read_file(dir_ / "zombie.log");
  // Its batch is prepared on the second store: the gauges show it, with
  // the time it was prepared.
  std::string text;
  const auto prepared = [&](double count) {
    text = http_get(port, "/metrics").body;
    return sample(text, R"(saga_prepared_batches{shard="1"})") == count &&
           sample(text, R"(saga_prepared_batches{shard="0"})") == 0;
  };
  EXPECT_TRUE(eventually([&] { return prepared(1); }, 5s)) << text;
  const double since = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() -
                       sample(text, R"(saga_oldest_prepared_batch_timestamp_seconds{shard="1"})");
  EXPECT_GE(since, 0);
  EXPECT_LT(since, 8);
  Process other = start_worker("other");
  EXPECT_TRUE(wait_all_finished_and_published()) << read_file(dir_ / "other.log");
  EXPECT_NE(read_file(dir_ / "other.log").find("finished a batch's transaction its worker left prepared"),
            std::string::npos)
      << read_file(dir_ / "other.log");
  EXPECT_TRUE(eventually([&] { return prepared(0); }, 5s)) << text;
  EXPECT_EQ(sample(text, R"(saga_oldest_prepared_batch_timestamp_seconds{shard="1"})"), 0) << text;
  EXPECT_EQ(zombie.stop(20s), 0) << read_file(dir_ / "zombie.log");
  EXPECT_EQ(other.stop(20s), 0) << read_file(dir_ / "other.log");
  expect_exactly_once();
}

TEST_F(FailpointTest, APausedWorkerIsFencedOutWhenItResumes) {
  a_paused_worker_is_fenced_out_when_it_resumes(StoreKind::sqlite);
}

TEST_F(FailpointTest, InjectedStoreErrorsAreRecovered) { injected_store_errors_are_recovered(StoreKind::sqlite); }

// librdkafka 2.0.2 raised OUT_OF_ORDER_SEQUENCE_NUMBER as a fatal error
// after a leader change in a chaos run, and the worker stopped (exit 1).
// Now it replaces its producer: what the old one held is published again.
// The error is raised at the end of one loop and found by the next, which
// first produces outcomes and dead letters (one request in four is invalid)
// into the broken producer.
TEST_F(FailpointTest, AProducerWhoseSequenceBrokeIsReplaced) {
  open_ledger(1);
  produce_requests(4);
  Process w = start_worker("renewed", {"SAGA_FAILPOINTS=producer_in_flight=3*error"});
  EXPECT_TRUE(wait_all_finished_and_published()) << read_file(dir_ / "renewed.log");
  const std::string log = read_file(dir_ / "renewed.log");
  std::size_t replaced = 0;
  for (std::size_t at = log.find("replacing the producer"); at != std::string::npos;
       at = log.find("replacing the producer", at + 1)) {
    ++replaced;
  }
  EXPECT_EQ(replaced, 3u) << log;
  EXPECT_EQ(w.stop(20s), 0) << log;
  expect_exactly_once();
  std::set<std::string> dead;
  for (const Record& r : consume_values(broker_->bootstrap(), "transfers.dlq", invalid_, 60s)) dead.insert(r.value);
  EXPECT_EQ(dead, invalid_);
}

TEST_F(FailpointTest, APausedWorkerIsFencedOutWhenItResumesOnMongoDB) {
  a_paused_worker_is_fenced_out_when_it_resumes(StoreKind::mongodb);
}

TEST_F(FailpointTest, InjectedStoreErrorsAreRecoveredOnMongoDB) {
  injected_store_errors_are_recovered(StoreKind::mongodb);
}

TEST_F(FailpointTest, ABadSpecIsRefusedAtStartUp) {
  open_ledger(1);
  for (const std::string spec : {"after_debitt=crash", "after_debit=explode", "after_debit", "before_publish=error",
                                  "after_debit=0*crash", "after_debit=pause:soon", "after_debit=crash,after_debit=error"}) {
    const RunResult r = run({bin("saga-worker").string(), "--brokers", broker_->bootstrap(), "--group", "g",
                             "--store", urls_.front(), "--metrics-addr", ""},
                            {"SAGA_FAILPOINTS=" + spec}, 30s);
    EXPECT_EQ(r.exit_code, 2) << spec << ": " << r.output;
    EXPECT_NE(r.output.find("SAGA_FAILPOINTS"), std::string::npos) << spec << ": " << r.output;
  }
}

}  // namespace
}  // namespace sagapool::test
