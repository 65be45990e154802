#include "pod.hpp"

#include <sys/stat.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

namespace sagapool::test {

using namespace std::chrono_literals;

std::vector<std::string> Podman::argv(const std::vector<std::string>& args) const {
  std::vector<std::string> out = {script.string()};
  out.insert(out.end(), args.begin(), args.end());
  return out;
}

RunResult Podman::operator()(const std::vector<std::string>& args, std::chrono::milliseconds timeout) const {
  return run(argv(args), env(), timeout);
}

namespace {

// A field of the container's securityContext, else of the pod's.
YAML::Node security(const YAML::Node& pod_spec, const YAML::Node& container, const char* key) {
  if (container["securityContext"] && container["securityContext"][key]) return container["securityContext"][key];
  if (pod_spec["securityContext"] && pod_spec["securityContext"][key]) return pod_spec["securityContext"][key];
  return YAML::Node();
}

void write_file(const std::filesystem::path& p, const std::string& text, int mode) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
  ::chmod(p.c_str(), static_cast<mode_t>(mode));
}

// The files of a configMap or secret volume, written under `dir`.
void project_volume(const Cluster& cluster, const YAML::Node& volume, const std::filesystem::path& dir) {
  const bool is_secret = static_cast<bool>(volume["secret"]);
  const YAML::Node source = is_secret ? volume["secret"] : volume["configMap"];
  const std::string name = source[is_secret ? "secretName" : "name"].as<std::string>();
  const int mode = source["defaultMode"] ? source["defaultMode"].as<int>() : 0644;
  const auto value = [&](const std::string& key) {
    return is_secret ? cluster.secret_value(name, key) : cluster.config_map_value(name, key);
  };
  if (source["items"]) {
    for (const YAML::Node& item : source["items"]) {
      write_file(dir / item["path"].as<std::string>(), value(item["key"].as<std::string>()),
                 item["mode"] ? item["mode"].as<int>() : mode);
    }
    return;
  }
  const YAML::Node object = cluster.get(is_secret ? "Secret" : "ConfigMap", name);
  for (const char* field : {"data", "stringData"}) {
    for (const auto& kv : object[field]) {
      const std::string key = kv.first.as<std::string>();
      write_file(dir / key, value(key), mode);
    }
  }
}

}  // namespace

std::optional<Pod::Probe> Pod::read_probe(const YAML::Node& container, const char* key) {
  const YAML::Node p = container[key];
  if (!p) return std::nullopt;
  if (!p["httpGet"]) throw std::runtime_error(std::string(key) + ": only httpGet probes are modelled");
  Probe probe;
  probe.path = p["httpGet"]["path"] ? p["httpGet"]["path"].as<std::string>() : "/";
  const YAML::Node port = p["httpGet"]["port"];
  try {
    probe.port = port.as<int>();
  } catch (const YAML::Exception&) {  // a named port
    for (const YAML::Node& cp : container["ports"]) {
      if (cp["name"] && cp["name"].as<std::string>() == port.as<std::string>()) probe.port = cp["containerPort"].as<int>();
    }
  }
  if (probe.port == 0) throw std::runtime_error(std::string(key) + ": no port " + port.as<std::string>());
  const auto field = [&](const char* name, int& out) {
    if (p[name]) out = p[name].as<int>();
  };
  field("periodSeconds", probe.period_s);
  field("timeoutSeconds", probe.timeout_s);
  field("failureThreshold", probe.failure_threshold);
  field("successThreshold", probe.success_threshold);
  field("initialDelaySeconds", probe.initial_delay_s);
  return probe;
}

