// Hostile input end to end (docs/RELIABILITY.md, "Hostile input"): every
// kind of bad message is dead-lettered unchanged with its reason and counted,
// null and binary keys and arbitrary headers change nothing, replays change
// nothing, a reused id with another payload is refused and counted, and a
// flood of bad input does not slow valid traffic down.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <map>
#include <set>

#include "kafka_client.hpp"
#include "kafka_raw.hpp"
#include "process.hpp"
#include "sagapool/audit.hpp"
#include "sagapool/ledger.hpp"

namespace sagapool::test {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;

std::string request(const std::string& id, const std::string& from, const std::string& to, const std::string& amount,
                    const std::string& extra = "") {
  return R"({"id":")" + id + R"(","from":")" + from + R"(","to":")" + to + R"(","amount":)" + amount + extra + "}";
}

std::string nested(const std::string& id, int depth) {
  std::string s = R"({"id":")" + id + R"(","from":"h0","to":"h1","amount":1,"metadata":)";
  for (int i = 0; i < depth; ++i) s += R"({"a":)";
  s += "1";
  for (int i = 0; i < depth; ++i) s += "}";
  return s + "}";
}

class HostileInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    broker_ = std::make_unique<Broker>(Broker::kafka(dir_, 2));
    ASSERT_TRUE(Ledger::open({store_url_}, ledger_).is_ok());
    ASSERT_TRUE(ledger_->init().is_ok());
    for (int i = 0; i < 4; ++i) {
      Account a;
      a.id = "h" + std::to_string(i);
      a.balance = a.opening_balance = 1'000'000'000'000;
      ASSERT_TRUE(ledger_->shard_for(a.id).create_accounts({&a, 1}).is_ok());
    }
    metrics_port_ = free_loopback_port();
    worker_ = Process::start({bin("saga-worker").string(), "--brokers", broker_->bootstrap(), "--group", "g",
                              "--store", store_url_, "--worker-id", "w", "--metrics-addr",
                              "127.0.0.1:" + std::to_string(metrics_port_), "--batch-size", "500"},
                             dir_ / "worker.log");
  }

  void TearDown() override {
    EXPECT_EQ(worker_.stop(20s), 0) << read_file(dir_ / "worker.log");
    AuditReport report;
    ASSERT_TRUE(run_audit(*ledger_, {}, report).is_ok());
    EXPECT_TRUE(report.ok()) << report.to_text();
  }

  double metric(const std::string& name, const std::string& labels) {
    return metric_value(http_get_body("127.0.0.1", metrics_port_, "/metrics"), name, labels);
  }

  std::size_t finished(const std::string& prefix) {
    std::size_t n = 0;
    EXPECT_TRUE(ledger_->transfers()
                    .scan_transfer_states([&](std::string_view id, TransferState s, bool) {
                      if (id.starts_with(prefix) && is_terminal(s)) ++n;
                    })
                    .is_ok());
    return n;
  }

  TempDir dir_;
  std::unique_ptr<Broker> broker_;
  std::string store_url_ = "sqlite:" + (dir_ / "ledger.db").string();
  std::unique_ptr<Ledger> ledger_;
  int metrics_port_ = 0;
  Process worker_;
};

struct Hostile {
  std::string name;
  RawMessage message;
  std::string code;  // expected saga.error; "" = a valid request
};

