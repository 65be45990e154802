// saga-worker end to end against a real Kafka node and a SQLite ledger: every
// outcome path, dead letters with their headers, and a SIGKILL mid-run.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "kafka_client.hpp"
#include "process.hpp"
#include "sagapool/audit.hpp"
#include "sagapool/ledger.hpp"

namespace sagapool::test {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;

class WorkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Requests up to 2 MB reach the worker: more than its producer may send
    // to the dead-letter topic whole.
    broker_ = std::make_unique<Broker>(Broker::kafka(dir_, 4, {{"max.message.bytes", "2000000"}}));
    ASSERT_TRUE(Ledger::open({store_url_}, ledger_).is_ok());
    ASSERT_TRUE(ledger_->init().is_ok());
  }

  void create_accounts(const std::vector<Account>& accounts) {
    for (const Account& a : accounts) {
      Account x = a;
      x.opening_balance = a.balance;
      ASSERT_TRUE(ledger_->shard_for(a.id).create_accounts({&x, 1}).is_ok());
    }
  }

  Process start_worker(const std::string& name, const std::string& lease = "30s",
                       const std::vector<std::string>& env = {}) {
    return Process::start({bin("saga-worker").string(), "--brokers", broker_->bootstrap(), "--group", "g",
                           "--store", store_url_, "--worker-id", name, "--metrics-addr", "",
                           "--lease", lease, "--recovery-interval", "200ms", "--batch-size", "200"},
                          dir_ / (name + ".log"), env);
  }

  // Outcomes by id (every message for that id, in arrival order); the
  // `rejected` answers to requests that started no transfer go to
  // `rejected` when given, and count towards `at_least` either way.
  std::map<std::string, std::vector<json>> outcomes(std::size_t at_least, std::chrono::milliseconds timeout,
                                                    std::map<std::string, std::vector<json>>* rejected = nullptr) {
    std::map<std::string, std::vector<json>> by_id;
    for (const Record& r : consume(broker_->bootstrap(), "transfers.results", at_least, timeout)) {
      json j = json::parse(r.value);
      const std::string id = j.at("id").get<std::string>();
      EXPECT_EQ(r.key, id);
      if (j.at("state") == "rejected") {
        EXPECT_NE(rejected, nullptr) << "unexpected: " << r.value;
        if (rejected != nullptr) (*rejected)[id].push_back(std::move(j));
        continue;
      }
      by_id[id].push_back(std::move(j));
    }
    return by_id;
  }

  std::int64_t balance(const std::string& id) {
    std::optional<Account> a;
    EXPECT_TRUE(ledger_->shard_for(id).load_account(id, a).is_ok());
    return a ? a->balance : -1;
  }

  void expect_audit_passes() {
    AuditReport report;
    ASSERT_TRUE(run_audit(*ledger_, {}, report).is_ok());
    EXPECT_TRUE(report.ok()) << report.to_text();
  }

  TempDir dir_;
  std::unique_ptr<Broker> broker_;
  std::string store_url_ = "sqlite:" + (dir_ / "ledger.db").string();
  std::unique_ptr<Ledger> ledger_;
};

Account account(const std::string& id, std::int64_t balance, bool locked = false) {
  Account a;
  a.id = id;
  a.balance = balance;
  a.locked = locked;
  return a;
}