Pod::Pod(const Podman& podman, const Cluster& cluster, const std::string& name, const YAML::Node& pod_spec,
         const std::vector<int>& forwarded_ports, const std::filesystem::path& dir)
    : podman_(podman), name_(name), container_(podman.run_label + "-" + name), dir_(dir / name) {
  if (pod_spec["initContainers"] || pod_spec["containers"].size() != 1) {
    throw std::runtime_error("pod " + name + ": only pods of one container (no init containers) are modelled");
  }
  if (pod_spec["hostNetwork"] && pod_spec["hostNetwork"].as<bool>()) {
    throw std::runtime_error("pod " + name + ": hostNetwork is not modelled");
  }
  if (!pod_spec["automountServiceAccountToken"] || pod_spec["automountServiceAccountToken"].as<bool>()) {
    throw std::runtime_error("pod " + name + ": a mounted service-account token is not modelled");
  }
  const YAML::Node c = pod_spec["containers"][0];
  if (pod_spec["terminationGracePeriodSeconds"]) grace_s_ = pod_spec["terminationGracePeriodSeconds"].as<int>();
  startup_ = read_probe(c, "startupProbe");
  liveness_ = read_probe(c, "livenessProbe");
  readiness_ = read_probe(c, "readinessProbe");
  if (liveness_) state_.liveness_threshold = liveness_->failure_threshold;

  const std::string policy = c["imagePullPolicy"] ? c["imagePullPolicy"].as<std::string>() : "IfNotPresent";
  if (policy == "Always") throw std::runtime_error("pod " + name + ": imagePullPolicy Always needs a registry");

  std::vector<std::string> args = {"run", "--detach", "--name", container_, "--label", "io.sagapool.test-run=" + podman.run_label,
                                   "--hostname", name, "--pull=never"};
  network_ = std::make_unique<PodNetwork>(forwarded_ports);
  args.push_back("--network=ns:" + network_->path());

  // securityContext
  const YAML::Node user = security(pod_spec, c, "runAsUser");
  const YAML::Node group = security(pod_spec, c, "runAsGroup");
  const YAML::Node non_root = security(pod_spec, c, "runAsNonRoot");
  const std::string image = c["image"].as<std::string>();
  std::string uid = user ? user.as<std::string>() : "";
  if (uid.empty()) {  // the image's USER, which must then be numeric for runAsNonRoot
    const RunResult r = podman({"image", "inspect", "--format", "{{.Config.User}}", image});
    uid = r.output.substr(0, r.output.find_first_of(":\n"));
  }
  if (non_root && non_root.as<bool>() && (uid.empty() || uid == "0" || uid == "root")) {
    throw std::runtime_error("pod " + name + ": runAsNonRoot, but the user is '" + uid + "' (the kubelet refuses it)");
  }
  if (user || group) args.push_back("--user=" + uid + (group ? ":" + group.as<std::string>() : ""));
  const YAML::Node fs_group = pod_spec["securityContext"] ? pod_spec["securityContext"]["fsGroup"] : YAML::Node();
  if (fs_group) args.push_back("--group-add=" + fs_group.as<std::string>());
  const YAML::Node csc = c["securityContext"];
  if (csc && csc["readOnlyRootFilesystem"] && csc["readOnlyRootFilesystem"].as<bool>()) {
    // Only the pod's volumes are writable: none of podman's own tmpfs mounts.
    args.insert(args.end(), {"--read-only", "--read-only-tmpfs=false"});
  }
  if (!(csc && csc["allowPrivilegeEscalation"] && !csc["allowPrivilegeEscalation"].as<bool>())) {
    throw std::runtime_error("pod " + name + ": privilege escalation allowed; not modelled");
  }
  args.push_back("--security-opt=no-new-privileges");
  if (csc && csc["privileged"] && csc["privileged"].as<bool>()) args.push_back("--privileged");
  if (csc && csc["capabilities"]) {
    for (const YAML::Node& cap : csc["capabilities"]["drop"]) args.push_back("--cap-drop=" + cap.as<std::string>());
    for (const YAML::Node& cap : csc["capabilities"]["add"]) args.push_back("--cap-add=" + cap.as<std::string>());
  }
  const YAML::Node seccomp = security(pod_spec, c, "seccompProfile");
  const std::string seccomp_type = seccomp ? seccomp["type"].as<std::string>() : "Unconfined";
  if (seccomp_type == "Unconfined") {
    args.push_back("--security-opt=seccomp=unconfined");
  } else if (seccomp_type != "RuntimeDefault") {  // RuntimeDefault: podman's default profile
    throw std::runtime_error("pod " + name + ": seccompProfile " + seccomp_type + " is not modelled");
  }

  // resources: the limits are what the container runtime enforces.
  if (c["resources"] && c["resources"]["limits"]) {
    const YAML::Node limits = c["resources"]["limits"];
    if (limits["memory"]) args.push_back("--memory=" + std::to_string(quantity_bytes(limits["memory"].as<std::string>())));
    if (limits["cpu"]) args.push_back("--cpus=" + std::to_string(quantity_cpus(limits["cpu"].as<std::string>())));
  }

  // volumes
  std::map<std::string, YAML::Node> volumes;
  for (const YAML::Node& v : pod_spec["volumes"]) volumes[v["name"].as<std::string>()] = v;
  for (const YAML::Node& m : c["volumeMounts"]) {
    const std::string vname = m["name"].as<std::string>();
    const YAML::Node v = volumes.at(vname);
    const std::string target = m["mountPath"].as<std::string>();
    const bool read_only = m["readOnly"] && m["readOnly"].as<bool>();
    if (v["emptyDir"]) {
      if (m["subPath"]) throw std::runtime_error("pod " + name + ": subPath into an emptyDir is not modelled");
      // A size-limited tmpfs: the kubelet evicts a pod whose emptyDir outgrows
      // sizeLimit; here a write past it fails instead (ENOSPC).
      std::string opts = std::string(read_only ? "ro" : "rw") + ",nosuid,nodev";
      if (v["emptyDir"]["sizeLimit"]) {
        opts += ",size=" + std::to_string(quantity_bytes(v["emptyDir"]["sizeLimit"].as<std::string>()));
      }
      // The kubelet makes an emptyDir 0777 (with fsGroup: group-owned by it,
      // setgid); podman's tmpfs cannot take a group, so it stays root's.
      opts += fs_group ? ",mode=2777" : ",mode=0777";
      args.push_back("--tmpfs=" + target + ":" + opts);
    } else if (v["configMap"] || v["secret"]) {
      const std::filesystem::path files = dir_ / "volumes" / vname;
      project_volume(cluster, v, files);
      const std::filesystem::path source = m["subPath"] ? files / m["subPath"].as<std::string>() : files;
      // ConfigMap and Secret volumes are read-only whatever the mount says.
      args.push_back("--mount=type=bind,src=" + source.string() + ",dst=" + target + ",ro=true");
    } else {
      throw std::runtime_error("pod " + name + ": volume " + vname + " is of a kind not modelled");
    }
  }

  // environment: the values reach podman through its own environment
  // (`--env NAME`), never through a command line.
  std::vector<std::string> podman_env = podman.env();
  const auto env = cluster.environment(c, name);
  for (const auto& [k, v] : env) {
    args.push_back("--env=" + k);
    podman_env.push_back(k + "=" + v);
  }
  if (c["command"]) {
    nlohmann::json entrypoint = nlohmann::json::array();
    for (const YAML::Node& part : c["command"]) entrypoint.push_back(expand_references(part.as<std::string>(), env));
    args.push_back("--entrypoint=" + entrypoint.dump());
  }
  args.push_back(image);
  for (const YAML::Node& a : c["args"]) args.push_back(expand_references(a.as<std::string>(), env));

  std::filesystem::create_directories(dir_);
  const RunResult r = run(podman.argv(args), podman_env, 120s);
  if (r.exit_code != 0) throw std::runtime_error("podman run of pod " + name + " failed:\n" + r.output);
  prober_ = std::thread([this] { probe_loop(); });
}