TEST_F(HostileInputTest, EveryBadMessageIsDeadLetteredWithItsReasonAndCounted) {
  const std::string ok_tail = R"(,"from":"h0","to":"h1","amount":1})";
  std::vector<Hostile> cases = {
      {"empty value", {"h0", "", {}}, "empty"},
      {"null value", {"h0", std::nullopt, {}}, "empty"},
      {"64 KiB + 1", {"h0", request("big", "h0", "h1", "1", R"(,"metadata":{"p":")" + std::string(65'536, 'p') + "\"}"), {}}, "too_large"},
      {"900 KB", {"h0", std::string(900'000, '{'), {}}, "too_large"},
      {"binary", {"h0", std::string("\x00\xff\x01\x80\xfe", 5), {}}, "not_utf8"},
      {"not UTF-8 in a string", {"h0", "{\"id\":\"t\xff\"" + ok_tail, {}}, "not_utf8"},
      {"overlong UTF-8", {"h0", request("ov", "h0", "h1", "1", ",\"metadata\":{\"k\":\"\xc0\xaf\"}"), {}}, "not_utf8"},
      {"UTF-8 surrogate", {"h0", request("sur", "h0", "h1", "1", ",\"metadata\":{\"k\":\"\xed\xa0\x80\"}"), {}}, "not_utf8"},
      {"33 levels deep", {"h0", nested("deep33", 33), {}}, "too_deep"},
      {"60,000 brackets", {"h0", std::string(60'000, '['), {}}, "too_deep"},
      {"not JSON", {"h0", "not json", {}}, "malformed_json"},
      {"truncated", {"h0", R"({"id":"tr","from":"h0")", {}}, "malformed_json"},
      {"JSON null", {"h0", "null", {}}, "not_object"},
      {"an array", {"h0", "[1,2]", {}}, "not_object"},
      {"trailing bytes", {"h0", request("tb", "h0", "h1", "1") + " x", {}}, "trailing_data"},
      {"duplicate key", {"h0", R"({"id":"dk","id":"dk2")" + ok_tail, {}}, "duplicate_key"},
      {"unknown key", {"h0", request("uk", "h0", "h1", "1", R"(,"memo":"hi")"), {}}, "unknown_key"},
      {"escaped key", {"h0", R"({"\u0069d":"ek")" + ok_tail, {}}, "unknown_key"},
      {"missing amount", {"h0", R"({"id":"ma","from":"h0","to":"h1"})", {}}, "missing_amount"},
      {"amount 2^63", {"h0", request("n63", "h0", "h1", "9223372036854775808"), {}}, "amount_too_large"},
      {"amount -0", {"h0", request("nz", "h0", "h1", "-0"), {}}, "amount_not_positive"},
      {"amount 0", {"h0", request("n0", "h0", "h1", "0"), {}}, "amount_not_positive"},
      {"amount 1e2", {"h0", request("ne", "h0", "h1", "1e2"), {}}, "amount_not_integer"},
      {"amount 1.0", {"h0", request("nf", "h0", "h1", "1.0"), {}}, "amount_not_integer"},
      {"amount \"5\"", {"h0", request("ns", "h0", "h1", "\"5\""), {}}, "amount_not_integer"},
      {"amount 01", {"h0", request("nl", "h0", "h1", "01"), {}}, "amount_leading_zero"},
      {"same account", {"h0", request("sa", "h0", "h0", "1"), {}}, "same_account"},
      {"bad id", {"h0", request("a b", "h0", "h1", "1"), {}}, "bad_id"},
      {"bad currency", {"h0", request("bc", "h0", "h1", "1", R"(,"currency":"eur")"), {}}, "bad_currency"},
      {"metadata not an object", {"h0", request("mo", "h0", "h1", "1", R"(,"metadata":[1])"), {}}, "bad_metadata"},
      {"metadata over 4 KiB", {"h0", request("ml", "h0", "h1", "1", R"(,"metadata":{"p":")" + std::string(4100, 'p') + "\"}"), {}}, "metadata_too_large"},
      // Keys and headers are not the payload: null and binary keys, spoofed
      // and binary headers change nothing.
      {"null key, invalid", {std::nullopt, "?null-key garbage", {}}, "malformed_json"},
      {"binary key, invalid", {std::string("\x00\xff key", 6), "binary-key garbage", {}}, "malformed_json"},
      {"spoofed saga.error header", {"h0", "spoofed", {{"saga.error", "fake"}, {"saga.reason", "fake"}}}, "malformed_json"},
      {"null key, valid", {std::nullopt, request("ok-null-key", "h2", "h3", "7"), {}}, ""},
      {"binary key and headers, valid",
       {std::string("\x01\x00\xfe", 3), request("ok-binary-key", "h3", "h2", "9"),
        {{"x-bin", std::string("\x00\xff", 2)}, {"x-null", std::nullopt}, {"saga.error", "fake"}}},
       ""},
      {"amount 2^63-1, valid", {"h1", request("ok-max", "h1", "h2", "9223372036854775807"), {}}, ""},
  };
  std::vector<RawMessage> messages;
  std::map<std::string, std::string> expected;  // payload -> code
  std::size_t invalid = 0;
  for (const Hostile& c : cases) {
    messages.push_back(c.message);
    if (c.code.empty()) continue;
    ++invalid;
    ASSERT_TRUE(expected.emplace(c.message.value.value_or(""), c.code).second || c.code == "empty") << c.name;
  }
  produce_raw(broker_->bootstrap(), "transfers.requests", messages);

  const std::vector<Record> dead = consume(broker_->bootstrap(), "transfers.dlq", invalid, 60s);
  ASSERT_EQ(dead.size(), invalid) << read_file(dir_ / "worker.log");
  std::map<std::string, std::size_t> seen;
  for (const Record& r : dead) {
    const auto it = expected.find(r.value);
    ASSERT_NE(it, expected.end()) << "a dead letter that was not sent: " << r.value.substr(0, 80);
    EXPECT_EQ(r.headers.at("saga.error"), it->second) << r.value.substr(0, 80);
    EXPECT_EQ(r.headers.at("saga.reason"), "invalid");
    EXPECT_EQ(r.headers.at("saga.source.topic"), "transfers.requests");
    EXPECT_FALSE(r.headers.at("saga.message").empty());
    EXPECT_FALSE(r.headers.at("saga.source.offset").empty());
    ++seen[r.value];
  }
  std::set<std::string> keys;
  for (const Record& r : dead) keys.insert(r.key);
  EXPECT_TRUE(keys.count(std::string("\x00\xff key", 6))) << "the original key travels with the dead letter";
  EXPECT_TRUE(keys.count("")) << "a null key stays null";

  // The valid ones went through, whatever their keys and headers.
  EXPECT_TRUE(eventually([&] { return finished("ok-") == 3; }, 30s));
  std::optional<TransferDoc> d;
  ASSERT_TRUE(ledger_->transfers().load_transfer("ok-binary-key", d).is_ok() && d);
  EXPECT_EQ(d->state, TransferState::done);
  ASSERT_TRUE(ledger_->transfers().load_transfer("ok-max", d).is_ok() && d);
  EXPECT_EQ(d->state, TransferState::canceled);
  EXPECT_EQ(d->reason, Reason::insufficient_funds);

  // Answered on the results topic when the id could be read (a literal,
  // valid id in a well-formed object), pointing at the message it answers.
  const std::map<std::string, std::string> answered = {
      {"uk", "unknown_key"},          {"ma", "missing_amount"},     {"n63", "amount_too_large"},
      {"nz", "amount_not_positive"},  {"n0", "amount_not_positive"}, {"ne", "amount_not_integer"},
      {"nf", "amount_not_integer"},   {"ns", "amount_not_integer"},  {"nl", "amount_leading_zero"},
      {"sa", "same_account"},         {"bc", "bad_currency"},        {"mo", "bad_metadata"},
      {"ml", "metadata_too_large"}};
  std::map<std::string, std::string> lettered;  // "partition/offset" -> saga.error
  for (const Record& r : dead) {
    lettered[r.headers.at("saga.source.partition") + "/" + r.headers.at("saga.source.offset")] = r.headers.at("saga.error");
  }
  std::map<std::string, std::string> rejected;
  for (const Record& r : consume(broker_->bootstrap(), "transfers.results", 3 + answered.size(), 30s, 2s)) {
    const json j = json::parse(r.value);
    if (j.at("state") != "rejected") continue;
    const std::string id = j.at("id").get<std::string>();
    EXPECT_EQ(r.key, id);
    EXPECT_EQ(j.at("reason"), "invalid") << r.value;
    EXPECT_FALSE(j.at("message").get<std::string>().empty()) << r.value;
    const json& at = j.at("request");
    EXPECT_EQ(at.at("topic"), "transfers.requests");
    const std::string where = std::to_string(at.at("partition").get<int>()) + "/" + std::to_string(at.at("offset").get<std::int64_t>());
    EXPECT_EQ(lettered[where], j.at("error").get<std::string>()) << "the answer names its dead letter's message: " << r.value;
    EXPECT_TRUE(rejected.emplace(id, j.at("error").get<std::string>()).second) << "answered twice: " << id;
  }
  EXPECT_EQ(rejected, answered);

  // Counted: once each, by reason.
  EXPECT_TRUE(eventually([&] { return metric("saga_dead_letters_total", R"(reason="invalid")") == static_cast<double>(invalid); }, 10s))
      << http_get_body("127.0.0.1", metrics_port_, "/metrics");
  EXPECT_EQ(metric("saga_requests_total", R"(result="invalid")"), static_cast<double>(invalid));
  EXPECT_EQ(metric("saga_requests_total", R"(result="accepted")"), 3.0);
}

// A dead letter keeps what its request carried: its headers (a trace id, a
// null value, a binary one), after the saga.* headers, and its timestamp.
// An upstream saga.* header would pass for the worker's own: it is dropped.
TEST_F(HostileInputTest, ADeadLetterKeepsTheRequestsHeadersAndTimestamp) {
  using Headers = std::vector<std::pair<std::string, std::optional<std::string>>>;
  const Headers carried = {{"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
                           {"x-null", std::nullopt},
                           {"x-bin", std::string("\x00\xff", 2)},
                           {"traceparent", "a second value of the same name"}};
  Headers sent = carried;
  sent.insert(sent.begin() + 1, {"saga.error", "spoofed"});
  produce_raw(broker_->bootstrap(), "transfers.requests", {{"h0", "not json", sent}});

  const std::vector<Record> requests = consume(broker_->bootstrap(), "transfers.requests", 1, 30s);
  const std::vector<Record> dead = consume(broker_->bootstrap(), "transfers.dlq", 1, 60s);
  ASSERT_EQ(requests.size(), 1U);
  ASSERT_EQ(dead.size(), 1U) << read_file(dir_ / "worker.log");
  const Record& d = dead.front();
  EXPECT_EQ(d.timestamp_ms, requests.front().timestamp_ms);
  ASSERT_EQ(d.header_list.size(), 6 + carried.size());
  for (std::size_t i = 0; i < 6; ++i) {
    EXPECT_TRUE(d.header_list[i].first.starts_with("saga.")) << d.header_list[i].first;
  }
  EXPECT_EQ(Headers(d.header_list.begin() + 6, d.header_list.end()), carried);
  EXPECT_EQ(d.headers.at("saga.error"), "malformed_json");
}

TEST_F(HostileInputTest, ReplaysChangeNothingAndAReusedIdIsRefusedAndCounted) {
  const std::string original = request("replayed", "h0", "h1", "250");
  std::vector<std::pair<std::string, std::string>> first(40, {"h0", original});
  produce(broker_->bootstrap(), "transfers.requests", first);
  ASSERT_TRUE(eventually([&] { return finished("replayed") == 1; }, 30s));
  // Later replays, and the same id with other payloads.
  std::vector<std::pair<std::string, std::string>> later(60, {"h0", original});
  const std::vector<std::string> others = {request("replayed", "h0", "h1", "251"), request("replayed", "h0", "h2", "250"),
                                           request("replayed", "h0", "h1", "250", R"(,"currency":"EUR")"),
                                           request("replayed", "h0", "h1", "250", R"(,"metadata":{})")};
  for (const std::string& o : others) later.emplace_back("h0", o);
  produce(broker_->bootstrap(), "transfers.requests", later);

  const std::vector<Record> dead = consume(broker_->bootstrap(), "transfers.dlq", others.size(), 60s);
  ASSERT_EQ(dead.size(), others.size());
  for (const Record& r : dead) {
    EXPECT_EQ(r.headers.at("saga.reason"), "conflict");
    EXPECT_EQ(r.headers.at("saga.error"), "conflict");
  }
  EXPECT_TRUE(eventually([&] { return metric("saga_requests_total", R"(result="duplicate")") == 99.0; }, 20s))
      << http_get_body("127.0.0.1", metrics_port_, "/metrics");
  EXPECT_EQ(metric("saga_requests_total", R"(result="accepted")"), 1.0);
  EXPECT_EQ(metric("saga_requests_total", R"(result="conflict")"), static_cast<double>(others.size()));
  EXPECT_EQ(metric("saga_dead_letters_total", R"(reason="conflict")"), static_cast<double>(others.size()));

  // One transfer, the first payload, its legs posted once.
  std::optional<TransferDoc> d;
  ASSERT_TRUE(ledger_->transfers().load_transfer("replayed", d).is_ok() && d);
  EXPECT_EQ(d->amount, 250);
  EXPECT_EQ(d->destination, "h1");
  std::vector<Posting> postings;
  ASSERT_TRUE(ledger_->transfers().postings_for_transfer("replayed", postings).is_ok());
  EXPECT_EQ(postings.size(), 2U);
  std::optional<Account> a;
  ASSERT_TRUE(ledger_->transfers().load_account("h0", a).is_ok() && a);
  EXPECT_EQ(a->balance, 1'000'000'000'000 - 250);
  // One outcome, the first payload's; each reuse answered `rejected`.
  std::size_t outcomes = 0;
  std::size_t rejected = 0;
  for (const Record& r : consume(broker_->bootstrap(), "transfers.results", 1 + others.size(), 30s, 2s)) {
    const json j = json::parse(r.value);
    if (j.at("state") == "rejected") {
      ++rejected;
      EXPECT_EQ(j.at("reason"), "conflict") << r.value;
      EXPECT_EQ(j.at("error"), "conflict") << r.value;
      continue;
    }
    ++outcomes;
    EXPECT_EQ(j.at("amount"), 250);
  }
  EXPECT_EQ(outcomes, 1U);
  EXPECT_EQ(rejected, others.size());
}

// Valid traffic alone, then the same amount of valid traffic interleaved
// with as much invalid input: the worker keeps its throughput.
TEST_F(HostileInputTest, AFloodOfBadInputDoesNotSlowValidTraffic) {
  constexpr int kValid = 10'000;
  auto valid = [](const std::string& prefix, int i) {
    const std::string from = "h" + std::to_string(i % 4);
    const std::string to = "h" + std::to_string((i + 1 + i / 4 % 3) % 4);
    return std::make_pair(from, request(prefix + std::to_string(i), from, to, std::to_string(1 + i % 97)));
  };
  // Small ones: oversize input is the first test's.
  const std::vector<std::string> bad = {"", "not json", "[1]", "{\"id\":\"\xff\"}", std::string(1'000, '['),
                                        R"({"id":"x","from":"h0","to":"h1","amount":01})",
                                        R"({"id":"x","id":"y","from":"h0","to":"h1","amount":1})"};
  const auto ms = [](auto d) { return std::chrono::duration_cast<std::chrono::milliseconds>(d).count(); };

  // Warm up: the consumer group settles, the store's caches fill.
  std::vector<std::pair<std::string, std::string>> warm;
  for (int i = 0; i < 200; ++i) warm.push_back(valid("warm-", i));
  produce(broker_->bootstrap(), "transfers.requests", warm);
  ASSERT_TRUE(eventually([&] { return finished("warm-") == 200; }, 60s));

  std::vector<std::pair<std::string, std::string>> clean;
  for (int i = 0; i < kValid; ++i) clean.push_back(valid("clean-", i));
  auto started = std::chrono::steady_clock::now();
  produce(broker_->bootstrap(), "transfers.requests", clean);
  ASSERT_TRUE(eventually([&] { return finished("clean-") == kValid; }, 120s));
  const auto clean_ms = ms(std::chrono::steady_clock::now() - started);

  std::vector<RawMessage> mixed;
  for (int i = 0; i < kValid; ++i) {
    auto [key, value] = valid("mixed-", i);
    mixed.push_back({key, value, {}});
    mixed.push_back({i % 5 == 0 ? std::optional<std::string>() : std::optional<std::string>(key),
                     bad[static_cast<std::size_t>(i) % bad.size()], {}});
  }
  started = std::chrono::steady_clock::now();
  produce_raw(broker_->bootstrap(), "transfers.requests", mixed);
  ASSERT_TRUE(eventually(
      [&] {
        return finished("mixed-") == kValid &&
               metric("saga_dead_letters_total", R"(reason="invalid")") == static_cast<double>(kValid);
      },
      120s));
  const auto mixed_ms = ms(std::chrono::steady_clock::now() - started);

  std::cout << kValid << " valid requests alone: " << clean_ms << " ms; interleaved with " << kValid
            << " invalid ones (all dead-lettered): " << mixed_ms << " ms\n";
  // Generous, the machine is shared: bad input costs a validation and a
  // dead letter each, not a store round trip.
  EXPECT_LT(mixed_ms, std::max<long long>(3 * clean_ms, clean_ms + 15'000));
}

}  // namespace
}  // namespace sagapool::test
