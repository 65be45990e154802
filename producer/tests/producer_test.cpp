// The producer library: wire format, seeded generator, TransferProducer and
// the Kafka RAII pieces that need no broker (errors, configuration, delivery
// failures).
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "sagapool/generator.hpp"
#include "sagapool/kafka.hpp"
#include "sagapool/producer.hpp"
#include "sagapool/request.hpp"

namespace sagapool {
namespace {

// ---- Wire format ------------------------------------------------------------

TEST(ToJson, MatchesTheDesignExampleExactly) {
  TransferRequest r{"t-000123", "acct-1", "acct-2", 2500, "EUR", R"({"ref": "invoice 9"})"};
  EXPECT_EQ(to_json(r),
            R"({"id": "t-000123", "from": "acct-1", "to": "acct-2", "amount": 2500, )"
            R"("currency": "EUR", "metadata": {"ref": "invoice 9"}})");
}

TEST(ToJson, OmitsAbsentOptionalFields) {
  TransferRequest r{"t-1", "a", "b", 9'223'372'036'854'775'807, "", ""};
  EXPECT_EQ(to_json(r),
            R"({"id": "t-1", "from": "a", "to": "b", "amount": 9223372036854775807})");
}

TEST(ToJson, RoundTripsThroughTheValidator) {
  TransferRequest r{"t-9:x.y_z", "acct-7", "acct-8", 42, "USD",
                    R"({"note": "caf\u00e9 \"quoted\"", "n": [1, 2, {"k": null}]})"};
  const std::string json = to_json(r);
  RequestView v;
  ASSERT_EQ(parse_request(json, v), RequestError::ok) << json;
  EXPECT_EQ(v.id, r.id);
  EXPECT_EQ(v.from, r.from);
  EXPECT_EQ(v.to, r.to);
  EXPECT_EQ(v.amount, r.amount);
  EXPECT_EQ(v.currency, r.currency);
  EXPECT_EQ(v.metadata, r.metadata);  // verbatim

  const std::string again = to_json(r);
  RequestView w;
  ASSERT_EQ(parse_request(again, w), RequestError::ok);
  EXPECT_EQ(payload_hash(v), payload_hash(w));
}

TEST(ToJson, EscapesStringsSoTheJsonStaysWellFormed) {
  // An id with a quote, a backslash and a control character is not a valid
  // identifier, but the JSON must stay well-formed: the validator then
  // rejects the id, not the syntax.
  TransferRequest r{"bad\"id\\\n", "acct-1", "acct-2", 1, "", ""};
  const std::string json = to_json(r);
  EXPECT_NE(json.find(R"(bad\"id\\\n)"), std::string::npos) << json;
  RequestView v;
  EXPECT_EQ(parse_request(json, v), RequestError::bad_id) << json;
}

// The outside-project test (producer_package) compares what a program built
// against the installed library prints with this file: it must hold
// requests saga-worker accepts.
TEST(ToJson, TheOutsideProjectsExpectedOutputIsValid) {
  std::ifstream in(SAGA_SOURCE_DIR "/producer/tests/outside_project/expected_output.txt");
  ASSERT_TRUE(in) << "expected_output.txt is missing";
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    ++lines;
    RequestView v;
    EXPECT_EQ(parse_request(line, v), RequestError::ok) << line;
  }
  EXPECT_GE(lines, 1);
}

// ---- Generator --------------------------------------------------------------

GeneratorOptions options(std::uint64_t count, std::uint64_t seed) {
  GeneratorOptions o;
  o.count = count;
  o.accounts = 100;
  o.seed = seed;
  o.invalid_ratio = 0.05;
  o.overdraw_ratio = 0.02;
  o.unknown_ratio = 0.01;
  return o;
}

struct Message {
  GeneratedKind kind;
  InvalidKind invalid;
  std::string key;
  std::string value;
  bool operator==(const Message&) const = default;
};

std::vector<Message> generate_all(const GeneratorOptions& o) {
  Generator g(o);
  std::vector<Message> out;
  GeneratedMessage m;
  while (g.next(m)) out.push_back({m.kind, m.invalid, std::string(m.key), std::string(m.value)});
  return out;
}

