#pragma once
// One pod of a rendered pod template, run with podman the way a kubelet runs
// it: the rendered image, command, args, environment (Secret and ConfigMap
// references resolved by Cluster), volumes (ConfigMap files, emptyDir as a
// size-limited tmpfs), securityContext (user, group, fsGroup, read-only root
// filesystem, capabilities, no privilege escalation, RuntimeDefault seccomp)
// and resource limits; its own network namespace (PodNetwork); the startup,
// liveness and readiness probes polled at their rendered periods and
// thresholds; and the kubelet's stop: SIGTERM, terminationGracePeriodSeconds,
// SIGKILL. What this cannot model is refused with an exception, not ignored.
#include <yaml-cpp/yaml.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "chart.hpp"
#include "pod_network.hpp"
#include "process.hpp"

namespace sagapool::test {

// podman on the build folder's image storage (tools/image/podman.sh).
struct Podman {
  std::filesystem::path script;     // tools/image/podman.sh
  std::filesystem::path image_dir;  // its SAGA_IMAGE_DIR
  std::string run_label;            // set on every container this test run starts
  std::vector<std::string> argv(const std::vector<std::string>& args) const;
  std::vector<std::string> env() const { return {"SAGA_IMAGE_DIR=" + image_dir.string()}; }
  RunResult operator()(const std::vector<std::string>& args,
                       std::chrono::milliseconds timeout = std::chrono::seconds(120)) const;
};

// What the prober saw, kubelet-style.
struct ProbeState {
  bool started = false;         // the startup probe succeeded
  bool startup_failed = false;  // it failed failureThreshold times first
  bool ready = false;
  int readiness_failures = 0;  // consecutive
  int liveness_failures = 0;   // consecutive
  int liveness_failures_max = 0;
  int liveness_threshold = 0;
};

class Pod {
 public:
  // Starts the first container of `pod_spec` (spec.template.spec of a
  // Deployment or Job) as pod `name`. `forwarded_ports`: the services the
  // pod reaches on 127.0.0.1 (PodNetwork).
  Pod(const Podman& podman, const Cluster& cluster, const std::string& name, const YAML::Node& pod_spec,
      const std::vector<int>& forwarded_ports, const std::filesystem::path& dir);
  ~Pod();
  Pod(const Pod&) = delete;
  Pod& operator=(const Pod&) = delete;

  const std::string& name() const { return name_; }
  const std::string& container() const { return container_; }
  ProbeState probes() const;
  bool running() const;
  // The container's first process as the machine sees it (-1: none).
  int host_pid() const;
  std::optional<int> exit_code() const;  // once it has exited
  // Waits for the container to exit; its exit code, nullopt on timeout.
  std::optional<int> wait(std::chrono::milliseconds timeout) const;
  // Sends `signal`; probing ends, as it does for a container the kubelet
  // kills.
  void kill(const std::string& signal);
  // The kubelet's stop: SIGTERM, up to terminationGracePeriodSeconds, then
  // SIGKILL. The exit code and how long the container took to exit.
  struct Stopped {
    int exit_code = -1;
    bool killed = false;  // the grace period ran out
    std::chrono::milliseconds took{0};
  };
  Stopped stop();
  int grace_seconds() const { return grace_s_; }
  std::string logs() const;
  // `kubectl exec POD -- ARGS`, with `stdin_file` as standard input if set.
  RunResult exec(const std::vector<std::string>& args,
                 const std::optional<std::filesystem::path>& stdin_file = std::nullopt) const;

 private:
  struct Probe {
    std::string path;
    int port = 0;
    int period_s = 10, timeout_s = 1, failure_threshold = 3, success_threshold = 1, initial_delay_s = 0;
  };
  static std::optional<Probe> read_probe(const YAML::Node& container, const char* key);
  void probe_loop();
  void end_probes();

  const Podman& podman_;
  std::string name_;
  std::string container_;
  std::filesystem::path dir_;
  std::unique_ptr<PodNetwork> network_;
  int grace_s_ = 30;
  std::optional<Probe> startup_, liveness_, readiness_;
  mutable std::mutex mutex_;
  ProbeState state_;
  std::atomic<bool> stop_probing_{false};
  std::thread prober_;
};

// Runs the rendered Job's pod as the Job controller does: a new pod after
// each failure, up to backoffLimit retries, within activeDeadlineSeconds.
struct JobResult {
  bool succeeded = false;
  int pods = 0;
  std::string logs;  // of every pod
};
JobResult run_job(const Podman& podman, const Cluster& cluster, const YAML::Node& job,
                  const std::vector<int>& forwarded_ports, const std::filesystem::path& dir);

}  // namespace sagapool::test