Pod::~Pod() {
  end_probes();
  podman_({"rm", "--force", "--time", "0", container_});
}

ProbeState Pod::probes() const {
  std::lock_guard lock(mutex_);
  return state_;
}

void Pod::probe_loop() {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto first = [&](const std::optional<Probe>& p) { return start + std::chrono::seconds(p ? p->initial_delay_s : 0); };
  Clock::time_point next_startup = first(startup_), next_live = first(liveness_), next_ready = first(readiness_);
  int startup_failures = 0, ready_successes = 0;
  bool started = !startup_;
  {
    std::lock_guard lock(mutex_);
    state_.started = started;
  }
  const auto check = [&](const Probe& p) {
    const int status = probe_http(*network_, p.port, p.path, p.timeout_s);
    return status >= 200 && status < 400;  // the kubelet's rule
  };
  while (!stop_probing_) {
    const auto now = Clock::now();
    if (!started && now >= next_startup) {
      next_startup = now + std::chrono::seconds(startup_->period_s);
      if (check(*startup_)) {
        started = true;
        std::lock_guard lock(mutex_);
        state_.started = true;
      } else if (++startup_failures >= startup_->failure_threshold) {
        std::lock_guard lock(mutex_);
        state_.startup_failed = true;  // the kubelet would restart the container
      }
    }
    // Liveness and readiness start once the startup probe succeeded.
    if (started && liveness_ && now >= next_live) {
      next_live = now + std::chrono::seconds(liveness_->period_s);
      const bool ok = check(*liveness_);
      std::lock_guard lock(mutex_);
      state_.liveness_failures = ok ? 0 : state_.liveness_failures + 1;
      state_.liveness_failures_max = std::max(state_.liveness_failures_max, state_.liveness_failures);
    }
    if (started && readiness_ && now >= next_ready) {
      next_ready = now + std::chrono::seconds(readiness_->period_s);
      const bool ok = check(*readiness_);
      std::lock_guard lock(mutex_);
      if (ok) {
        state_.readiness_failures = 0;
        if (++ready_successes >= readiness_->success_threshold) state_.ready = true;
      } else {
        ready_successes = 0;
        if (++state_.readiness_failures >= readiness_->failure_threshold) state_.ready = false;
      }
    }
    std::this_thread::sleep_for(100ms);
  }
}

