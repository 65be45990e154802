// Kafka security for real: a node serving only SASL_SSL (SCRAM-SHA-512 over
// TLS, certificates made with openssl) with ACLs enforced. The workers and
// saga-producer connect with least privilege through flags, environment
// and a config file; a wrong password, an untrusted CA, a hidden topic and
// each missing ACL give one clear line and a non-zero exit; no password is
// ever printed.
#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>

#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "ledger_cluster.hpp"

namespace sagapool::test {
namespace {

using namespace std::chrono_literals;

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// The last non-empty line: what a program said when it gave up.
std::string last_line(const std::string& output) {
  std::string text = output;
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text.substr(text.rfind('\n') + 1);
}

class KafkaSecurity : public ::testing::Test {
 protected:
  void SetUp() override {
    using G = KafkaCluster::Grant;
    KafkaCluster& kafka = cluster_.kafka();
    kafka.allow("User:worker", {G{RD_KAFKA_RESOURCE_TOPIC, "transfers.requests", RD_KAFKA_ACL_OPERATION_READ},
                                G{RD_KAFKA_RESOURCE_TOPIC, "transfers.results", RD_KAFKA_ACL_OPERATION_WRITE},
                                G{RD_KAFKA_RESOURCE_TOPIC, "transfers.dlq", RD_KAFKA_ACL_OPERATION_WRITE},
                                G{RD_KAFKA_RESOURCE_GROUP, "g", RD_KAFKA_ACL_OPERATION_READ}});
    kafka.allow("User:producer",
                {G{RD_KAFKA_RESOURCE_TOPIC, "transfers.requests", RD_KAFKA_ACL_OPERATION_WRITE}});
    kafka.allow("User:nogroup", {G{RD_KAFKA_RESOURCE_TOPIC, "transfers.requests", RD_KAFKA_ACL_OPERATION_READ},
                                 G{RD_KAFKA_RESOURCE_TOPIC, "transfers.results", RD_KAFKA_ACL_OPERATION_WRITE},
                                 G{RD_KAFKA_RESOURCE_TOPIC, "transfers.dlq", RD_KAFKA_ACL_OPERATION_WRITE}});
    kafka.allow("User:noresults",
                {G{RD_KAFKA_RESOURCE_TOPIC, "transfers.requests", RD_KAFKA_ACL_OPERATION_READ},
                 G{RD_KAFKA_RESOURCE_TOPIC, "transfers.results", RD_KAFKA_ACL_OPERATION_DESCRIBE},
                 G{RD_KAFKA_RESOURCE_TOPIC, "transfers.dlq", RD_KAFKA_ACL_OPERATION_WRITE},
                 G{RD_KAFKA_RESOURCE_GROUP, "g2", RD_KAFKA_ACL_OPERATION_READ}});
  }

  void TearDown() override {
    if (HasFailure()) std::cout << cluster_.log_tails();
  }

  // The TLS and SASL settings every client passes as --kafka-opt.
  std::vector<std::string> tls_opts(const std::filesystem::path& ca) const {
    return {"--kafka-opt", "security.protocol=SASL_SSL", "--kafka-opt", "sasl.mechanisms=SCRAM-SHA-512",
            "--kafka-opt", "ssl.ca.location=" + ca.string()};
  }
  static std::vector<std::string> sasl_env(const std::string& user, const std::string& password) {
    return {"SAGA_KAFKA_SASL_USERNAME=" + user, "SAGA_KAFKA_SASL_PASSWORD=" + password};
  }

  // A worker run to its end (it is expected to give up).
  RunResult worker_run(const std::string& group, const std::vector<std::string>& env,
                       const std::filesystem::path& ca, double& seconds) {
    std::vector<std::string> argv = {bin("saga-worker").string(), "--brokers", cluster_.bootstrap(),
                                     "--group", group, "--store", cluster_.urls().front(),
                                     "--metrics-addr", "", "--broker-timeout", "30s", "--lease", "2s"};
    for (const std::string& o : tls_opts(ca)) argv.push_back(o);
    const auto started = std::chrono::steady_clock::now();
    RunResult r = run(argv, env, 90s);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return r;
  }

  void expect_no_password(const std::string& what, const std::string& output) {
    for (const std::string& p : passwords_) EXPECT_FALSE(contains(output, p)) << what << " printed a password";
  }