TEST(Generator, SameSeedSameMessagesDifferentSeedDifferent) {
  const auto a = generate_all(options(5000, 42));
  const auto b = generate_all(options(5000, 42));
  const auto c = generate_all(options(5000, 43));
  ASSERT_EQ(a.size(), 5000U);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(Generator, IdsAreDistinctAndCarryPrefixAndSeed) {
  auto o = options(2000, 7);
  o.id_prefix = "load";
  std::set<std::string> ids;
  for (const Message& m : generate_all(o)) {
    const auto start = m.value.find(R"("id": ")");
    ASSERT_EQ(start, 1U) << m.value;
    const auto end = m.value.find('"', start + 7);
    const std::string id = m.value.substr(start + 7, end - start - 7);
    EXPECT_EQ(id.rfind("load-7-", 0), 0U) << id;
    ids.insert(id);
  }
  EXPECT_EQ(ids.size(), 2000U);
}

TEST(Generator, EveryKindValidatesAsIntended) {
  const std::map<InvalidKind, RequestError> expected = {
      {InvalidKind::malformed_json, RequestError::malformed_json},
      {InvalidKind::negative_amount, RequestError::amount_not_positive},
      {InvalidKind::float_amount, RequestError::amount_not_integer},
      {InvalidKind::unknown_key, RequestError::unknown_key},
      {InvalidKind::same_account, RequestError::same_account},
      {InvalidKind::missing_field, RequestError::missing_to},
      {InvalidKind::leading_zero, RequestError::amount_leading_zero},
      {InvalidKind::bad_currency, RequestError::bad_currency},
      {InvalidKind::not_utf8, RequestError::not_utf8},
  };
  std::set<InvalidKind> seen;
  for (const Message& m : generate_all(options(20'000, 5))) {
    RequestView v;
    const RequestError e = parse_request(m.value, v);
    if (m.kind == GeneratedKind::invalid) {
      EXPECT_EQ(error_code(e), error_code(expected.at(m.invalid)))
          << to_string(m.invalid) << ": " << m.value;
      seen.insert(m.invalid);
      continue;
    }
    ASSERT_EQ(e, RequestError::ok) << m.value;
    EXPECT_EQ(v.from, m.key);  // key = source account
    EXPECT_NE(v.from, v.to);
    switch (m.kind) {
      case GeneratedKind::valid:
        EXPECT_GE(v.amount, 1);
        EXPECT_LE(v.amount, 10'000);
        EXPECT_EQ(v.from.rfind("acct-unknown-", 0), std::string_view::npos);
        EXPECT_EQ(v.to.rfind("acct-unknown-", 0), std::string_view::npos);
        break;
      case GeneratedKind::overdraw:
        EXPECT_GT(v.amount, 1'000'000'000);
        break;
      case GeneratedKind::unknown_account:
        EXPECT_TRUE(v.from.rfind("acct-unknown-", 0) == 0 || v.to.rfind("acct-unknown-", 0) == 0)
            << m.value;
        break;
      case GeneratedKind::invalid:
        break;
    }
  }
  EXPECT_EQ(seen.size(), kInvalidKindCount);  // the rotation reaches every kind
}

TEST(Generator, RatiosAreRoughlyRespected) {
  constexpr std::uint64_t n = 100'000;
  Generator g(options(n, 11));
  GeneratedMessage m;
  while (g.next(m)) {
  }
  auto near = [](std::uint64_t got, double want) {
    // 5 standard deviations of a binomial count.
    return std::abs(static_cast<double>(got) - want) <= 5 * std::sqrt(want) + 1;
  };
  EXPECT_TRUE(near(g.count(GeneratedKind::invalid), 0.05 * n)) << g.count(GeneratedKind::invalid);
  EXPECT_TRUE(near(g.count(GeneratedKind::overdraw), 0.02 * n)) << g.count(GeneratedKind::overdraw);
  EXPECT_TRUE(near(g.count(GeneratedKind::unknown_account), 0.01 * n))
      << g.count(GeneratedKind::unknown_account);
  std::uint64_t total = 0;
  for (auto k : {GeneratedKind::valid, GeneratedKind::overdraw, GeneratedKind::unknown_account,
                 GeneratedKind::invalid}) {
    total += g.count(k);
  }
  EXPECT_EQ(total, n);
  // Invalid kinds rotate: counts differ by at most one.
  std::uint64_t lo = UINT64_MAX;
  std::uint64_t hi = 0;
  for (std::size_t i = 0; i < kInvalidKindCount; ++i) {
    lo = std::min(lo, g.count(static_cast<InvalidKind>(i)));
    hi = std::max(hi, g.count(static_cast<InvalidKind>(i)));
  }
  EXPECT_LE(hi - lo, 1U);
}

TEST(Generator, ZeroRatiosGiveOnlyValidRequests) {
  auto o = options(3000, 3);
  o.invalid_ratio = o.overdraw_ratio = o.unknown_ratio = 0;
  for (const Message& m : generate_all(o)) EXPECT_EQ(m.kind, GeneratedKind::valid);
}

TEST(Generator, AccountChoiceIsZipfSkewed) {
  auto o = options(50'000, 9);
  o.invalid_ratio = o.overdraw_ratio = o.unknown_ratio = 0;
  std::map<std::string, std::uint64_t> by_source;
  for (const Message& m : generate_all(o)) ++by_source[m.key];
  // Zipf(s=1.1) over 100 accounts: acct-0 has 1/H(100, 1.1) of the draws
  // (~21%), acct-99 about 100^-1.1 of that. `to` is redrawn when it equals
  // `from`, which does not change the source's share.
  double h = 0;
  for (int i = 1; i <= 100; ++i) h += std::pow(i, -1.1);
  const double top_share = static_cast<double>(by_source["acct-0"]) / 50'000.0;
  EXPECT_NEAR(top_share, 1.0 / h, 0.02);
  EXPECT_GT(by_source["acct-0"], 20 * std::max<std::uint64_t>(by_source["acct-99"], 1));
  EXPECT_GT(by_source["acct-1"], by_source["acct-10"]);
  EXPECT_GT(by_source.size(), 90U);  // the tail is still reached
}

TEST(Generator, ZipfTableAndDirectDrawsAgree) {
  auto o = options(1, 1);
  o.accounts = 10;
  Generator g(o);
  EXPECT_EQ(g.zipf_index(0.0), 0U);
  EXPECT_EQ(g.zipf_index(0.999999), 9U);
  EXPECT_LE(g.zipf_index(0.5), g.zipf_index(0.9));
}

TEST(Generator, RejectsBadOptions) {
  auto o = options(10, 1);
  EXPECT_TRUE(Generator::validate(o).is_ok());
  o.invalid_ratio = 0.6;
  o.overdraw_ratio = 0.6;
  EXPECT_EQ(Generator::validate(o).kind(), ErrorKind::fatal);
  o = options(10, 1);
  o.accounts = 1;
  EXPECT_FALSE(Generator::validate(o).is_ok());
  o = options(10, 1);
  o.id_prefix = "has space";
  EXPECT_FALSE(Generator::validate(o).is_ok());
  o = options(10, 1);
  o.unknown_ratio = -0.1;
  EXPECT_FALSE(Generator::validate(o).is_ok());
}

// ---- Kafka errors and configuration ----------------------------------------

TEST(KafkaErrors, MapOntoTheTaxonomy) {
  EXPECT_EQ(classify_kafka_error(RD_KAFKA_RESP_ERR_NO_ERROR), ErrorKind::ok);
  EXPECT_EQ(classify_kafka_error(RD_KAFKA_RESP_ERR__TRANSPORT), ErrorKind::retry_call);
  EXPECT_EQ(classify_kafka_error(RD_KAFKA_RESP_ERR__QUEUE_FULL), ErrorKind::retry_call);
  EXPECT_EQ(classify_kafka_error(RD_KAFKA_RESP_ERR__MSG_TIMED_OUT), ErrorKind::retry_call);
  EXPECT_EQ(classify_kafka_error(RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION),
            ErrorKind::retry_call);
  EXPECT_EQ(classify_kafka_error(RD_KAFKA_RESP_ERR__FATAL), ErrorKind::fatal);
  EXPECT_EQ(classify_kafka_error(RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED), ErrorKind::fatal);
  EXPECT_EQ(classify_kafka_error(RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE), ErrorKind::fatal);
  // librdkafka's own flags win.
  EXPECT_EQ(classify_kafka_error(RD_KAFKA_RESP_ERR__TRANSPORT, true, false), ErrorKind::fatal);
  EXPECT_EQ(classify_kafka_error(RD_KAFKA_RESP_ERR_INVALID_CONFIG, false, true),
            ErrorKind::retry_call);
  const Status s = kafka_status(RD_KAFKA_RESP_ERR__TRANSPORT, "produce");
  EXPECT_EQ(s.kind(), ErrorKind::retry_call);
  EXPECT_NE(s.message().find("_TRANSPORT"), std::string::npos) << s.message();
  EXPECT_TRUE(kafka_status(static_cast<const rd_kafka_error_t*>(nullptr), "x").is_ok());
  // A new producer cures a broken sequence, not a refusal.
  EXPECT_TRUE(cured_by_new_producer(RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER));
  EXPECT_TRUE(cured_by_new_producer(RD_KAFKA_RESP_ERR_UNKNOWN_PRODUCER_ID));
  EXPECT_FALSE(cured_by_new_producer(RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED));
  EXPECT_FALSE(cured_by_new_producer(RD_KAFKA_RESP_ERR__GAPLESS_GUARANTEE));
}

TEST(KafkaConf, BadKeyOrValueIsFatalAndNamesTheKey) {
  ConfPtr conf;
  EXPECT_TRUE(make_conf({{"linger.ms", "7"}, {"client.id", "x"}}, conf).is_ok());
  ASSERT_TRUE(conf);

  Status s = make_conf({{"linger.ms", "soon"}}, conf);
  EXPECT_EQ(s.kind(), ErrorKind::fatal);
  EXPECT_NE(s.message().find("linger.ms"), std::string::npos) << s.message();

  s = make_conf({{"no.such.thing", "1"}}, conf);
  EXPECT_EQ(s.kind(), ErrorKind::fatal);
  EXPECT_NE(s.message().find("no.such.thing"), std::string::npos) << s.message();
}

TEST(KafkaConf, NeverPrintsASecretValue) {
  ConfPtr conf;
  // librdkafka's own message would quote the value; ours must not.
  const Status s = make_conf({{"my.password", "hunter2"}}, conf);
  EXPECT_EQ(s.kind(), ErrorKind::fatal);
  EXPECT_NE(s.message().find("my.password"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("hunter2"), std::string::npos) << s.message();
}

// ---- KafkaProducer without a broker -------------------------------------------

struct Recorder final : DeliveryHandler {
  std::vector<std::pair<void*, rd_kafka_resp_err_t>> reports;
  void on_delivery(const rd_kafka_message_t& m) override { reports.emplace_back(m._private, m.err); }
};

KafkaProducerOptions unreachable(std::vector<KeyValue> extra) {
  KafkaProducerOptions o;
  // Port 1 on loopback: connection refused at once, nothing to start.
  o.brokers = "127.0.0.1:1";
  o.kafka_opts = {{"message.timeout.ms", "300"}, {"log_level", "0"}};
  o.kafka_opts.insert(o.kafka_opts.end(), extra.begin(), extra.end());
  return o;
}

TEST(KafkaProducer, EveryMessageIsReportedOnceWithItsOpaque) {
  Recorder rec;
  std::unique_ptr<KafkaProducer> p;
  ASSERT_TRUE(KafkaProducer::create(unreachable({}), &rec, p).is_ok());
  int tags[3] = {};
  const MessageHeader headers[] = {{"saga.error", "x"}, {"saga.source", "t/0/1"}};
  for (int& t : tags) ASSERT_TRUE(p->produce("transfers.requests", "k", "v", headers, &t).is_ok());
  EXPECT_GE(p->outq_len(), 3);  // messages plus any queued events
  EXPECT_TRUE(p->flush(std::chrono::seconds(10)));
  ASSERT_EQ(rec.reports.size(), 3U);
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(rec.reports[i].first, &tags[i]);
    EXPECT_EQ(rec.reports[i].second, RD_KAFKA_RESP_ERR__MSG_TIMED_OUT);
  }
  EXPECT_EQ(p->failed(), 3U);
  EXPECT_EQ(p->delivered(), 0U);
  EXPECT_EQ(p->close(std::chrono::seconds(1)), 0);
  EXPECT_EQ(p->produce("t", "", "v").kind(), ErrorKind::fatal);  // closed
}

TEST(KafkaProducer, CloseReportsWhatItPurges) {
  Recorder rec;
  std::unique_ptr<KafkaProducer> p;
  ASSERT_TRUE(
      KafkaProducer::create(unreachable({{"message.timeout.ms", "60000"}}), &rec, p).is_ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(p->produce("t", "", "v").is_ok());
  EXPECT_EQ(p->close(std::chrono::milliseconds(100)), 5);
  ASSERT_EQ(rec.reports.size(), 5U);
  for (const auto& r : rec.reports) EXPECT_NE(r.second, RD_KAFKA_RESP_ERR_NO_ERROR);
}

TEST(KafkaProducer, QueueFullWaitsBoundedThenRetryCall) {
  Recorder rec;
  auto o = unreachable({{"queue.buffering.max.messages", "4"}, {"message.timeout.ms", "60000"}});
  o.queue_full_wait = std::chrono::milliseconds(200);
  std::unique_ptr<KafkaProducer> p;
  ASSERT_TRUE(KafkaProducer::create(o, &rec, p).is_ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(p->produce("t", "", "v").is_ok());
  const auto start = std::chrono::steady_clock::now();
  const Status s = p->produce("t", "", "v");
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(s.kind(), ErrorKind::retry_call) << s.message();
  EXPECT_GE(waited, std::chrono::milliseconds(200));
  EXPECT_LT(waited, std::chrono::seconds(5));
  EXPECT_EQ(p->close(std::chrono::milliseconds(10)), 4);
  EXPECT_EQ(rec.reports.size(), 4U);  // the refused one was never queued
}

TEST(KafkaProducer, RejectsBadConfigurationAtCreate) {
  std::unique_ptr<KafkaProducer> p;
  Status s = KafkaProducer::create(unreachable({{"compression.type", "brotli"}}), nullptr, p);
  EXPECT_EQ(s.kind(), ErrorKind::fatal);
  EXPECT_NE(s.message().find("compression.type"), std::string::npos) << s.message();
  EXPECT_FALSE(p);
  KafkaProducerOptions none;
  EXPECT_FALSE(KafkaProducer::create(none, nullptr, p).is_ok());
}

// ---- TransferProducer without a broker ------------------------------------

TransferProducerOptions unreachable_transfers() {
  TransferProducerOptions o;
  o.brokers = "127.0.0.1:1";  // connection refused at once
  o.kafka_opts = {{"message.timeout.ms", "300"}, {"log_level", "0"}};
  return o;
}

TEST(TransferProducer, BadOptionIsFatalAndNamesTheKeyNeverTheValue) {
  std::unique_ptr<TransferProducer> p;
  auto o = unreachable_transfers();
  o.kafka_opts.emplace_back("compression.type", "s3cr3t-value");
  Status s = TransferProducer::create(o, p);
  EXPECT_EQ(s.kind(), ErrorKind::fatal);
  EXPECT_NE(s.message().find("'compression.type'"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("s3cr3t-value"), std::string::npos) << s.message();
  EXPECT_FALSE(p);

  o = unreachable_transfers();
  o.kafka_opts.emplace_back("no.such.property", "x");
  s = TransferProducer::create(o, p);
  EXPECT_NE(s.message().find("no such librdkafka property"), std::string::npos) << s.message();

  o = unreachable_transfers();
  o.brokers.clear();
  EXPECT_EQ(TransferProducer::create(o, p).kind(), ErrorKind::fatal);
}

// The librdkafka properties a producer made from `o` is configured with, by
// key, as its configure hook sees them.
std::map<std::string, std::string> configured(TransferProducerOptions o, std::initializer_list<const char*> keys) {
  std::map<std::string, std::string> seen;
  o.configure = [&](rd_kafka_conf_t& conf) {
    for (const char* key : keys) {
      std::array<char, 256> value{};
      std::size_t size = value.size();
      ASSERT_EQ(rd_kafka_conf_get(&conf, key, value.data(), &size), RD_KAFKA_CONF_OK) << key;
      seen[key] = value.data();
    }
  };
  std::unique_ptr<TransferProducer> p;
  EXPECT_TRUE(TransferProducer::create(o, p).is_ok());
  return seen;
}

TEST(TransferProducer, ConfigureSeesTheDefaultsAndTheOptionsThatOverrideThem) {
  auto o = unreachable_transfers();
  o.kafka_opts.emplace_back("linger.ms", "50");
  auto seen = configured(o, {"enable.idempotence", "linger.ms", "client.id"});
  EXPECT_EQ(seen["enable.idempotence"], "true");
  EXPECT_EQ(seen["linger.ms"], "50");
  EXPECT_EQ(seen["client.id"], "sagapool-producer");
}

// Requests published one call at a time wait for company: with 5 ms, a third
// to two thirds of the broker's CPU a transfer at half load went on small
// produce requests (bench/REPORT.md, "The thirty-second session").
TEST(TransferProducer, ByDefaultARequestWaitsUpTo25msToShareItsProduceRequest) {
  EXPECT_EQ(configured(unreachable_transfers(), {"linger.ms"})["linger.ms"], "25");
}

TEST(TransferProducer, QueueFullWaitsBoundedThenRetryCallAndCloseReportsTheRest) {
  auto o = unreachable_transfers();
  o.kafka_opts.emplace_back("queue.buffering.max.messages", "4");
  o.kafka_opts.emplace_back("message.timeout.ms", "60000");
  o.queue_full_wait = std::chrono::milliseconds(200);
  std::vector<TransferDelivery> got;
  std::unique_ptr<TransferProducer> p;
  ASSERT_TRUE(TransferProducer::create(o, p, [&](const TransferDelivery& d) {
                got.push_back(d);
              }).is_ok());
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(p->publish_raw("acct-1", "v").is_ok());
  const auto start = std::chrono::steady_clock::now();
  const Status s = p->publish_raw("acct-1", "v");
  const auto waited = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(s.kind(), ErrorKind::retry_call) << s.message();
  EXPECT_GE(waited, std::chrono::milliseconds(200));
  EXPECT_LT(waited, std::chrono::seconds(5));
  EXPECT_EQ(p->published(), 4U);  // the refused one was never queued
  EXPECT_EQ(p->close(std::chrono::milliseconds(10)), 4);
  EXPECT_EQ(got.size(), 4U);
  EXPECT_EQ(p->failed(), 4U);
  EXPECT_EQ(p->in_flight(), 0U);
  EXPECT_EQ(p->publish_raw("acct-1", "v").kind(), ErrorKind::fatal);  // closed
}

TEST(TransferProducer, RefusesAnInvalidRequestWithoutSending) {
  const TransferProducerOptions o = unreachable_transfers();
  std::vector<TransferDelivery> got;
  std::unique_ptr<TransferProducer> p;
  ASSERT_TRUE(TransferProducer::create(o, p, [&](const TransferDelivery& d) {
                got.push_back(d);
              }).is_ok());
  const Status bad = p->publish({"t-1", "acct-1", "acct-1", 5, "", ""});
  EXPECT_EQ(bad.kind(), ErrorKind::fatal);
  EXPECT_NE(bad.message().find("same_account"), std::string::npos) << bad.message();
  int tag = 0;
  ASSERT_TRUE(p->publish({"t-2", "acct-1", "acct-2", 5, "", ""}, &tag).is_ok());
  EXPECT_EQ(p->published(), 1U);
  EXPECT_TRUE(p->flush(std::chrono::seconds(10)));
  ASSERT_EQ(got.size(), 1U);
  EXPECT_EQ(got[0].opaque, &tag);
  EXPECT_EQ(got[0].status.kind(), ErrorKind::retry_call);
  EXPECT_EQ(p->failed(), 1U);
  EXPECT_FALSE(p->first_error().empty());
}

}  // namespace
}  // namespace sagapool
