// The ecosystem's own tools against the workers on a real Kafka: requests
// published with Kafka's console producer and with kcat, outcomes read with
// Kafka's console consumer, and after the drain the group's committed offsets
// as kafka-consumer-groups reports them equal the log end offsets; while a
// backlog drains, that tool's group lag matches saga_kafka_consumer_lag.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "http_get.hpp"
#include "ledger_cluster.hpp"

namespace sagapool::test {
namespace {

using namespace std::chrono_literals;

// One of Kafka's tools through tools/kafka/kafka.sh; `stdin_file` (if any)
// is its standard input.
RunResult kafka_tool(const std::string& args, const std::filesystem::path& stdin_file = {}) {
  std::string cmd = std::string(SAGA_SOURCE_DIR) + "/tools/kafka/kafka.sh tool " + args;
  if (!stdin_file.empty()) cmd += " < '" + stdin_file.string() + "'";
  return run({"/bin/bash", "-c", cmd}, {}, 180s);
}

// The LAG column of kafka-consumer-groups --describe, summed over the
// request partitions (-1 if the tool failed). A partition with no committed
// offset yet ("-") lags by its whole log: the logs here start at offset 0.
long long group_lag(const std::string& bootstrap, const std::string& group, std::string& output) {
  const RunResult r = kafka_tool(
      "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand --bootstrap-server " + bootstrap +
      " --describe --group " + group);
  output = r.output;
  if (r.exit_code != 0) return -1;
  long long total = 0;
  int partitions = 0;
  std::istringstream rows(r.output);
  for (std::string row; std::getline(rows, row);) {
    std::istringstream cols(row);
    std::string name, topic, partition, current, end, lag;
    if (!(cols >> name >> topic >> partition >> current >> end >> lag) || topic != "transfers.requests") continue;
    total += std::stoll(lag == "-" && current == "-" ? end : lag);
    ++partitions;
  }
  return partitions > 0 ? total : -1;
}

// saga_kafka_consumer_lag summed over the partitions a worker reports.
long long metric_lag(int port) {
  const HttpReply reply = http_get(port, "/metrics");
  long long total = 0;
  std::istringstream lines(reply.body);
  for (std::string line; std::getline(lines, line);) {
    if (!line.starts_with("saga_kafka_consumer_lag{")) continue;
    total += std::llround(std::stod(line.substr(line.rfind(' ') + 1)));
  }
  return total;
}

TEST(KafkaInterop, ConsoleToolsAndKcatTalkToTheWorkers) {
  LedgerCluster cluster(1, 20,
                        {.partitions = 3,
                         .brokers = 1,
                         .real_kafka = true,
                         .backend = LedgerCluster::Backend::sqlite});
  const std::vector<PlannedTransfer> transfers = cluster.plan(400, 41);
  const std::filesystem::path by_console = cluster.log_of("by-console");  // key|value lines
  const std::filesystem::path by_kcat = cluster.log_of("by-kcat");
  {
    std::ofstream console(by_console), kcat(by_kcat);
    for (std::size_t i = 0; i < transfers.size(); ++i) {
      (i % 2 ? kcat : console) << transfers[i].from << '|' << LedgerCluster::request(transfers[i]) << '\n';
    }
  }
  const std::string bootstrap = cluster.bootstrap();
  const RunResult console = kafka_tool(
      "kafka.tools.ConsoleProducer --bootstrap-server " + bootstrap +
          " --topic transfers.requests --property parse.key=true --property key.separator='|'",
      by_console);
  ASSERT_EQ(console.exit_code, 0) << console.output;
  const RunResult kcat = run({"/usr/bin/kcat", "-b", bootstrap, "-P", "-t", "transfers.requests",
                              "-K", "|", "-l", by_kcat.string()});
  ASSERT_EQ(kcat.exit_code, 0) << kcat.output;

  std::vector<Process> workers;
  workers.push_back(cluster.start_worker("w0"));
  workers.push_back(cluster.start_worker("w1"));
  ASSERT_TRUE(cluster.wait_finished(transfers.size(), 120s));

  // Outcomes, keyed by transfer id, as Kafka's console consumer prints them.
  const RunResult read = kafka_tool(
      "org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server " + bootstrap +
      " --topic transfers.results --from-beginning --timeout-ms 10000"
      " --property print.key=true --property key.separator='|'");
  std::set<std::string> ids;
  std::istringstream lines(read.output);
  for (std::string line; std::getline(lines, line);) {
    const std::size_t bar = line.find('|');
    if (bar == std::string::npos || line.find(R"("id":")") == std::string::npos) continue;
    const std::string key = line.substr(0, bar);
    EXPECT_NE(line.find(R"({"id":")" + key + '"', bar), std::string::npos) << line;
    ids.insert(key);
  }
  EXPECT_EQ(ids.size(), transfers.size()) << read.output.substr(0, 2000);

  for (std::size_t i = 0; i < workers.size(); ++i) {
    EXPECT_EQ(workers[i].stop(30s), 0) << read_file(cluster.log_of("w" + std::to_string(i)));
  }
  // After the drain: committed == log end on every request partition.
  const RunResult groups = kafka_tool(
      "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand --bootstrap-server " + bootstrap +
      " --describe --group g");
  ASSERT_EQ(groups.exit_code, 0) << groups.output;
  int partitions = 0;
  long long end_total = 0;
  std::istringstream rows(groups.output);
  for (std::string row; std::getline(rows, row);) {
    std::istringstream cols(row);
    std::string group, topic, partition, current, end, lag;
    if (!(cols >> group >> topic >> partition >> current >> end >> lag) || topic != "transfers.requests") {
      continue;
    }
    ++partitions;
    EXPECT_EQ(current, end) << row;
    EXPECT_EQ(lag, "0") << row;
    end_total += std::stoll(end);
  }
  EXPECT_EQ(partitions, 3) << groups.output;
  EXPECT_EQ(end_total, static_cast<long long>(transfers.size())) << groups.output;

  cluster.expect_outcomes(transfers);
  cluster.expect_balances(transfers);
  cluster.expect_audit_passes();
}

// A backlog drained slowly (a 1 s pause per batch of 100): Kafka's own view
// of the group's lag (log end - committed offset, from
// kafka-consumer-groups) lies between two scrapes of the worker's
// saga_kafka_consumer_lag taken before and after it, give or take one batch
// (the worker commits stored offsets every 500 ms).
TEST(KafkaInterop, GroupLagMatchesTheWorkersLagMetric) {
  constexpr long long kBatch = 100;
  LedgerCluster cluster(1, 20,
                        {.partitions = 3,
                         .brokers = 1,
                         .real_kafka = true,
                         .backend = LedgerCluster::Backend::sqlite});
  const std::vector<PlannedTransfer> transfers = cluster.plan(3000, 43);
  std::vector<std::pair<std::string, std::string>> messages;
  for (const auto& t : transfers) messages.emplace_back(t.id, LedgerCluster::request(t));
  produce(cluster.bootstrap(), "transfers.requests", messages);
  const int port = free_loopback_port();
  Process worker = cluster.start_worker(
      "w0", "127.0.0.1:" + std::to_string(port),
      // A long lease: the slow loop marks outcomes published late, and
      // recovery would publish them again (harmless, but noise here).
      {"--batch-size", std::to_string(kBatch), "--lease", "60s", "--kafka-opt", "statistics.interval.ms=200"},
      {"SAGA_FAILPOINTS=before_store_offsets=pause:1s"});
  ASSERT_TRUE(eventually([&] { return metric_lag(port) > 0; }, 60s)) << read_file(cluster.log_of("w0"));

  int compared = 0;
  for (int round = 0; round < 4; ++round) {
    const long long before = metric_lag(port);
    std::string output;
    const long long group = group_lag(cluster.bootstrap(), "g", output);
    const long long after = metric_lag(port);
    std::cout << "round " << round << ": metric " << before << ", group " << group << ", metric " << after << "\n";
    if (group < 0) std::cout << output << "\n";
    if (group < 0 || before == 0) continue;  // the tool failed, or drained
    ++compared;
    EXPECT_GE(group, after - kBatch) << output;
    EXPECT_LE(group, before + kBatch) << output;
  }
  EXPECT_GE(compared, 2) << "too few rounds while a backlog was left";
  ASSERT_TRUE(cluster.wait_finished(transfers.size(), 120s)) << read_file(cluster.log_of("w0"));
  EXPECT_TRUE(eventually([&] { return metric_lag(port) == 0; }, 10s));
  EXPECT_EQ(worker.stop(30s), 0) << read_file(cluster.log_of("w0"));
  cluster.expect_outcomes(transfers);
  cluster.expect_audit_passes();
}

// A second client library (confluent-kafka for Python, installed by ./dev
// into the build folder) publishes requests and reads their outcomes.
TEST(KafkaInterop, ASecondClientLibraryPublishesAndReadsOutcomes) {
  const std::filesystem::path python = SAGA_PYTHON;
  ASSERT_TRUE(std::filesystem::exists(python))
      << python << " is missing: ./dev build installs confluent-kafka there";
  LedgerCluster cluster(1, 20,
                        {.partitions = 3,
                         .brokers = 1,
                         .real_kafka = true,
                         .backend = LedgerCluster::Backend::sqlite});
  const std::vector<PlannedTransfer> transfers = cluster.plan(300, 42);
  const std::filesystem::path requests = cluster.log_of("by-python");  // key|value lines
  {
    std::ofstream out(requests);
    for (const auto& t : transfers) out << t.from << '|' << LedgerCluster::request(t) << '\n';
  }
  std::vector<Process> workers;
  workers.push_back(cluster.start_worker("w0"));
  const RunResult client =
      run({python.string(), std::string(SAGA_SOURCE_DIR) + "/tests/kafka/confluent_client.py",
           cluster.bootstrap(), requests.string()},
          {}, 240s);
  EXPECT_EQ(client.exit_code, 0) << client.output;
  ASSERT_TRUE(cluster.wait_finished(transfers.size(), 60s));
  EXPECT_EQ(workers[0].stop(30s), 0) << read_file(cluster.log_of("w0"));
  cluster.expect_outcomes(transfers);
  cluster.expect_audit_passes();
}

}  // namespace
}  // namespace sagapool::test