  const std::vector<std::string> passwords_ = {random_hex(24), random_hex(24), random_hex(24),
                                               random_hex(24), random_hex(24)};
  LedgerCluster cluster_{1, 10,
                         {.partitions = 2,
                          .brokers = 1,
                          .real_kafka = true,
                          .sasl_ssl = SaslSsl{{{"worker", passwords_[0]},
                                               {"producer", passwords_[1]},
                                               {"nogroup", passwords_[2]},
                                               {"noresults", passwords_[3]},
                                               {"nobody", passwords_[4]}}},
                          .backend = LedgerCluster::Backend::sqlite}};
};

// Two workers and two saga-producer runs (each pair: one configured by
// flags and environment, one by a config file), with only the ACLs they
// need, move transfers over SASL_SSL; a PLAINTEXT client gets nowhere.
TEST_F(KafkaSecurity, WorkersAndProducerWithLeastPrivilege) {
  const std::filesystem::path ca = cluster_.kafka().ca();
  Process a = cluster_.start_worker("wA", "", tls_opts(ca), sasl_env("worker", passwords_[0]));
  const std::filesystem::path config = cluster_.dir() / "worker-b.toml";
  {
    std::ofstream out(config);
    out << "brokers = \"" << cluster_.bootstrap() << "\"\ngroup = \"g\"\nstore = [\""
        << cluster_.urls().front() << "\"]\nworker-id = \"wB\"\nmetrics-addr = \"\"\nkafka-opt = ["
        << "\"security.protocol=SASL_SSL\", \"sasl.mechanisms=SCRAM-SHA-512\", \"ssl.ca.location="
        << ca.string() << "\", \"sasl.username=worker\", \"sasl.password=" << passwords_[0] << "\"]\n";
  }
  Process b = Process::start({bin("saga-worker").string(), "--config", config.string()},
                             cluster_.log_of("wB"), {}, /*die_with_parent=*/true);

  // Half the requests by flags and environment, half by a config file.
  const std::vector<PlannedTransfer> transfers = cluster_.plan(300, 51);
  const std::filesystem::path by_flags = cluster_.dir() / "by-flags.jsonl";
  const std::filesystem::path by_file = cluster_.dir() / "by-file.jsonl";
  {
    std::ofstream flags(by_flags), file(by_file);
    for (std::size_t i = 0; i < transfers.size(); ++i) {
      (i % 2 ? file : flags) << LedgerCluster::request(transfers[i]) << '\n';
    }
  }
  std::vector<std::string> producer = {bin("saga-producer").string(), "--brokers", cluster_.bootstrap(),
                                       "--file", by_flags.string()};
  for (const std::string& o : tls_opts(ca)) producer.push_back(o);
  const RunResult sent = run(producer, sasl_env("producer", passwords_[1]), 120s);
  ASSERT_EQ(sent.exit_code, 0) << sent.output;
  expect_no_password("saga-producer", sent.output);
  const std::filesystem::path producer_config = cluster_.dir() / "producer.toml";
  {
    std::ofstream out(producer_config);
    out << "brokers = \"" << cluster_.bootstrap() << "\"\nfile = \"" << by_file.string()
        << "\"\nkafka-opt = [\"security.protocol=SASL_SSL\", \"sasl.mechanisms=SCRAM-SHA-512\", "
        << "\"ssl.ca.location=" << ca.string() << "\", \"sasl.username=producer\", \"sasl.password="
        << passwords_[1] << "\"]\n";
  }
  const RunResult sent_by_file =
      run({bin("saga-producer").string(), "--config", producer_config.string()}, {}, 120s);
  ASSERT_EQ(sent_by_file.exit_code, 0) << sent_by_file.output;
  expect_no_password("saga-producer --config", sent_by_file.output);

  ASSERT_TRUE(cluster_.wait_finished(transfers.size(), 120s));
  EXPECT_EQ(a.stop(30s), 0);
  EXPECT_EQ(b.stop(30s), 0);
  cluster_.expect_outcomes(transfers);
  cluster_.expect_balances(transfers);
  cluster_.expect_audit_passes();
  expect_no_password("worker A", read_file(cluster_.log_of("wA")));
  expect_no_password("worker B", read_file(cluster_.log_of("wB")));

  // A client that does not speak TLS and SASL gets nowhere.
  const RunResult plain = run({bin("saga-producer").string(), "--brokers", cluster_.bootstrap(), "--generate",
                               "1", "--accounts", "2", "--delivery-timeout", "3s"},
                              {}, 60s);
  EXPECT_EQ(plain.exit_code, 3) << plain.output;
}

// Each refusal is one clear line and a non-zero exit; credentials and TLS
// problems are reported at once, not after the broker timeout.
TEST_F(KafkaSecurity, RefusalsSayWhyInOneLine) {
  const std::filesystem::path ca = cluster_.kafka().ca();
  double seconds = 0;

  const RunResult wrong = worker_run("g", sasl_env("worker", passwords_[0] + "x"), ca, seconds);
  EXPECT_EQ(wrong.exit_code, 3) << wrong.output;
  EXPECT_LT(seconds, 20) << "a refused password is final: no need to wait for --broker-timeout";
  EXPECT_TRUE(contains(last_line(wrong.output), "refused the connection: ") &&
              contains(last_line(wrong.output), "SASL authentication error"))
      << wrong.output;
  EXPECT_FALSE(contains(wrong.output, passwords_[0] + "x"));

  // A CA that did not sign the broker's certificate.
  const std::filesystem::path other = cluster_.dir() / "other-ca";
  const RunResult made = run({"/usr/bin/openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                              "-subj", "/CN=another CA", "-keyout", other.string() + ".key", "-out",
                              other.string() + ".pem"});
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const RunResult untrusted =
      worker_run("g", sasl_env("worker", passwords_[0]), other.string() + ".pem", seconds);
  EXPECT_EQ(untrusted.exit_code, 3) << untrusted.output;
  EXPECT_LT(seconds, 20);
  EXPECT_TRUE(contains(last_line(untrusted.output), "certificate verify failed")) << untrusted.output;

  // No ACL at all: the topics are hidden from this principal.
  std::vector<std::string> env = sasl_env("nobody", passwords_[4]);
  std::vector<std::string> argv = {bin("saga-worker").string(), "--brokers", cluster_.bootstrap(), "--group",
                                   "g", "--store", cluster_.urls().front(), "--metrics-addr", "",
                                   "--broker-timeout", "3s"};
  for (const std::string& o : tls_opts(ca)) argv.push_back(o);
  const RunResult hidden = run(argv, env, 60s);
  EXPECT_EQ(hidden.exit_code, 3) << hidden.output;
  EXPECT_TRUE(contains(last_line(hidden.output),
                       "topic(s) transfers.requests, transfers.results, transfers.dlq not found"))
      << hidden.output;

  // Read on the topic but not on the group: the worker stops, saying which.
  const RunResult no_group = worker_run("g", sasl_env("nogroup", passwords_[2]), ca, seconds);
  EXPECT_EQ(no_group.exit_code, 1) << no_group.output;
  EXPECT_TRUE(contains(no_group.output, "needs Read on topic transfers.requests and on group g"))
      << no_group.output;

  // No Write on the outcomes' topic: the first outcome stops the worker;
  // the transfer stays in the store, and a worker allowed to publishes it.
  const std::vector<PlannedTransfer> one = cluster_.plan(1, 52);
  produce(cluster_.bootstrap(), "transfers.requests", {{one[0].from, LedgerCluster::request(one[0])}},
          cluster_.client_config());
  const RunResult no_results = worker_run("g2", sasl_env("noresults", passwords_[3]), ca, seconds);
  EXPECT_EQ(no_results.exit_code, 1) << no_results.output;
  EXPECT_TRUE(contains(no_results.output, "refused to let this principal write to transfers.results"))
      << no_results.output;
  Process fixer = cluster_.start_worker("fixer", "", tls_opts(ca), sasl_env("worker", passwords_[0]));
  EXPECT_TRUE(cluster_.wait_finished(1, 60s)) << read_file(cluster_.log_of("fixer"));
  EXPECT_EQ(fixer.stop(30s), 0);

  // saga-producer: a wrong password, and a principal without Write.
  std::vector<std::string> producer = {bin("saga-producer").string(), "--brokers", cluster_.bootstrap(),
                                       "--generate", "2", "--accounts", "2", "--delivery-timeout", "20s"};
  for (const std::string& o : tls_opts(ca)) producer.push_back(o);
  const RunResult producer_wrong = run(producer, sasl_env("producer", passwords_[1] + "x"), 60s);
  EXPECT_EQ(producer_wrong.exit_code, 3) << producer_wrong.output;
  EXPECT_TRUE(contains(last_line(producer_wrong.output), "SASL authentication error")) << producer_wrong.output;
  const RunResult producer_no_write = run(producer, sasl_env("worker", passwords_[0]), 60s);
  EXPECT_EQ(producer_no_write.exit_code, 1) << producer_no_write.output;
  EXPECT_TRUE(contains(last_line(producer_no_write.output), "Topic authorization failed"))
      << producer_no_write.output;

  for (const RunResult* r : {&wrong, &untrusted, &hidden, &no_group, &no_results, &producer_wrong,
                             &producer_no_write}) {
    expect_no_password("a refused client", r->output);
  }
}

}  // namespace
}  // namespace sagapool::test
