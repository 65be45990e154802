#include "kafka_cluster.hpp"

#include <librdkafka/rdkafka.h>
#include <signal.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace sagapool::test {
namespace {

using namespace std::chrono_literals;

struct RkDeleter {
  void operator()(rd_kafka_t* rk) const { rd_kafka_destroy(rk); }
};
struct MetadataDeleter {
  void operator()(const rd_kafka_metadata_t* md) const { rd_kafka_metadata_destroy(md); }
};
using Rk = std::unique_ptr<rd_kafka_t, RkDeleter>;
using Metadata = std::unique_ptr<const rd_kafka_metadata_t, MetadataDeleter>;

Rk admin_client(const std::string& bootstrap, const KafkaConfig& config) {
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  char err[512];
  KafkaConfig props = {{"bootstrap.servers", bootstrap}, {"log_level", "0"}};
  props.insert(props.end(), config.begin(), config.end());
  for (const auto& [k, v] : props) {
    if (rd_kafka_conf_set(conf, k.c_str(), v.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK) {
      rd_kafka_conf_destroy(conf);
      throw std::runtime_error(err);
    }
  }
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  if (rk == nullptr) {
    rd_kafka_conf_destroy(conf);
    throw std::runtime_error(err);
  }
  return Rk(rk);
}

// The first error an admin call's result event carries ("" if none).
std::string admin_error(rd_kafka_event_t* ev) {
  if (ev == nullptr) return "no answer in 60 s";
  if (rd_kafka_event_error(ev)) return rd_kafka_event_error_string(ev);
  if (const rd_kafka_CreateTopics_result_t* res = rd_kafka_event_CreateTopics_result(ev)) {
    std::size_t n = 0;
    const rd_kafka_topic_result_t** results = rd_kafka_CreateTopics_result_topics(res, &n);
    for (std::size_t i = 0; i < n; ++i) {
      if (rd_kafka_topic_result_error(results[i])) return rd_kafka_topic_result_error_string(results[i]);
    }
  }
  if (const rd_kafka_CreateAcls_result_t* res = rd_kafka_event_CreateAcls_result(ev)) {
    std::size_t n = 0;
    const rd_kafka_acl_result_t** results = rd_kafka_CreateAcls_result_acls(res, &n);
    for (std::size_t i = 0; i < n; ++i) {
      if (const rd_kafka_error_t* e = rd_kafka_acl_result_error(results[i])) return rd_kafka_error_string(e);
    }
  }
  return "";
}

// Every topic's metadata, or null when no broker answered in time.
Metadata metadata(rd_kafka_t* rk) {
  const rd_kafka_metadata_t* md = nullptr;
  if (rd_kafka_metadata(rk, 1, nullptr, &md, 5000) != RD_KAFKA_RESP_ERR_NO_ERROR) return nullptr;
  return Metadata(md);
}

std::filesystem::path launcher() { return std::filesystem::path(SAGA_SOURCE_DIR) / "tools/kafka/kafka.sh"; }

}  // namespace

KafkaCluster::KafkaCluster(const TempDir& dir, int nodes, std::optional<SaslSsl> sasl_ssl)
    : dir_(dir / "kafka") {
  std::vector<std::string> argv = {"/bin/bash", launcher().string(), "configure", "--brokers",
                                   std::to_string(nodes), "--dir", dir_.string()};
  if (sasl_ssl) {
    std::filesystem::create_directories(dir_);
    const std::filesystem::path users = dir_ / "users";
    {
      std::ofstream out(users);
      for (const auto& [name, password] : sasl_ssl->users) out << name << ' ' << password << '\n';
    }
    argv.insert(argv.end(), {"--security", "sasl_ssl", "--users", users.string()});
  }
  const RunResult r = run(argv, {}, 300s);
  const std::size_t at = r.output.find("bootstrap: ");
  if (r.exit_code != 0 || at == std::string::npos) {
    throw std::runtime_error("tools/kafka/kafka.sh configure failed (exit " +
                             std::to_string(r.exit_code) + "):\n" + last_lines(r.output, 30));
  }
  bootstrap_ = r.output.substr(at + 11, r.output.find('\n', at) - at - 11);
  if (sasl_ssl) {
    std::istringstream props(read_file(dir_ / "admin.librdkafka"));
    for (std::string line; std::getline(props, line);) {
      const std::size_t eq = line.find('=');
      if (eq != std::string::npos) admin_config_.emplace_back(line.substr(0, eq), line.substr(eq + 1));
    }
  }
  nodes_.resize(static_cast<std::size_t>(nodes));
  for (int node = 1; node <= nodes; ++node) start_node(node);
  wait_live(nodes, 120s);
}

KafkaCluster::~KafkaCluster() { stop(); }

void KafkaCluster::start_node(int node) {
  nodes_.at(static_cast<std::size_t>(node - 1)) =
      Process::start({"/bin/bash", launcher().string(), "node", "--dir", dir_.string(), "--node",
                      std::to_string(node)},
                     dir_ / ("node-" + std::to_string(node) + ".log"), {}, /*die_with_parent=*/true);
}

void KafkaCluster::wait_live(int expected, std::chrono::milliseconds timeout) {
  if (eventually([&] { return live_brokers() == expected; }, timeout)) return;
  std::string logs;
  for (int node = 1; node <= nodes(); ++node) {
    logs += "--- node " + std::to_string(node) + "\n" + log_tail(node) + "\n";
  }
  throw std::runtime_error("Kafka: " + std::to_string(live_brokers()) + " of " +
                           std::to_string(expected) + " brokers live after " +
                           std::to_string(timeout.count()) + " ms\n" + logs);
}

int KafkaCluster::live_brokers() const {
  Rk rk = admin_client(bootstrap_, admin_config_);
  Metadata md = metadata(rk.get());
  return md ? md->broker_cnt : 0;
}

void KafkaCluster::kill(int node) {
  Process& p = nodes_.at(static_cast<std::size_t>(node - 1));
  p.signal(SIGKILL);
  (void)p.wait(30s);
}

void KafkaCluster::pause(int node) { nodes_.at(static_cast<std::size_t>(node - 1)).signal(SIGSTOP); }

void KafkaCluster::resume(int node) { nodes_.at(static_cast<std::size_t>(node - 1)).signal(SIGCONT); }

void KafkaCluster::terminate(int node) { (void)nodes_.at(static_cast<std::size_t>(node - 1)).stop(30s); }

void KafkaCluster::restart(int node) {
  start_node(node);
  wait_live(nodes(), 120s);
}

void KafkaCluster::stop() {
  for (Process& p : nodes_) p.signal(SIGCONT);  // a paused node cannot stop
  for (Process& p : nodes_) p.signal(SIGTERM);
  for (Process& p : nodes_) (void)p.stop(30s);
}

void KafkaCluster::start() {
  for (int node = 1; node <= nodes(); ++node) start_node(node);
  wait_live(nodes(), 120s);
}

void KafkaCluster::create_topic(const std::string& name, int partitions, int replication,
                                const std::vector<std::pair<std::string, std::string>>& configs) {
  Rk rk = admin_client(bootstrap_, admin_config_);
  char err[512];
  rd_kafka_NewTopic_t* topic = rd_kafka_NewTopic_new(name.c_str(), partitions, replication, err, sizeof err);
  if (topic == nullptr) throw std::runtime_error("create topic " + name + ": " + err);
  for (const auto& [k, v] : configs) rd_kafka_NewTopic_set_config(topic, k.c_str(), v.c_str());
  rd_kafka_queue_t* q = rd_kafka_queue_new(rk.get());
  rd_kafka_CreateTopics(rk.get(), &topic, 1, nullptr, q);
  rd_kafka_event_t* ev = rd_kafka_queue_poll(q, 60'000);
  const std::string error = admin_error(ev);
  if (ev != nullptr) rd_kafka_event_destroy(ev);
  rd_kafka_queue_destroy(q);
  rd_kafka_NewTopic_destroy(topic);
  if (!error.empty()) throw std::runtime_error("create topic " + name + ": " + error);
  const bool led = eventually(
      [&] {
        for (int p = 0; p < partitions; ++p) {
          if (leader_of(name, p) < 0) return false;
        }
        return true;
      },
      60s);
  if (!led) throw std::runtime_error("topic " + name + ": partitions without a leader after 60 s");
}

void KafkaCluster::allow(const std::string& principal, const std::vector<Grant>& grants) {
  Rk rk = admin_client(bootstrap_, admin_config_);
  std::vector<rd_kafka_AclBinding_t*> acls;
  char err[512];
  for (const Grant& g : grants) {
    rd_kafka_AclBinding_t* acl = rd_kafka_AclBinding_new(
        static_cast<rd_kafka_ResourceType_t>(g.resource_type), g.name.c_str(),
        RD_KAFKA_RESOURCE_PATTERN_LITERAL, principal.c_str(), "*",
        static_cast<rd_kafka_AclOperation_t>(g.operation), RD_KAFKA_ACL_PERMISSION_TYPE_ALLOW, err,
        sizeof err);
    if (acl == nullptr) throw std::runtime_error("ACL for " + principal + ": " + err);
    acls.push_back(acl);
  }
  rd_kafka_queue_t* q = rd_kafka_queue_new(rk.get());
  rd_kafka_CreateAcls(rk.get(), acls.data(), acls.size(), nullptr, q);
  rd_kafka_event_t* ev = rd_kafka_queue_poll(q, 60'000);
  const std::string error = admin_error(ev);
  if (ev != nullptr) rd_kafka_event_destroy(ev);
  rd_kafka_queue_destroy(q);
  rd_kafka_AclBinding_destroy_array(acls.data(), acls.size());
  if (!error.empty()) throw std::runtime_error("ACLs for " + principal + ": " + error);
}

int KafkaCluster::leader_of(const std::string& topic, int partition) const {
  Rk rk = admin_client(bootstrap_, admin_config_);
  Metadata md = metadata(rk.get());
  if (!md) return -1;
  for (int t = 0; t < md->topic_cnt; ++t) {
    const rd_kafka_metadata_topic_t& mt = md->topics[t];
    if (topic != mt.topic || mt.err) continue;
    for (int p = 0; p < mt.partition_cnt; ++p) {
      if (mt.partitions[p].id == partition && !mt.partitions[p].err) return mt.partitions[p].leader;
    }
  }
  return -1;
}

std::string KafkaCluster::log_tail(int node) const {
  return last_lines(read_file(dir_ / ("node-" + std::to_string(node) + ".log")), 20);
}

}  // namespace sagapool::test