// "2026-11-22T01:02:03.456Z" -> milliseconds since the epoch; -1 if malformed.
std::int64_t utc_ms(const std::string& rfc3339) {
  std::tm tm{};
  int ms = 0;
  const char* rest = strptime(rfc3339.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (rest == nullptr || std::sscanf(rest, ".%3dZ", &ms) != 1) return -1;
  return static_cast<std::int64_t>(timegm(&tm)) * 1000 + ms;
}

std::string request(const std::string& id, const std::string& from, const std::string& to, long long amount) {
  return R"({"id":")" + id + R"(","from":")" + from + R"(","to":")" + to + R"(","amount":)" +
         std::to_string(amount) + "}";
}

TEST_F(WorkerTest, EveryOutcomePathAndDeadLetters) {
  create_accounts({account("a1", 1000), account("a2", 1000), account("a3", 10), account("a4", 1000, true)});
  Process worker = start_worker("w1");
  produce(broker_->bootstrap(), "transfers.requests",
          {{"a1", request("t-ok", "a1", "a2", 100)},
           {"a3", request("t-over", "a3", "a2", 11)},
           {"a1", request("t-unknown", "a1", "ghost", 50)},
           {"a4", request("t-locked", "a4", "a1", 5)},
           {"a2", request("t-dup", "a2", "a1", 7)},
           {"a2", request("t-dup", "a2", "a1", 7)},
           {"a1", request("t-ok", "a1", "a2", 999)},  // same id, other payload: conflict
           {"a1", "not json"},
           {"a1", R"({"id":"t-float","from":"a1","to":"a2","amount":1.5})"},
           {"a2", R"({"id":"t-echo","from":"a2","to":"a1","amount":5,"currency":"EUR","metadata":{"ref":"inv 7","n":[1,null]}})"}});

  std::map<std::string, std::vector<json>> rejected;
  auto out = outcomes(8, 60s, &rejected);
  ASSERT_EQ(out.size(), 6u);
  // Answers to the two requests that started nothing: the reuse of t-ok and
  // t-float ("not json" has no id to answer). t-ok's outcome stands.
  ASSERT_EQ(rejected.size(), 2u);
  ASSERT_EQ(rejected["t-ok"].size(), 1u);
  EXPECT_EQ(rejected["t-ok"].front().at("reason"), "conflict");
  EXPECT_EQ(rejected["t-ok"].front().at("error"), "conflict");
  ASSERT_EQ(rejected["t-float"].size(), 1u);
  EXPECT_EQ(rejected["t-float"].front().at("reason"), "invalid");
  EXPECT_EQ(rejected["t-float"].front().at("error"), "amount_not_integer");
  EXPECT_EQ(out.at("t-ok").size(), 1u);
  auto state_of = [&](const std::string& id) {
    const json& j = out.at(id).front();
    return j.at("state").get<std::string>() + "/" + (j.at("reason").is_null() ? "null" : j.at("reason").get<std::string>());
  };
  EXPECT_EQ(state_of("t-ok"), "done/null");
  EXPECT_EQ(state_of("t-over"), "canceled/insufficient_funds");
  EXPECT_EQ(state_of("t-unknown"), "canceled/unknown_account");
  EXPECT_EQ(state_of("t-locked"), "canceled/account_locked");
  EXPECT_EQ(state_of("t-dup"), "done/null");
  EXPECT_EQ(out.at("t-ok").front().at("amount"), 100);  // the first payload stands
  // The request's currency and metadata come back; null when it had none.
  EXPECT_EQ(out.at("t-echo").front().at("currency"), "EUR");
  EXPECT_EQ(out.at("t-echo").front().at("metadata"), json::parse(R"({"ref":"inv 7","n":[1,null]})"));
  EXPECT_TRUE(out.at("t-ok").front().at("currency").is_null());
  EXPECT_TRUE(out.at("t-ok").front().at("metadata").is_null());
  // finished_at is the time the store wrote the terminal state, so an outcome
  // republished later from the store is the same message.
  for (const auto& [id, msgs] : out) {
    std::optional<TransferDoc> doc;
    ASSERT_TRUE(ledger_->transfers().load_transfer(id, doc).is_ok());
    ASSERT_TRUE(doc.has_value()) << id;
    EXPECT_EQ(utc_ms(msgs.front().at("finished_at").get<std::string>()), doc->finished_at_ms) << id;
  }

  // a1: -100 (t-ok) +7 (t-dup once) +5 (t-echo); t-unknown's debit
  // reversed; a2: +100 -7 -5.
  EXPECT_EQ(balance("a1"), 912);
  EXPECT_EQ(balance("a2"), 1088);
  EXPECT_EQ(balance("a3"), 10);
  EXPECT_EQ(balance("a4"), 1000);
  std::vector<Posting> postings;
  ASSERT_TRUE(ledger_->transfers().postings_for_transfer("t-unknown", postings).is_ok());
  ASSERT_EQ(postings.size(), 2u);  // debit and its reversal, exactly once
  std::set<PostingKind> kinds{postings[0].kind, postings[1].kind};
  EXPECT_EQ(kinds, (std::set<PostingKind>{PostingKind::debit, PostingKind::reverse_debit}));
  ASSERT_TRUE(ledger_->transfers().postings_for_transfer("t-over", postings).is_ok());
  EXPECT_TRUE(postings.empty());  // an overdraft never posts its debit

  auto dead = consume(broker_->bootstrap(), "transfers.dlq", 3, 30s);
  ASSERT_EQ(dead.size(), 3u);
  std::map<std::string, Record> by_error;
  for (const Record& r : dead) by_error[r.headers.at("saga.error")] = r;
  ASSERT_TRUE(by_error.count("conflict"));
  EXPECT_EQ(by_error["conflict"].headers.at("saga.reason"), "conflict");
  EXPECT_EQ(by_error["conflict"].value, request("t-ok", "a1", "a2", 999));  // original bytes
  ASSERT_TRUE(by_error.count("malformed_json"));
  EXPECT_EQ(by_error["malformed_json"].value, "not json");
  EXPECT_EQ(by_error["malformed_json"].headers.at("saga.reason"), "invalid");
  EXPECT_EQ(by_error["malformed_json"].headers.at("saga.source.topic"), "transfers.requests");
  EXPECT_FALSE(by_error["malformed_json"].headers.at("saga.message").empty());
  EXPECT_TRUE(by_error.count("amount_not_integer"));

  // kcat, the operator's tool, reads the same outcomes.
  RunResult kcat = run({"/usr/bin/kcat", "-b", broker_->bootstrap(), "-C", "-t", "transfers.results",
                        "-o", "beginning", "-e", "-q"});
  EXPECT_EQ(kcat.exit_code, 0) << kcat.output;
  EXPECT_NE(kcat.output.find(R"("id":"t-unknown","state":"canceled","reason":"unknown_account")"),
            std::string::npos) << kcat.output;

  // A transfer published by hand with kcat comes back as an outcome.
  const auto by_hand = dir_ / "by-hand.txt";
  {
    std::ofstream f(by_hand);
    f << "a2|" << request("t-kcat", "a2", "a3", 3) << "\n";
  }
  RunResult sent = run({"/usr/bin/kcat", "-b", broker_->bootstrap(), "-P", "-t", "transfers.requests",
                        "-K", "|", "-l", by_hand.string()});
  ASSERT_EQ(sent.exit_code, 0) << sent.output;
  auto with_kcat = outcomes(9, 30s, &rejected);
  ASSERT_TRUE(with_kcat.count("t-kcat")) << "no outcome for the kcat transfer";
  EXPECT_EQ(with_kcat.at("t-kcat").front().at("state"), "done");
  EXPECT_EQ(balance("a3"), 13);

  EXPECT_EQ(worker.stop(20s), 0) << read_file(dir_ / "w1.log");
  expect_audit_passes();

  // What left the happy path is in the log under its transfer id; what went
  // straight through is not.
  const std::string log = read_file(dir_ / "w1.log");
  EXPECT_NE(log.find("dead-lettered transfer_id=t-float reason=invalid error=amount_not_integer "
                     "topic=transfers.requests partition="), std::string::npos) << log;
  EXPECT_NE(log.find("dead-lettered transfer_id=\"\" reason=invalid error=malformed_json"), std::string::npos) << log;
  EXPECT_NE(log.find("dead-lettered transfer_id=t-ok reason=conflict error=conflict"), std::string::npos) << log;
  EXPECT_NE(log.find("compensating: a leg was refused transfer_id=t-unknown reason=unknown_account"),
            std::string::npos) << log;
  EXPECT_EQ(log.find("transfer_id=t-echo"), std::string::npos) << log;
}

// A request bigger than the dead-letter producer may send (message.max.bytes,
// 1,000,000 bytes by default) used to stop the worker for good: every restart
// met it again (issue 19, finding 3). It is dead-lettered cut to 64 KiB, with
// headers that say so, and the requests around it go through.
TEST_F(WorkerTest, ARequestTooLargeToDeadLetterWholeIsSentTruncated) {
  create_accounts({account("a1", 1000), account("a2", 1000)});
  Process worker = start_worker("w1");
  const std::string huge = R"({"id":"t-huge","from":"a1","to":"a2","amount":1,"metadata":")" +
                           std::string(1'200'000, 'x') + "\"}";
  produce(broker_->bootstrap(), "transfers.requests",
          {{"a1", request("t-before", "a1", "a2", 10)},
           {"a1", huge},
           {"a1", request("t-after", "a1", "a2", 20)}},
          {{"message.max.bytes", "2000000"}});

  auto out = outcomes(2, 60s);
  EXPECT_EQ(out.size(), 2u);
  EXPECT_TRUE(out.count("t-before") && out.count("t-after")) << read_file(dir_ / "w1.log");
  auto dead = consume(broker_->bootstrap(), "transfers.dlq", 1, 30s);
  ASSERT_EQ(dead.size(), 1u) << read_file(dir_ / "w1.log");
  const Record& d = dead.front();
  EXPECT_EQ(d.headers.at("saga.error"), "too_large");
  EXPECT_EQ(d.headers.at("saga.truncated"), "true");
  EXPECT_EQ(d.headers.at("saga.original.size"), std::to_string(huge.size()));
  EXPECT_EQ(d.headers.at("saga.source.offset"), "1");
  EXPECT_EQ(d.value, huge.substr(0, 64 * 1024));  // the original's first 64 KiB
  EXPECT_TRUE(worker.running()) << read_file(dir_ / "w1.log");
  EXPECT_EQ(worker.stop(20s), 0) << read_file(dir_ / "w1.log");
  EXPECT_EQ(balance("a1"), 970);
  expect_audit_passes();
}

