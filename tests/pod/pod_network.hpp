#pragma once
// A pod's network as the test gives it one: a network namespace of its own
// (held by a small child process, as Kubernetes' pause container holds a
// pod's), with loopback only, so each pod has its own port 9464 and nothing
// a pod listens on is reachable from outside. The cluster's services (the
// test's Kafka node and PostgreSQL, which listen on the machine's loopback)
// appear inside the pod at the same 127.0.0.1 ports through a forwarder:
// the test's stand-in for the cluster network. Probes connect from inside
// the namespace, as the kubelet connects to the pod's address.
#include <sys/types.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace sagapool::test {

class PodNetwork {
 public:
  // A new namespace with loopback up, and forwarders from 127.0.0.1:PORT
  // inside it to 127.0.0.1:PORT outside, for each of `forwarded_ports`.
  explicit PodNetwork(const std::vector<int>& forwarded_ports);
  ~PodNetwork();
  PodNetwork(const PodNetwork&) = delete;
  PodNetwork& operator=(const PodNetwork&) = delete;

  // For `podman run --network ns:PATH`.
  std::string path() const;
  // A TCP socket in the pod's namespace (-1 on failure).
  int socket_inside() const;

 private:
  struct Connection;
  void accept_loop(int listener);
  void pump(std::shared_ptr<Connection> c, bool inbound);

  pid_t holder_ = -1;
  std::atomic<bool> stopping_{false};
  std::vector<int> listeners_;
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::vector<std::shared_ptr<Connection>> connections_;
  std::vector<std::thread> pumps_;
};

// HTTP GET http://127.0.0.1:PORT/PATH inside the pod's network, as a
// kubelet httpGet probe: the status (0: no answer within `timeout_s`).
int probe_http(const PodNetwork& network, int port, const std::string& path, int timeout_s);

}  // namespace sagapool::test