bool Pod::running() const {
  const RunResult r = podman_({"inspect", "--format", "{{.State.Running}}", container_});
  return r.exit_code == 0 && r.output.starts_with("true");
}

int Pod::host_pid() const {
  const RunResult r = podman_({"inspect", "--format", "{{.State.Pid}}", container_});
  return r.exit_code == 0 && !r.output.empty() && r.output[0] != '0' ? std::stoi(r.output) : -1;
}

std::optional<int> Pod::exit_code() const {
  const RunResult r = podman_({"inspect", "--format", "{{.State.Running}} {{.State.ExitCode}}", container_});
  if (r.exit_code != 0 || !r.output.starts_with("false ")) return std::nullopt;
  return std::stoi(r.output.substr(6));
}

std::optional<int> Pod::wait(std::chrono::milliseconds timeout) const {
  Process waiter = Process::start(podman_.argv({"wait", container_}), dir_ / "wait.log", podman_.env());
  if (!waiter.wait(timeout)) return std::nullopt;
  return exit_code();
}

void Pod::end_probes() {
  stop_probing_ = true;
  if (prober_.joinable()) prober_.join();
}

void Pod::kill(const std::string& signal) {
  end_probes();
  podman_({"kill", "--signal", signal, container_});
}

Pod::Stopped Pod::stop() {
  Stopped s;
  const auto start = std::chrono::steady_clock::now();
  kill("TERM");
  auto code = wait(std::chrono::seconds(grace_s_));
  if (!code) {
    s.killed = true;
    kill("KILL");
    code = wait(30s);
  }
  s.took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  s.exit_code = code.value_or(-1);
  return s;
}

std::string Pod::logs() const { return podman_({"logs", container_}).output; }

RunResult Pod::exec(const std::vector<std::string>& args, const std::optional<std::filesystem::path>& stdin_file) const {
  std::vector<std::string> cmd = {"exec"};
  if (stdin_file) cmd.push_back("--interactive");
  cmd.push_back(container_);
  cmd.insert(cmd.end(), args.begin(), args.end());
  if (!stdin_file) return podman_(cmd);
  std::vector<std::string> argv = {"/bin/bash", "-c", "f=$1; shift; exec \"$@\" <\"$f\"", "bash", stdin_file->string()};
  const auto p = podman_.argv(cmd);
  argv.insert(argv.end(), p.begin(), p.end());
  return run(argv, podman_.env());
}

JobResult run_job(const Podman& podman, const Cluster& cluster, const YAML::Node& job,
                  const std::vector<int>& forwarded_ports, const std::filesystem::path& dir) {
  const std::string name = job["metadata"]["name"].as<std::string>();
  const YAML::Node spec = job["spec"];
  const int backoff_limit = spec["backoffLimit"] ? spec["backoffLimit"].as<int>() : 6;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::seconds(spec["activeDeadlineSeconds"] ? spec["activeDeadlineSeconds"].as<int>() : 600);
  JobResult result;
  for (int attempt = 0; attempt <= backoff_limit && std::chrono::steady_clock::now() < deadline; ++attempt) {
    Pod pod(podman, cluster, name + "-" + std::to_string(attempt), spec["template"]["spec"], forwarded_ports, dir);
    ++result.pods;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    const auto code = pod.wait(left);
    result.logs += "--- pod " + pod.name() + "\n" + pod.logs();
    if (code && *code == 0) {
      result.succeeded = true;
      break;
    }
  }
  return result;
}

}  // namespace sagapool::test