// A conflict's dead letter that cannot be queued (the producer's queue stays
// full; here a fail point) used to stop the worker, whose drain then stored
// the batch's offsets: the conflict was committed past, never dead-lettered
// (issue 19, finding 4). Now the batch is consumed again from its first
// message, and the conflict is dead-lettered on the second pass.
TEST_F(WorkerTest, AConflictWhoseDeadLetterCannotBeQueuedIsConsumedAgain) {
  create_accounts({account("a1", 1000), account("a2", 1000)});
  produce(broker_->bootstrap(), "transfers.requests", {{"a1", request("t-1", "a1", "a2", 10)}});
  Process first = start_worker("w0");
  ASSERT_EQ(outcomes(1, 60s).size(), 1u) << read_file(dir_ / "w0.log");
  ASSERT_EQ(first.stop(20s), 0);

  Process worker = start_worker("w1", "30s", {"SAGA_FAILPOINTS=before_dead_letter=1*error"});
  produce(broker_->bootstrap(), "transfers.requests",
          {{"a1", request("t-2", "a1", "a2", 20)},
           {"a1", request("t-1", "a1", "a2", 999)},  // same id, other payload: conflict
           {"a1", request("t-3", "a1", "a2", 30)}});
  std::map<std::string, std::vector<json>> rejected;
  auto out = outcomes(4, 60s, &rejected);
  EXPECT_EQ(out.size(), 3u);
  ASSERT_EQ(rejected["t-1"].size(), 1u) << "the conflict is answered once, on the second pass";
  EXPECT_EQ(rejected["t-1"].front().at("error"), "conflict");
  auto dead = consume(broker_->bootstrap(), "transfers.dlq", 1, 30s, 2s);
  ASSERT_EQ(dead.size(), 1u) << read_file(dir_ / "w1.log");
  EXPECT_EQ(dead.front().headers.at("saga.error"), "conflict");
  EXPECT_EQ(dead.front().value, request("t-1", "a1", "a2", 999));
  const std::string log = read_file(dir_ / "w1.log");
  EXPECT_NE(log.find("consuming the batch again from its first message"), std::string::npos) << log;
  EXPECT_TRUE(worker.running()) << log;
  EXPECT_EQ(worker.stop(20s), 0) << log;
  EXPECT_EQ(balance("a1"), 940);  // each transfer once
  expect_audit_passes();
}

