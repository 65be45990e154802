// saga-worker: flags, start-up checks, signals, metrics; the work itself is
// in worker.cpp.
#include <prometheus/exposer.h>
#include <prometheus/registry.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdlib>
#include <iostream>

#include "probe.hpp"
#include "sagapool/config.hpp"
#include "sagapool/log.hpp"
#include "worker.hpp"

namespace {

std::atomic<bool> g_stop{false};

void on_signal(int) { g_stop.store(true); }

std::string default_worker_id() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "worker");
  return std::string(host) + ":" + std::to_string(getpid());
}

// Kafka SASL credentials come from the environment only, never from flags
// that would show in a process listing.
void add_sasl_from_env(std::vector<sagapool::KeyValue>& opts) {
  if (const char* user = std::getenv("SAGA_KAFKA_SASL_USERNAME")) opts.push_back({"sasl.username", user});
  if (const char* pass = std::getenv("SAGA_KAFKA_SASL_PASSWORD")) opts.push_back({"sasl.password", pass});
}

// Fails fast with one clear line when no broker answers at start-up.
sagapool::Status check_brokers(const std::string& brokers, const std::vector<sagapool::KeyValue>& extra,
                               std::chrono::milliseconds timeout) {
  using namespace sagapool;
  std::vector<KeyValue> opts = {{"bootstrap.servers", brokers}, {"log_level", "0"}};
  opts.insert(opts.end(), extra.begin(), extra.end());
  ConfPtr conf;
  if (Status s = make_conf(opts, conf); !s) return s;
  char err[512];
  KafkaHandle rk(rd_kafka_new(RD_KAFKA_PRODUCER, conf.get(), err, sizeof err));
  if (!rk) return Status::fatal(std::string("cannot create Kafka client: ") + err);
  (void)conf.release();
  const struct rd_kafka_metadata* md = nullptr;
  const rd_kafka_resp_err_t e =
      rd_kafka_metadata(rk.get(), 0, nullptr, &md, static_cast<int>(timeout.count()));
  if (e) {
    return Status::fatal("no Kafka broker answered at " + brokers + " within " +
                         std::to_string(timeout.count() / 1000) + "s: " + rd_kafka_err2str(e));
  }
  rd_kafka_metadata_destroy(md);
  return Status::ok();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace sagapool;
  CLI::App app{"saga-worker: consumes transfer requests and runs each as a saga on the ledger"};
  WorkerOptions o;
  std::vector<std::string> stores;
  std::vector<std::string> kafka_opts;
  std::string lease = "30s", recovery = "1s", drain = "20s", broker_timeout = "15s";
  std::string metrics_addr = "0.0.0.0:9464", log_format = "text";
  o.worker_id = default_worker_id();
  app.add_option("--brokers", o.brokers, "Kafka bootstrap servers (host:port,...)")->required();
  app.add_option("--group", o.group, "consumer group id shared by the worker pool")->required();
  app.add_option("--store", stores, "store URL: sqlite:PATH or postgresql://...; repeat to shard "
                                    "(the first holds transfers)")->required();
  app.add_option("--requests-topic", o.requests_topic, "topic of transfer requests")->capture_default_str();
  app.add_option("--results-topic", o.results_topic, "topic for outcomes")->capture_default_str();
  app.add_option("--dlq-topic", o.dlq_topic, "dead-letter topic")->capture_default_str();
  app.add_option("--worker-id", o.worker_id, "owner tag written on claimed transfers (default host:pid)");
  app.add_option("--lease", lease, "how long a claim lasts before another worker may recover it")->capture_default_str();
  app.add_option("--batch-size", o.batch_size, "requests per batch (1..10000)")
      ->check(CLI::Range(1, 10000))->capture_default_str();
  app.add_option("--recovery-interval", recovery, "how often to look for expired leases")->capture_default_str();
  app.add_option("--drain-timeout", drain, "SIGTERM: deadline to publish and leave the group")->capture_default_str();
  app.add_option("--broker-timeout", broker_timeout, "start-up: how long to wait for a broker")->capture_default_str();
  app.add_option("--metrics-addr", metrics_addr, "host:port for /metrics; empty disables")->capture_default_str();
  app.add_option("--log-format", log_format, "text or json")->check(CLI::IsMember({"text", "json"}))->capture_default_str();
  app.add_option("--kafka-opt", kafka_opts, "extra librdkafka property key=value (repeatable); "
                                            "SASL credentials: SAGA_KAFKA_SASL_USERNAME/PASSWORD");
  finish_cli(app);
  if (auto code = parse_cli(app, argc, argv)) return *code;

  auto bad = [](const std::string& msg) {
    std::cerr << "saga-worker: " << msg << "\n";
    return 2;
  };
  const auto lease_ms = parse_duration_ms(lease);
  const auto recovery_ms = parse_duration_ms(recovery);
  const auto drain_ms = parse_duration_ms(drain);
  const auto broker_ms = parse_duration_ms(broker_timeout);
  if (!lease_ms || *lease_ms < 1000) return bad("--lease: expected a duration of at least 1s, like 30s");
  if (!recovery_ms || *recovery_ms < 10) return bad("--recovery-interval: expected a duration like 1s");
  if (!drain_ms) return bad("--drain-timeout: expected a duration like 20s");
  if (!broker_ms) return bad("--broker-timeout: expected a duration like 15s");
  o.lease_ms = *lease_ms;
  o.recovery_interval = std::chrono::milliseconds(*recovery_ms);
  o.drain_timeout = std::chrono::milliseconds(*drain_ms);
  std::string kv_error;
  auto kvs = parse_key_values(kafka_opts, kv_error);
  if (!kvs) return bad("--kafka-opt: " + kv_error);
  o.kafka_opts = std::move(*kvs);
  add_sasl_from_env(o.kafka_opts);

  init_logging("saga-worker", *parse_log_format(log_format));

  std::unique_ptr<Ledger> ledger;
  if (Status s = Ledger::open(stores, ledger); !s) return bad(s.message());
  if (Status s = ledger->verify_topology(); !s) return bad(s.message());

  if (Status s = check_brokers(o.brokers, o.kafka_opts, std::chrono::milliseconds(*broker_ms)); !s) {
    std::cerr << "saga-worker: " << s.message() << "\n";
    return 3;
  }

  auto registry = std::make_shared<prometheus::Registry>();
  WorkerProbe probe(*registry);
  std::unique_ptr<prometheus::Exposer> exposer;
  if (!metrics_addr.empty()) {
    try {
      exposer = std::make_unique<prometheus::Exposer>(metrics_addr);
      exposer->RegisterCollectable(registry);
    } catch (const std::exception& e) {
      return bad("--metrics-addr " + metrics_addr + ": cannot listen: " + e.what());
    }
  }

  std::unique_ptr<Worker> worker;
  if (Status s = Worker::create(o, *ledger, probe, worker); !s) return bad(s.message());

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);

  spdlog::info("worker {} started: group {}, {} store(s), batch {}, lease {}ms", o.worker_id, o.group,
               stores.size(), o.batch_size, o.lease_ms);
  Status s = worker->run(g_stop);
  worker.reset();
  if (!s) {
    spdlog::error("stopping on a fatal error: {}", s.message());
    spdlog::shutdown();
    return 1;
  }
  spdlog::shutdown();
  return 0;
}
