#pragma once
// A real Apache Kafka cluster for tests: 1 or 3 KRaft nodes (each broker and
// controller) on loopback ports, started through tools/kafka/kafka.sh, the
// launcher users run too. Each node is a child process of the test, so a
// test can SIGKILL, SIGSTOP and restart one; every node dies with the test
// process, even when it is killed.
#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "process.hpp"

namespace sagapool::test {

using KafkaConfig = std::vector<std::pair<std::string, std::string>>;

// SASL_SSL with SCRAM-SHA-512 over TLS (a CA and broker certificate the
// launcher makes with openssl) and ACLs enforced: `users` (name, password)
// exist besides the super user "admin", and may do nothing until granted.
struct SaslSsl {
  std::vector<std::pair<std::string, std::string>> users;
};

class KafkaCluster {
 public:
  // Formats and starts `nodes` nodes under `dir`, and waits until each is a
  // live broker in the cluster's metadata. Throws with the launcher's or a
  // node's log tail if that does not happen in time.
  KafkaCluster(const TempDir& dir, int nodes, std::optional<SaslSsl> sasl_ssl = std::nullopt);
  ~KafkaCluster();
  KafkaCluster(const KafkaCluster&) = delete;
  KafkaCluster& operator=(const KafkaCluster&) = delete;

  const std::string& bootstrap() const { return bootstrap_; }
  // librdkafka settings of the super user (SASL_SSL), or none (PLAINTEXT).
  const KafkaConfig& admin_config() const { return admin_config_; }
  // SASL_SSL: the CA that signed the brokers' certificate.
  std::filesystem::path ca() const { return dir_ / "tls/ca.pem"; }
  int nodes() const { return static_cast<int>(nodes_.size()); }

  // Node ids are 1..nodes().
  void kill(int node);       // SIGKILL
  void pause(int node);      // SIGSTOP
  void resume(int node);     // SIGCONT
  void terminate(int node);  // SIGTERM (a controlled shutdown), SIGKILL after a grace
  void restart(int node);    // after kill() or terminate(): starts it, waits until it is live
  void stop();               // every node: SIGTERM, then SIGKILL after a grace
  void start();              // every node again (after stop()), waits until all are live

  // Creates a topic (replication factor and topic configs as given) and
  // waits until every partition has a leader.
  void create_topic(const std::string& name, int partitions, int replication,
                    const std::vector<std::pair<std::string, std::string>>& configs = {});
  // SASL_SSL: allows `principal` ("User:NAME") each (resource type, name,
  // operation), e.g. {RD_KAFKA_RESOURCE_TOPIC, "transfers.requests",
  // RD_KAFKA_ACL_OPERATION_READ}.
  struct Grant {
    int resource_type;
    std::string name;
    int operation;
  };
  void allow(const std::string& principal, const std::vector<Grant>& grants);
  // The node that leads `topic`/`partition` now (-1: none).
  int leader_of(const std::string& topic, int partition) const;
  // How many brokers the metadata lists as live.
  int live_brokers() const;
  // The last lines of a node's log, for failure messages.
  std::string log_tail(int node) const;

 private:
  void start_node(int node);
  void wait_live(int expected, std::chrono::milliseconds timeout);

  std::filesystem::path dir_;
  std::string bootstrap_;
  KafkaConfig admin_config_;
  std::vector<Process> nodes_;
};

}  // namespace sagapool::test