TEST_F(WorkerTest, SigkillMidRunLosesNothingAndAppliesNothingTwice) {
  constexpr int kAccounts = 20;
  constexpr int kTransfers = 6000;
  std::vector<Account> accounts;
  for (int i = 0; i < kAccounts; ++i) accounts.push_back(account("k" + std::to_string(i), 5000));
  create_accounts(accounts);
  std::mt19937_64 rng(7);
  std::vector<std::pair<std::string, std::string>> messages;
  for (int i = 0; i < kTransfers; ++i) {
    const int from = static_cast<int>(rng() % kAccounts);
    const int to = (from + 1 + static_cast<int>(rng() % (kAccounts - 1))) % kAccounts;
    const long long amount = 1 + static_cast<long long>(rng() % 400);  // some overdraw
    const std::string src = "k" + std::to_string(from);
    messages.emplace_back(src, request("k-" + std::to_string(i), src, "k" + std::to_string(to), amount));
  }
  std::vector<Process> workers;
  for (int i = 0; i < 3; ++i) workers.push_back(start_worker("w" + std::to_string(i), "2s"));
  // Paced over ~4 s so the kill lands while requests are still arriving.
  std::thread producer([&] {
    for (std::size_t i = 0; i < messages.size(); i += 500) {
      produce(broker_->bootstrap(), "transfers.requests",
              {messages.begin() + static_cast<long>(i), messages.begin() + static_cast<long>(i + 500)});
      std::this_thread::sleep_for(300ms);
    }
  });
  std::this_thread::sleep_for(1500ms);
  workers[1].signal(SIGKILL);
  ASSERT_TRUE(workers[1].wait(5s).has_value());
  std::this_thread::sleep_for(1000ms);
  workers[1] = start_worker("w1-restarted", "2s");
  producer.join();

  // Every request reaches a terminal, published outcome.
  ASSERT_TRUE(eventually(
      [&] {
        std::int64_t finished = 0;
        bool open = false;
        EXPECT_TRUE(ledger_->transfers().scan_transfer_states([&](std::string_view, TransferState s, bool notified) {
          if (is_terminal(s) && notified) ++finished;
          else open = true;
        }).is_ok());
        return finished == kTransfers && !open;
      },
      90s));
  auto out = outcomes(kTransfers, 60s);
  EXPECT_EQ(out.size(), static_cast<std::size_t>(kTransfers));
  std::size_t republished = 0;
  for (const auto& [id, msgs] : out) {
    republished += msgs.size() - 1;
    for (const json& m : msgs) EXPECT_EQ(m.at("state"), msgs.front().at("state")) << id;
  }
  std::cout << "outcomes: " << out.size() << " ids, " << republished << " republished after the crash\n";
  for (Process& w : workers) EXPECT_EQ(w.stop(20s), 0);
  expect_audit_passes();
}

}  // namespace
}  // namespace sagapool::test
