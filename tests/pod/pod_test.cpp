// The image and the Helm chart's pods, run for real: the chart rendered by
// `helm template` with values pointing at a real Kafka node and a throwaway
// PostgreSQL, its migration Job and two replicas of its worker Deployment
// started from the image ./dev image built, each exactly as rendered (pod.hpp
// says what is mapped and how). The bank runs through them while one pod is
// SIGKILLed and replaced and another is stopped the kubelet's way; every id
// gets one outcome, the balances are what the outcomes say, the audit passes,
// and the consumer group's committed offsets reach the end of every
// partition.
#include <gtest/gtest.h>
#include <librdkafka/rdkafka.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "chart.hpp"
#include "kafka_client.hpp"
#include "kafka_cluster.hpp"
#include "pg_server.hpp"
#include "pod.hpp"
#include "process.hpp"
#include "sagapool/audit.hpp"
#include "sagapool/kafka.hpp"
#include "sagapool/ledger.hpp"

namespace sagapool::test {
namespace {

using namespace std::chrono_literals;

constexpr int kPartitions = 6;
constexpr int kAccounts = 40;
constexpr std::int64_t kOpening = 100'000'000;
constexpr int kTransfers = 4000;
constexpr int kRate = 100;  // per second: the run lasts ~40 s, long enough to kill and stop pods in it

Podman project_podman() {
  return {source_dir() / "tools/image/podman.sh", SAGA_IMAGE_DIR, "pod-" + random_hex(8)};
}

// The image the chart points at by default, and what ./dev image tags.
std::string chart_image() {
  const std::string chart = read_file(source_dir() / "helm/sagapool/Chart.yaml");
  return "sagapool:" + YAML::Load(chart)["appVersion"].as<std::string>();
}

// Fails (never skips) when the image is not there.
void expect_image(const Podman& podman, const std::string& image) {
  const RunResult r = podman({"image", "exists", image});
  ASSERT_EQ(r.exit_code, 0) << "no image " << image << " in " << SAGA_IMAGE_DIR
                            << ": build it with ./dev image (./dev test does)\n"
                            << r.output;
}

std::string label(const Podman& podman, const std::string& image, const std::string& key) {
  const RunResult r = podman({"image", "inspect", "--format", "{{index .Labels \"" + key + "\"}}", image});
  return r.output.substr(0, r.output.find('\n'));
}

// The image itself: what a platform team checks before deploying it.
TEST(PodImage, LabelsUserAndLibraries) {
  const Podman podman = project_podman();
  const std::string image = chart_image();
  ASSERT_NO_FATAL_FAILURE(expect_image(podman, image));
  EXPECT_EQ(label(podman, image, "org.opencontainers.image.version"), SAGA_VERSION);
  const std::string revision = label(podman, image, "org.opencontainers.image.revision");
  EXPECT_TRUE(std::regex_match(revision, std::regex("[0-9a-f]{40}(-dirty)?")))
      << "revision label: '" << revision << "' (a commit id, -dirty when built from changed files)";
  EXPECT_FALSE(label(podman, image, "org.opencontainers.image.source").empty());

  const RunResult user = podman({"image", "inspect", "--format", "{{.Config.User}}", image});
  EXPECT_EQ(user.output, "10001:10001\n") << "numeric, non-root, so runAsNonRoot can be checked";

  // ld.so --list is what ldd runs; the dynamic loader is there in any base.
  for (const char* program : {"saga-worker", "saga-producer", "sagactl"}) {
    const RunResult r = podman({"run", "--rm", "--pull=never", "--network=none", "--entrypoint",
                                "/lib64/ld-linux-x86-64.so.2", image, "--list",
                                std::string("/usr/local/bin/") + program});
    EXPECT_EQ(r.exit_code, 0) << program << ":\n" << r.output;
    EXPECT_EQ(r.output.find("not found"), std::string::npos) << program << ":\n" << r.output;
    EXPECT_NE(r.output.find("libstdc++.so.6 => "), std::string::npos) << program << ":\n" << r.output;
  }
}

// A string setting of the worker's TOML config file (the chart writes them
// JSON-quoted, which TOML reads the same).
std::string toml_string(const std::string& toml, const std::string& key) {
  const std::string prefix = key + " = ";
  for (std::size_t at = 0; at < toml.size();) {
    const std::size_t end = std::min(toml.find('\n', at), toml.size());
    const std::string line = toml.substr(at, end - at);
    if (line.starts_with(prefix)) return nlohmann::json::parse(line.substr(prefix.size())).get<std::string>();
    at = end + 1;
  }
  throw std::runtime_error("no " + key + " in the worker's config file");
}

// Committed offsets of `group` on every partition of `topic`, and the
// partitions' high watermarks.
struct GroupOffsets {
  std::vector<std::int64_t> committed;
  std::vector<std::int64_t> end;
};
GroupOffsets group_offsets(const std::string& brokers, const std::string& group, const std::string& topic) {
  ConfPtr conf;
  const Status s = make_conf({{"bootstrap.servers", brokers}, {"group.id", group}, {"enable.auto.commit", "false"}}, conf);
  if (!s) throw std::runtime_error(s.message());
  char err[512];
  KafkaHandle rk(rd_kafka_new(RD_KAFKA_CONSUMER, conf.release(), err, sizeof err));
  if (!rk) throw std::runtime_error(err);
  TopicPartitionListPtr list(rd_kafka_topic_partition_list_new(kPartitions));
  for (int p = 0; p < kPartitions; ++p) rd_kafka_topic_partition_list_add(list.get(), topic.c_str(), p);
  // Only asks the coordinator: this consumer never joins the group.
  if (rd_kafka_committed(rk.get(), list.get(), 10'000) != RD_KAFKA_RESP_ERR_NO_ERROR) {
    throw std::runtime_error("cannot read the committed offsets of " + group);
  }
  GroupOffsets out;
  for (int p = 0; p < kPartitions; ++p) {
    out.committed.push_back(list->elems[p].offset);
    std::int64_t low = 0, high = 0;
    rd_kafka_query_watermark_offsets(rk.get(), topic.c_str(), p, &low, &high, 10'000);
    out.end.push_back(high);
  }
  return out;
}

class ChartPods : public ::testing::Test {
 protected:
  void SetUp() override {
    podman_ = project_podman();
    ASSERT_NO_FATAL_FAILURE(expect_image(podman_, chart_image()));
    // Containers an earlier run left when it was killed, then a janitor that
    // removes this run's containers if the test process dies the same way.
    podman_({"rm", "--force", "--time", "0", "--filter", "label=io.sagapool.test-run"});
    std::vector<std::string> janitor = {"/bin/bash", "-c",
                                        "trap '\"$@\" >/dev/null 2>&1; exit 0' TERM; while :; do sleep 1; done",
                                        "janitor"};
    for (const auto& arg : podman_.argv({"rm", "--force", "--time", "0", "--filter",
                                         "label=io.sagapool.test-run=" + podman_.run_label})) {
      janitor.push_back(arg);
    }
    janitor_ = Process::start(janitor, dir_ / "janitor.log", {.env = podman_.env(), .death_signal = SIGTERM});

    kafka_ = std::make_unique<KafkaCluster>(dir_, 1);
    for (const std::string topic : {"transfers.requests", "transfers.results", "transfers.dlq"}) {
      kafka_->create_topic(topic, kPartitions, 1);
    }
    pg_ = std::make_unique<PgServer>();
    pg_->create_database("ledger");
    const int kafka_port = std::stoi(kafka_->bootstrap().substr(kafka_->bootstrap().rfind(':') + 1));
    ports_ = {kafka_port, pg_->port()};

    // Only what points the chart at this test's servers, plus a short lease
    // so that the SIGKILLed pod's transfers are recovered quickly.
    std::ofstream(dir_ / "values.yaml")
        << "kafka:\n"
        << "  brokers: \"127.0.0.1:" << kafka_port << "\"\n"
        << "  requestsPartitions: " << kPartitions << "\n"
        << "stores:\n"
        << "  - url: \"postgresql://" << pg_->user() << "@127.0.0.1:" << pg_->port() << "/ledger\"\n"
        << "    passwordSecret: {name: ledger-password, key: password}\n"
        << "worker:\n"
        << "  lease: 5s\n";
    cluster_ = Cluster::render(SAGA_HELM, source_dir() / "helm/sagapool", "pay", "payments", dir_ / "values.yaml");
    // The Secret the operator created beside the release.
    YAML::Node secret;
    secret["apiVersion"] = "v1";
    secret["kind"] = "Secret";
    secret["metadata"]["name"] = "ledger-password";
    secret["data"]["password"] = base64_encode(pg_->password());
    cluster_.add(secret);
  }

  void TearDown() override {
    if (HasFailure()) {
      for (const auto& pod : pods_) {
        std::cout << "--- logs of pod " << pod->name() << " (last 40 lines)\n" << last_lines(pod->logs(), 40);
      }
      std::cout << log_tails(dir_.path(), 20);
    }
    pods_.clear();
  }

  YAML::Node deployment() const {
    const auto names = cluster_.names("Deployment");
    if (names.size() != 1) throw std::runtime_error("the chart rendered " + std::to_string(names.size()) + " Deployments");
    return cluster_.get("Deployment", names[0]);
  }

  // A new pod of the Deployment, named as its ReplicaSet would name it.
  Pod& start_worker() {
    const YAML::Node d = deployment();
    pods_.push_back(std::make_unique<Pod>(podman_, cluster_, d["metadata"]["name"].as<std::string>() + "-" + random_hex(5),
                                          d["spec"]["template"]["spec"], ports_, dir_.path()));
    return *pods_.back();
  }

  // The worker's config file: the ConfigMap the Deployment mounts.
  std::string worker_config() const {
    for (const YAML::Node& v : deployment()["spec"]["template"]["spec"]["volumes"]) {
      if (v["configMap"]) return cluster_.config_map_value(v["configMap"]["name"].as<std::string>(), "worker.toml");
    }
    throw std::runtime_error("the Deployment mounts no ConfigMap");
  }

  // Started (startup probe), then ready (readiness probe), as the kubelet sees it.
  static void expect_ready(const Pod& pod, std::chrono::seconds timeout = 120s) {
    EXPECT_TRUE(eventually([&] { return pod.probes().ready || pod.probes().startup_failed; }, timeout));
    const ProbeState s = pod.probes();
    EXPECT_TRUE(s.started && !s.startup_failed) << pod.name() << ": the startup probe did not pass";
    EXPECT_TRUE(s.ready) << pod.name() << " did not become ready";
  }

  // The restricted securityContext as the kernel enforces it on the
  // worker's process: user and groups, no capabilities, no new privileges,
  // a seccomp filter, a read-only root and /tmp the only writable mount.
  void expect_restricted(const Pod& pod) const {
    const int pid = pod.host_pid();
    ASSERT_GT(pid, 0) << pod.name();
    const YAML::Node sc = deployment()["spec"]["template"]["spec"]["securityContext"];
    const std::string uid = sc["runAsUser"].as<std::string>(), gid = sc["runAsGroup"].as<std::string>();
    const std::string status = read_file("/proc/" + std::to_string(pid) + "/status");
    for (const std::string line : {"Uid:\t" + uid + "\t" + uid + "\t" + uid + "\t" + uid + "\n",
                                   "Gid:\t" + gid + "\t" + gid + "\t" + gid + "\t" + gid + "\n",
                                   "Groups:\t" + sc["fsGroup"].as<std::string>() + " \n",
                                   std::string("CapEff:\t0000000000000000\n"), std::string("CapBnd:\t0000000000000000\n"),
                                   std::string("NoNewPrivs:\t1\n"), std::string("Seccomp:\t2\n")}) {
      EXPECT_NE(status.find(line), std::string::npos) << pod.name() << ": no '" << line << "' in\n" << status;
    }
    // mountinfo: ID PARENT DEV ROOT MOUNTPOINT OPTIONS ...
    std::istringstream mounts(read_file("/proc/" + std::to_string(pid) + "/mountinfo"));
    std::vector<std::string> writable;
    bool root_read_only = false;
    for (std::string line; std::getline(mounts, line);) {
      std::istringstream fields(line);
      std::string id, parent, dev, root, point, options;
      fields >> id >> parent >> dev >> root >> point >> options;
      if (point == "/") root_read_only = options.starts_with("ro");
      if (options.starts_with("rw") && !point.starts_with("/proc") && !point.starts_with("/sys") &&
          !point.starts_with("/dev")) {
        writable.push_back(point);
      }
    }
    EXPECT_TRUE(root_read_only) << pod.name();
    EXPECT_EQ(writable, std::vector<std::string>{"/tmp"}) << pod.name() << ": writable mounts besides the kernel's";
  }

  static void expect_never_restarted(const Pod& pod) {
    const ProbeState s = pod.probes();
    EXPECT_FALSE(s.startup_failed) << pod.name();
    EXPECT_LT(s.liveness_failures_max, s.liveness_threshold)
        << pod.name() << ": the liveness probe failed often enough for the kubelet to restart it";
  }

  TempDir dir_{"sagapool-pod"};
  Podman podman_;
  Process janitor_;
  std::unique_ptr<KafkaCluster> kafka_;
  std::unique_ptr<PgServer> pg_;
  Cluster cluster_;
  std::vector<int> ports_;
  std::vector<std::unique_ptr<Pod>> pods_;
};

TEST_F(ChartPods, RunTheBankThroughKillsAndKubeletStops) {
  // The image the chart renders is the one ./dev image built.
  const YAML::Node workers = deployment();
  EXPECT_EQ(workers["spec"]["template"]["spec"]["containers"][0]["image"].as<std::string>(), chart_image());
  ASSERT_EQ(workers["spec"]["replicas"].as<int>(), 2);

  // 1. The schema, by the migration Job (a pre-install hook).
  const auto jobs = cluster_.names("Job");
  ASSERT_EQ(jobs.size(), 1U);
  const JobResult migration = run_job(podman_, cluster_, cluster_.get("Job", jobs[0]), ports_, dir_.path());
  ASSERT_TRUE(migration.succeeded) << migration.logs;
  EXPECT_EQ(migration.pods, 1) << migration.logs;

  // 2. Two replicas; each becomes ready, and runs saga-worker alone, as
  // PID 1, with no password on its command line.
  Pod& a = start_worker();
  Pod& b = start_worker();
  expect_ready(a);
  expect_ready(b);
  ASSERT_FALSE(HasFailure());
  for (const Pod* pod : {&a, &b}) {
    const RunResult top = podman_({"top", pod->container(), "pid", "args"});
    EXPECT_EQ(top.exit_code, 0) << top.output;
    EXPECT_NE(top.output.find("\n1 "), std::string::npos) << top.output;
    EXPECT_NE(top.output.find("saga-worker --config /etc/sagapool/worker.toml"), std::string::npos) << top.output;
    EXPECT_EQ(std::count(top.output.begin(), top.output.end(), '\n'), 2) << "one process only:\n" << top.output;
    EXPECT_EQ(top.output.find(pg_->password()), std::string::npos) << "a password on a command line";
    expect_restricted(*pod);
  }

  // 3. The store stopped: readiness fails on both (the Service stops
  // routing to them) while liveness holds (no restarts); back when it is.
  pg_->stop();
  for (const Pod* pod : {&a, &b}) {
    EXPECT_TRUE(eventually([&] { return !pod->probes().ready; }, 60s)) << pod->name() << " stayed ready without its store";
  }
  pg_->start();
  expect_ready(a, 60s);
  expect_ready(b, 60s);
  ASSERT_FALSE(HasFailure());

  // 4. Accounts, with sagactl in a worker's container (`kubectl exec`):
  // it finds the store in the pod's SAGA_STORE.
  {
    std::ofstream csv(dir_ / "accounts.csv");
    csv << "id,balance\n";
    for (int i = 0; i < kAccounts; ++i) csv << "acct-" << i << "," << kOpening << "\n";
  }
  const RunResult imported = a.exec({"sagactl", "accounts", "import", "/dev/stdin"}, dir_ / "accounts.csv");
  ASSERT_EQ(imported.exit_code, 0) << imported.output;

  // 5. Upstream: saga-producer from the image, in a pod of its own with the
  // Job's restricted pod spec.
  YAML::Node producer_spec = YAML::Clone(cluster_.get("Job", jobs[0])["spec"]["template"]["spec"]);
  YAML::Node pc = producer_spec["containers"][0];
  pc["command"] = std::vector<std::string>{"saga-producer"};
  pc["args"] = std::vector<std::string>{
      "--brokers", kafka_->bootstrap(), "--generate", std::to_string(kTransfers), "--accounts",
      std::to_string(kAccounts), "--rate", std::to_string(kRate), "--seed", "7", "--id-prefix", "pod",
      "--invalid-ratio", "0", "--overdraw-ratio", "0.02", "--unknown-ratio", "0.02"};
  pc.remove("env");
  Pod producer(podman_, cluster_, "upstream-producer", producer_spec, {ports_[0]}, dir_.path());

  // 6. A third of the way in, a pod is SIGKILLed (a node dies); the
  // Deployment replaces it.
  std::this_thread::sleep_for(std::chrono::seconds(kTransfers / kRate / 3));
  b.kill("KILL");
  EXPECT_EQ(b.wait(30s), 137);
  Pod& c = start_worker();
  expect_ready(c);

  // 7. Two thirds in, another is stopped the kubelet's way (a rolling
  // update or a node drain): it drains and exits 0 within its grace period.
  std::this_thread::sleep_for(std::chrono::seconds(kTransfers / kRate / 3));
  EXPECT_TRUE(producer.running()) << "the producer finished before the stop: the stop drained nothing";
  const Pod::Stopped stopped = a.stop();
  std::cout << a.name() << " stopped in " << stopped.took.count() << " ms (grace " << a.grace_seconds() << " s)\n";
  EXPECT_EQ(stopped.exit_code, 0) << last_lines(a.logs(), 30);
  EXPECT_FALSE(stopped.killed) << "SIGKILLed at the end of the grace period";
  Pod& d = start_worker();
  expect_ready(d);

  ASSERT_EQ(producer.wait(180s), 0) << producer.logs();

  // 8. Every id has one outcome.
  std::map<std::string, std::set<std::string>> outcomes;
  std::map<std::string, nlohmann::json> first;
  for (const Record& r : consume(kafka_->bootstrap(), "transfers.results", kTransfers, 240s)) {
    const auto j = nlohmann::json::parse(r.value);
    const std::string id = j.at("id").get<std::string>();
    outcomes[id].insert(j.at("state").get<std::string>() + "/" + (j.at("reason").is_null() ? "" : j.at("reason").get<std::string>()));
    first.emplace(id, j);
  }
  EXPECT_EQ(outcomes.size(), static_cast<std::size_t>(kTransfers));
  std::size_t done = 0, conflicting = 0;
  for (const auto& [id, states] : outcomes) {
    EXPECT_TRUE(id.starts_with("pod-7-")) << id;
    if (states.size() != 1) ++conflicting;
    if (states.begin()->starts_with("done/")) ++done;
  }
  EXPECT_EQ(conflicting, 0U) << "ids with different outcomes";
  std::cout << outcomes.size() << " ids, " << done << " done\n";

  // 9. The balances are what the done outcomes moved, and the audit passes
  // (sagactl audit in a pod, as the runbooks run it).
  std::unique_ptr<Ledger> ledger;
  ASSERT_TRUE(Ledger::open({pg_->url("ledger")}, ledger).is_ok());
  std::map<std::string, std::int64_t> expected;
  for (int i = 0; i < kAccounts; ++i) expected["acct-" + std::to_string(i)] = kOpening;
  for (const auto& [id, j] : first) {
    if (j.at("state") != "done") continue;
    expected[j.at("from").get<std::string>()] -= j.at("amount").get<std::int64_t>();
    expected[j.at("to").get<std::string>()] += j.at("amount").get<std::int64_t>();
  }
  std::map<std::string, std::int64_t> actual;
  ASSERT_TRUE(ledger->shard(0).scan_accounts([&](const Account& acc) { actual[acc.id] = acc.balance; }).is_ok());
  EXPECT_EQ(actual, expected);
  const RunResult audit = d.exec({"sagactl", "audit"});
  EXPECT_EQ(audit.exit_code, 0) << audit.output;

  // 10. Scaled to zero the kubelet's way, both at once: each exits 0 within
  // its grace period, and the group's offsets are committed to the end of
  // every partition (no lag left).
  Pod::Stopped stop_c, stop_d;
  std::thread stopping([&] { stop_c = c.stop(); });
  stop_d = d.stop();
  stopping.join();
  for (const auto& [pod, s] : {std::pair{&c, stop_c}, std::pair{&d, stop_d}}) {
    EXPECT_EQ(s.exit_code, 0) << pod->name() << ":\n" << last_lines(pod->logs(), 30);
    EXPECT_FALSE(s.killed) << pod->name();
    std::cout << pod->name() << " stopped in " << s.took.count() << " ms\n";
  }
  const GroupOffsets offsets = group_offsets(kafka_->bootstrap(), toml_string(worker_config(), "group"),
                                             toml_string(worker_config(), "requests-topic"));
  EXPECT_EQ(offsets.committed, offsets.end) << "committed offsets short of the partitions' ends: lag left";

  for (const Pod* pod : {&a, &b, &c, &d}) expect_never_restarted(*pod);
}

}  // namespace
}  // namespace sagapool::test
