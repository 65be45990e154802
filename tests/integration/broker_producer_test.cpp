// saga-broker and saga-producer end to end: topics and partitions, generated
// and file input arriving exactly once and byte-identical, consumer groups
// and the idempotent producer against the mock, fault injection through the
// control pipe, failure exit codes, and a clean SIGTERM.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "process.hpp"
#include "sagapool/generator.hpp"
#include "sagapool/kafka.hpp"
#include "sagapool/request.hpp"

namespace sagapool::test {
namespace {

using namespace std::chrono_literals;

struct Msg {
  bool has_key = false;
  std::string key;
  std::string value;
  std::int32_t partition = -1;
};

// A saga-broker of our own (the shared test helper does not take the
// control pipe); SIGKILLed by ~Process if a test fails midway.
struct BrokerUnderTest {
  Process process;
  std::string bootstrap;
  std::filesystem::path log;
  std::filesystem::path bootstrap_file;

  static BrokerUnderTest start(const TempDir& dir, int partitions,
                               std::vector<std::string> extra = {}) {
    BrokerUnderTest b;
    b.log = dir / "broker.log";
    b.bootstrap_file = dir / "bootstrap";
    std::vector<std::string> argv = {bin("saga-broker").string(), "--partitions",
                                     std::to_string(partitions), "--bootstrap-file",
                                     b.bootstrap_file.string()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    b.process = Process::start(argv, b.log);
    // The file appears whole (rename), so a non-empty read is the full line.
    EXPECT_TRUE(eventually([&] { return !read_file(b.bootstrap_file).empty(); }, 20s))
        << read_file(b.log);
    b.bootstrap = read_file(b.bootstrap_file);
    EXPECT_FALSE(b.bootstrap.empty());
    EXPECT_EQ(b.bootstrap.back(), '\n');
    b.bootstrap.erase(b.bootstrap.find_last_not_of('\n') + 1);
    return b;
  }
};

KafkaHandle client(rd_kafka_type_t type, std::vector<KeyValue> opts) {
  ConfPtr conf;
  const Status s = make_conf(opts, conf);
  EXPECT_TRUE(s.is_ok()) << s.message();
  if (!s) return {};
  std::array<char, 512> err{};
  KafkaHandle rk(rd_kafka_new(type, conf.get(), err.data(), err.size()));
  EXPECT_TRUE(rk) << err.data();
  if (rk) (void)conf.release();
  return rk;
}

std::map<std::string, int> partition_counts(const std::string& bootstrap) {
  KafkaHandle rk = client(RD_KAFKA_PRODUCER, {{"bootstrap.servers", bootstrap}});
  std::map<std::string, int> out;
  const rd_kafka_metadata_t* raw = nullptr;
  if (!rk || rd_kafka_metadata(rk.get(), 1, nullptr, &raw, 10'000) != RD_KAFKA_RESP_ERR_NO_ERROR) {
    return out;
  }
  const MetadataPtr md(raw);
  for (int i = 0; i < md->topic_cnt; ++i) out[md->topics[i].topic] = md->topics[i].partition_cnt;
  return out;
}

void append_message(std::vector<Msg>& out, const rd_kafka_message_t& m) {
  Msg msg;
  msg.has_key = m.key != nullptr;
  if (m.key != nullptr) msg.key.assign(static_cast<const char*>(m.key), m.key_len);
  if (m.payload != nullptr) msg.value.assign(static_cast<const char*>(m.payload), m.len);
  msg.partition = m.partition;
  out.push_back(std::move(msg));
}

// Reads every partition of `topic` from the beginning (assign, no group),
// until `expected` arrived, then 1 s more to catch extras.
std::vector<Msg> read_topic(const std::string& bootstrap, const std::string& topic,
                            std::size_t expected, std::chrono::milliseconds timeout = 60s) {
  const int partitions = partition_counts(bootstrap)[topic];
  EXPECT_GT(partitions, 0);
  KafkaHandle rk = client(RD_KAFKA_CONSUMER, {{"bootstrap.servers", bootstrap},
                                             {"group.id", "broker-producer-test-reader"},
                                             {"enable.auto.commit", "false"}});
  std::vector<Msg> out;
  if (!rk) return out;
  TopicPartitionListPtr tps(rd_kafka_topic_partition_list_new(partitions));
  for (int p = 0; p < partitions; ++p) {
    rd_kafka_topic_partition_list_add(tps.get(), topic.c_str(), p)->offset =
        RD_KAFKA_OFFSET_BEGINNING;
  }
  EXPECT_EQ(rd_kafka_assign(rk.get(), tps.get()), RD_KAFKA_RESP_ERR_NO_ERROR);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::chrono::steady_clock::time_point settle_until{};
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    if (out.size() >= expected && settle_until == std::chrono::steady_clock::time_point{}) {
      settle_until = now + 1s;
    }
    if (settle_until != std::chrono::steady_clock::time_point{} ? now >= settle_until
                                                                 : now >= deadline) {
      break;
    }
    const MessagePtr m(rd_kafka_consumer_poll(rk.get(), 100));
    if (m && m->err == RD_KAFKA_RESP_ERR_NO_ERROR) append_message(out, *m);
  }
  (void)rd_kafka_consumer_close(rk.get());
  return out;
}

std::string id_of(const std::string& value) {
  const std::string marker = R"("id": ")";
  const auto start = value.find(marker);
  if (start == std::string::npos) return "";
  const auto end = value.find('"', start + marker.size());
  return value.substr(start + marker.size(), end - start - marker.size());
}

std::filesystem::path find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/bin:/bin";
  std::size_t pos = 0;
  while (pos <= dirs.size()) {
    const auto colon = std::min(dirs.find(':', pos), dirs.size());
    const std::filesystem::path candidate = std::filesystem::path(dirs.substr(pos, colon - pos)) / name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    pos = colon + 1;
  }
  return {};
}

void write_file(const std::filesystem::path& p, const std::string& content) {
  std::ofstream out(p, std::ios::binary);
  out << content;
}

// The file-mode fixture: valid lines (one with metadata), invalid ones
// (not JSON, not UTF-8, wrong amount), a blank line that must be skipped.
const std::vector<std::string> kLines = {
    R"({"id": "f-1", "from": "acct-1", "to": "acct-2", "amount": 2500, "currency": "EUR", "metadata": {"ref": "invoice 9"}})",
    "this is not json",
    R"({"id": "f-3", "from": "acct-3", "to": "acct-1", "amount": 7})",
    "{\"id\": \"f-4\", \"from\": \"acct-\xff\", \"to\": \"acct-2\", \"amount\": 1}",
    R"({"id": "f-5", "from": "acct-2", "to": "acct-3", "amount": 1.5}   )",
};

std::string lines_file_content() {
  std::string s;
  for (std::size_t i = 0; i < kLines.size(); ++i) {
    s += kLines[i];
    s += '\n';
    if (i == 1) s += '\n';  // blank line: skipped
  }
  return s;
}

void expect_lines_arrived(const std::vector<Msg>& got) {
  ASSERT_EQ(got.size(), kLines.size());
  std::multiset<std::string> want(kLines.begin(), kLines.end());
  std::multiset<std::string> have;
  for (const Msg& m : got) {
    have.insert(m.value);
    RequestView v;
    if (parse_request(m.value, v) == RequestError::ok) {
      EXPECT_TRUE(m.has_key) << m.value;
      EXPECT_EQ(m.key, v.from);
    } else {
      EXPECT_FALSE(m.has_key) << m.value;  // invalid: sent without a key
    }
  }
  EXPECT_EQ(have, want);  // byte-identical, nothing lost, nothing extra
}

TEST(BrokerProducer, BrokerCreatesTheThreeTopicsWithNPartitions) {
  TempDir dir("saga-bp");
  BrokerUnderTest broker = BrokerUnderTest::start(dir, 5);
  const auto counts = partition_counts(broker.bootstrap);
  for (const char* t : {"transfers.requests", "transfers.results", "transfers.dlq"}) {
    ASSERT_TRUE(counts.count(t)) << t;
    EXPECT_EQ(counts.at(t), 5) << t;
  }
  // stdout carries the same line as the file, before any log line.
  EXPECT_EQ(read_file(broker.log).rfind(broker.bootstrap + "\n", 0), 0U) << read_file(broker.log);
  EXPECT_NE(read_file(broker.log).find("DROPS the oldest"), std::string::npos);

  const auto kcat = find_on_path("kcat");
  if (kcat.empty()) GTEST_SKIP() << "kcat not installed";
  const RunResult r = run({kcat.string(), "-L", "-b", broker.bootstrap});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* t : {"transfers.requests", "transfers.results", "transfers.dlq"}) {
    EXPECT_NE(r.output.find("topic \"" + std::string(t) + "\" with 5 partitions"),
              std::string::npos)
        << r.output;
  }
  EXPECT_NE(r.output.find(" 3 brokers:"), std::string::npos) << r.output;
}

TEST(BrokerProducer, GeneratedRequestsArriveExactlyOnce) {
  TempDir dir("saga-bp");
  BrokerUnderTest broker = BrokerUnderTest::start(dir, 6);
  GeneratorOptions g;
  g.count = 5000;
  g.accounts = 50;
  g.seed = 4242;
  g.invalid_ratio = 0.05;
  const RunResult r = run({bin("saga-producer").string(), "--brokers", broker.bootstrap,
                           "--generate", "5000", "--accounts", "50", "--seed", "4242",
                           "--invalid-ratio", "0.05"});
  ASSERT_EQ(r.exit_code, 0) << r.output;

  // The same generator in-process says exactly what must have been sent.
  Generator expected_gen(g);
  std::multiset<std::pair<std::string, std::string>> want;
  GeneratedMessage m;
  while (expected_gen.next(m)) want.emplace(std::string(m.key), std::string(m.value));
  const std::uint64_t invalid = expected_gen.count(GeneratedKind::invalid);
  EXPECT_GT(invalid, 150U);
  EXPECT_NE(r.output.find("sent 5000, delivered 5000, failed 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("invalid " + std::to_string(invalid)), std::string::npos) << r.output;

  const std::vector<Msg> got = read_topic(broker.bootstrap, "transfers.requests", 5000);
  ASSERT_EQ(got.size(), 5000U);
  std::set<std::string> ids;
  std::map<std::string, std::int32_t> partition_of_key;
  std::uint64_t got_invalid = 0;
  std::multiset<std::pair<std::string, std::string>> have;
  for (const Msg& msg : got) {
    ids.insert(id_of(msg.value));
    have.emplace(msg.key, msg.value);
    RequestView v;
    if (parse_request(msg.value, v) != RequestError::ok) ++got_invalid;
    // Key = source account: one account's requests stay in one partition.
    const auto [it, inserted] = partition_of_key.emplace(msg.key, msg.partition);
    if (!inserted) {
      EXPECT_EQ(it->second, msg.partition) << msg.key;
    }
  }
  EXPECT_EQ(ids.size(), 5000U);
  EXPECT_EQ(got_invalid, invalid);
  EXPECT_TRUE(have == want);
}

TEST(BrokerProducer, FileAndStdinLinesArriveByteIdentical) {
  TempDir dir("saga-bp");
  BrokerUnderTest broker = BrokerUnderTest::start(dir, 3);
  const auto file = dir / "lines.jsonl";
  write_file(file, lines_file_content());

  RunResult r = run({bin("saga-producer").string(), "--brokers", broker.bootstrap, "--file",
                     file.string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("sent 5, delivered 5, failed 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("valid 2, invalid 3"), std::string::npos) << r.output;
  expect_lines_arrived(read_topic(broker.bootstrap, "transfers.requests", kLines.size()));

  // "-" reads stdin; a different topic keeps the two runs apart.
  r = run({"/bin/sh", "-c",
           bin("saga-producer").string() + " --brokers '" + broker.bootstrap +
               "' --topic transfers.results - < '" + file.string() + "'"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_lines_arrived(read_topic(broker.bootstrap, "transfers.results", kLines.size()));
}

TEST(BrokerProducer, UnreachableBrokerFailsWithAClearMessage) {
  TempDir dir("saga-bp");
  const auto file = dir / "lines.jsonl";
  write_file(file, lines_file_content());
  const std::string nowhere = "127.0.0.1:" + std::to_string(free_loopback_port());
  const auto start = std::chrono::steady_clock::now();
  const RunResult r = run({bin("saga-producer").string(), "--brokers", nowhere, "--file",
                           file.string(), "--kafka-opt", "message.timeout.ms=1500"},
                          {}, 60s);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
  // Before sending anything: the start-up check waits the delivery timeout.
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_NE(r.output.find("no Kafka broker answered at " + nowhere + " within 1s"), std::string::npos)
      << r.output;
}

TEST(BrokerProducer, BadFlagsExitWithUsageError) {
  RunResult r = run({bin("saga-producer").string(), "--brokers", "x:1"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = run({bin("saga-producer").string(), "--brokers", "x:1", "--generate", "10"});
  EXPECT_EQ(r.exit_code, 2) << r.output;  // --generate needs --accounts
  r = run({bin("saga-producer").string(), "--brokers", "x:1", "--generate", "10", "--accounts",
           "5", "--invalid-ratio", "0.7", "--overdraw-ratio", "0.7"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = run({bin("saga-producer").string(), "--brokers", "x:1", "--file", "/nonexistent/f"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = run({bin("saga-producer").string(), "--brokers", "x:1", "--generate", "10", "--accounts",
           "5", "--kafka-opt", "linger.ms=soon"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("linger.ms"), std::string::npos) << r.output;
  r = run({bin("saga-broker").string(), "--partitions", "0"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
}

// JoinGroup/SyncGroup/OffsetCommit/OffsetFetch against the mock: a group
// member commits, leaves, and the next member resumes after the commit.
TEST(BrokerProducer, ConsumerGroupResumesFromCommittedOffsets) {
  TempDir dir("saga-bp");
  BrokerUnderTest broker = BrokerUnderTest::start(dir, 4);
  const auto file = dir / "lines.jsonl";
  write_file(file, lines_file_content());
  auto produce_lines = [&] {
    const RunResult r = run({bin("saga-producer").string(), "--brokers", broker.bootstrap,
                             "--file", file.string()});
    ASSERT_EQ(r.exit_code, 0) << r.output;
  };
  std::vector<std::string> events;  // consumer errors, printed if the test fails
  auto consume_group = [&](std::size_t expected) {
    // Short heartbeats: a loaded machine must not time the member out
    // (the mock then rebalances and re-delivers uncommitted messages).
    KafkaHandle rk = client(RD_KAFKA_CONSUMER, {{"bootstrap.servers", broker.bootstrap},
                                               {"group.id", "g-resume"},
                                               {"auto.offset.reset", "earliest"},
                                               {"enable.auto.commit", "false"},
                                               {"session.timeout.ms", "10000"},
                                               {"heartbeat.interval.ms", "500"}});
    std::vector<Msg> out;
    if (!rk) return out;
    (void)rd_kafka_poll_set_consumer(rk.get());
    TopicPartitionListPtr topics(rd_kafka_topic_partition_list_new(1));
    rd_kafka_topic_partition_list_add(topics.get(), "transfers.requests", RD_KAFKA_PARTITION_UA);
    EXPECT_EQ(rd_kafka_subscribe(rk.get(), topics.get()), RD_KAFKA_RESP_ERR_NO_ERROR);
    auto poll_once = [&] {
      const MessagePtr m(rd_kafka_consumer_poll(rk.get(), 100));
      if (!m) return;
      if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        append_message(out, *m);
      } else {
        events.push_back(std::string(rd_kafka_err2name(m->err)) + ": " +
                         rd_kafka_message_errstr(m.get()));
      }
    };
    const auto start = std::chrono::steady_clock::now();
    while (out.size() < expected && std::chrono::steady_clock::now() < start + 60s) poll_once();
    events.push_back("consumed " + std::to_string(out.size()) + " after " +
                     std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                        std::chrono::steady_clock::now() - start)
                                        .count()) +
                     " ms");
    // Extras would show up here.
    for (auto until = std::chrono::steady_clock::now() + 1s;
         std::chrono::steady_clock::now() < until;) {
      poll_once();
    }
    const rd_kafka_resp_err_t commit = rd_kafka_commit(rk.get(), nullptr, 0);
    EXPECT_EQ(commit, RD_KAFKA_RESP_ERR_NO_ERROR) << rd_kafka_err2name(commit);
    const rd_kafka_resp_err_t close = rd_kafka_consumer_close(rk.get());
    EXPECT_EQ(close, RD_KAFKA_RESP_ERR_NO_ERROR) << rd_kafka_err2name(close);
    return out;
  };
  auto dump = [&] {
    std::string all;
    for (const auto& e : events) all += e + "\n";
    return all;
  };
  produce_lines();
  {
    SCOPED_TRACE("first member");
    expect_lines_arrived(consume_group(kLines.size()));
  }
  produce_lines();
  {
    SCOPED_TRACE("second member: only the second batch");
    expect_lines_arrived(consume_group(kLines.size()));
  }
  if (HasFailure()) ADD_FAILURE() << dump() << read_file(broker.log);
}

void send_control(const std::filesystem::path& fifo, const std::string& line) {
  const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(fd, 0) << fifo;
  const std::string with_nl = line + "\n";
  EXPECT_EQ(::write(fd, with_nl.data(), with_nl.size()), static_cast<ssize_t>(with_nl.size()));
  ::close(fd);
}

TEST(BrokerProducer, ControlPipeTakesBrokersDownAndUp) {
  TempDir dir("saga-bp");
  const auto fifo = dir / "control";
  BrokerUnderTest broker = BrokerUnderTest::start(dir, 3, {"--control-fifo", fifo.string()});
  const auto file = dir / "lines.jsonl";
  write_file(file, lines_file_content());
  const std::vector<std::string> produce = {bin("saga-producer").string(), "--brokers",
                                            broker.bootstrap, "--file", file.string(),
                                            "--delivery-timeout", "2s"};

  send_control(fifo, "down all");
  send_control(fifo, "frobnicate 3");
  ASSERT_TRUE(eventually(
      [&] { return read_file(broker.log).find("control: frobnicate 3 -> malformed") !=
                   std::string::npos; },
      10s))
      << read_file(broker.log);
  EXPECT_NE(read_file(broker.log).find("control: down all -> ok"), std::string::npos);
  RunResult r = run(produce);
  EXPECT_EQ(r.exit_code, 3) << r.output;  // no broker answers the start-up check

  send_control(fifo, "up all");
  send_control(fifo, "errors Produce 2 NOT_LEADER_FOR_PARTITION");
  ASSERT_TRUE(eventually(
      [&] { return read_file(broker.log).find("fail with NOT_LEADER_FOR_PARTITION") !=
                   std::string::npos; },
      10s))
      << read_file(broker.log);
  // Retriable errors are retried by the idempotent producer: all delivered.
  r = run(produce);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(broker.process.stop(), 0);
  EXPECT_FALSE(std::filesystem::exists(fifo));
}

TEST(BrokerProducer, SigtermAndSigintExitZeroAndRemoveTheBootstrapFile) {
  for (int sig : {SIGTERM, SIGINT}) {
    TempDir dir("saga-bp");
    BrokerUnderTest broker = BrokerUnderTest::start(dir, 2);
    broker.process.signal(sig);
    EXPECT_EQ(broker.process.wait(15s), std::optional<int>(0)) << read_file(broker.log);
    EXPECT_FALSE(std::filesystem::exists(broker.bootstrap_file));
  }
}

}  // namespace
}  // namespace sagapool::test
