// saga-worker: flags, start-up checks, signals, metrics and health
// endpoints; the work itself is in worker.cpp.
#include <malloc.h>
#include <prometheus/registry.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "sagapool/config.hpp"
#include "sagapool/failpoints.hpp"
#include "sagapool/http_server.hpp"
#include "sagapool/kafka_io.hpp"
#include "sagapool/log.hpp"
#include "sagapool/probe.hpp"
#include "sagapool/store_collector.hpp"
#include "sagapool/worker.hpp"
#include "registration.hpp"

namespace {

std::atomic<bool> g_stop{false};

using SteadyClock = std::chrono::steady_clock;

// /livez fails when the worker's loop has not completed an iteration for
// this long (a batch retrying an unavailable store that long counts too).
constexpr auto kLivenessTimeout = std::chrono::seconds(60);

void on_signal(int) { g_stop.store(true); }

std::string default_worker_id() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "worker");
  return std::string(host) + ":" + std::to_string(getpid());
}

}  // namespace

int main(int argc, char** argv) {
  using namespace sagapool;
  // glibc gives each new thread that meets contention its own arena (up to 8
  // per core), and a freed block stays in its arena: librdkafka's threads
  // left 30-40 MiB of such slack per worker in 1,000,000-transfer demos
  // (peak RSS 179-206 MiB; with two arenas 150-168 MiB, at the same rate).
  // An operator's MALLOC_ARENA_MAX still wins.
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) mallopt(M_ARENA_MAX, 2);
  CLI::App app{"saga-worker: consumes transfer requests and runs each as a saga on the ledger"};
  WorkerOptions o;
  std::vector<std::string> stores;
  std::vector<std::string> kafka_opts;
  std::string lease = "30s", recovery = "1s", drain = "20s", broker_timeout = "15s";
  std::string imbalance_interval = "15s";
  std::string metrics_addr = "0.0.0.0:9464", log_format = "text";
  std::size_t store_lanes = 0;
  o.worker_id = default_worker_id();
  app.add_option("--brokers", o.brokers, "Kafka bootstrap servers (host:port,...)")->required();
  app.add_option("--group", o.group, "consumer group id shared by the worker pool")->required();
  app.add_option("--store", stores, "store URL: sqlite:PATH or postgresql://...; repeat to shard "
                                    "(the first holds transfers); SAGA_STORE takes several, one a line")
      ->required()
      ->delimiter('\n');
  app.add_option("--requests-topic", o.requests_topic, "topic of transfer requests")->capture_default_str();
  app.add_option("--results-topic", o.results_topic, "topic for outcomes")->capture_default_str();
  app.add_option("--dlq-topic", o.dlq_topic, "dead-letter topic")->capture_default_str();
  app.add_option("--worker-id", o.worker_id, "owner tag written on claimed transfers (default host:pid)");
  app.add_option("--lease", lease, "how long a claim lasts before another worker may recover it")->capture_default_str();
  CLI::Option* batch_size =
      app.add_option("--batch-size", o.batch_size,
                     "requests per batch (1..10000); default 10000 on one SQLite store, else 5000")
          ->check(CLI::Range(1, 10000));
  app.add_option("--store-lanes", store_lanes,
                 "transactions a batch runs in side by side, split by partition (1..8); "
                 "0: 2 on one PostgreSQL store, else 1")
      ->check(CLI::Range(0, 8))->capture_default_str();
  app.add_option("--recovery-interval", recovery, "how often to look for expired leases")->capture_default_str();
  app.add_option("--drain-timeout", drain, "SIGTERM: deadline to publish and leave the group")->capture_default_str();
  app.add_option("--broker-timeout", broker_timeout, "start-up: how long to wait for a broker")->capture_default_str();
  app.add_option("--metrics-addr", metrics_addr,
                 "host:port serving /metrics, /livez and /readyz; empty disables")->capture_default_str();
  app.add_option("--imbalance-interval", imbalance_interval,
                 "how often saga_ledger_imbalance may re-read every account (stretched on a "
                 "large ledger; see docs/metrics.md)")->capture_default_str();
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
  const auto imbalance_ms = parse_duration_ms(imbalance_interval);
  if (!imbalance_ms || *imbalance_ms < 1000) return bad("--imbalance-interval: expected a duration of at least 1s");
  o.lease_ms = *lease_ms;
  o.recovery_interval = std::chrono::milliseconds(*recovery_ms);
  o.drain_timeout = std::chrono::milliseconds(*drain_ms);
  std::string kv_error;
  auto kvs = parse_key_values(kafka_opts, kv_error);
  if (!kvs) return bad("--kafka-opt: " + kv_error);
  o.kafka_opts = std::move(*kvs);
  add_kafka_sasl_from_env(o.kafka_opts);

  init_logging("saga-worker", *parse_log_format(log_format));

  std::unique_ptr<Ledger> ledger;
  if (Status s = Ledger::open(stores, ledger); !s) return bad(s.message());
  if (Status s = ledger->verify_topology(); !s) return bad(s.message());
  // One store with batch transactions: PostgreSQL runs several at once,
  // SQLite one writer at a time.
  const bool one_scoped_store = ledger->shard_count() == 1 && ledger->transfers().supports_scope();
  const bool lanes_possible = one_scoped_store && ledger->transfers().concurrent_scopes();
  const bool one_writer = one_scoped_store && !lanes_possible;
  if (store_lanes == 0) store_lanes = lanes_possible ? 2 : 1;
  // A pool on one writer moves what that writer commits: a larger batch
  // spreads each commit's fixed cost (the accounts' pages rewritten, the
  // other worker's changes read back) over more transfers (bench/REPORT.md,
  // "The thirtieth session").
  if (batch_size->count() == 0 && one_writer) o.batch_size = 10000;
  if (store_lanes > 1 && !lanes_possible) {
    return bad("--store-lanes: more than 1 needs a single PostgreSQL store (SQLite takes one "
               "writer at a time; shards commit each step on its own)");
  }
  std::vector<std::unique_ptr<Ledger>> lane_ledgers(store_lanes - 1);
  for (auto& lane : lane_ledgers) {
    if (Status s = Ledger::open(stores, lane); !s) return bad(s.message());
  }
  // In the registry (the first store) until a clean exit; see registration.hpp.
  std::unique_ptr<WorkerRegistration> registration;
  if (Status s = WorkerRegistration::start(stores.front(), o.worker_id, o.lease_ms, registration); !s) {
    return bad("worker registry: " + s.message());
  }

  // Metrics and probes start before the broker check, so /livez answers
  // while the worker waits for Kafka.
  const auto started = SteadyClock::now();
  auto registry = std::make_shared<prometheus::Registry>();
  WorkerProbe probe(*registry);
  ConsumerProbe consumer_probe(*registry);
  std::atomic<const Worker*> running{nullptr};
  std::shared_ptr<StoreCollector> collector;
  std::unique_ptr<HttpServer> http;
  if (!metrics_addr.empty()) {
    StoreCollectorOptions copts;
    copts.store_urls = stores;
    copts.imbalance_interval = std::chrono::milliseconds(*imbalance_ms);
    copts.pool_size = &registration->live_workers();
    if (Status s = StoreCollector::open(copts, probe, collector); !s) return bad(s.message());
    Consumer::set_stats_listener(&consumer_probe);
    const auto startup_grace = std::chrono::milliseconds(*broker_ms) + kLivenessTimeout;
    HttpRoutes routes;
    routes.collectables = {registry, collector};
    routes.live = [&running, started, startup_grace]() -> HealthCheck {
      const auto now = SteadyClock::now();
      const Worker* w = running.load(std::memory_order_acquire);
      const auto last = w != nullptr ? w->last_loop() : SteadyClock::time_point{};
      const auto secs = [](SteadyClock::duration d) {
        return std::to_string(std::chrono::duration_cast<std::chrono::seconds>(d).count()) + "s";
      };
      if (last == SteadyClock::time_point{}) {
        if (now - started <= startup_grace) return {true, "starting"};
        return {false, "the worker loop has not started after " + secs(now - started)};
      }
      if (now - last <= kLivenessTimeout) return {true, "worker loop running"};
      return {false, "the worker loop has not completed an iteration for " + secs(now - last) +
                         " (limit " + secs(kLivenessTimeout) + ")"};
    };
    routes.ready = [&consumer_probe, collector_ptr = collector.get()]() -> HealthCheck {
      if (g_stop.load()) return {false, "stopping"};
      const int assigned = consumer_probe.assigned_partitions();
      if (assigned < 0) return {false, "waiting for the consumer group (no consumer statistics yet)"};
      if (assigned == 0) return {false, "no partitions assigned to this worker"};
      std::string why;
      if (!collector_ptr->store_reachable(why)) return {false, why};
      return {true, std::to_string(assigned) + " partition(s) assigned, store reachable"};
    };
    if (Status s = HttpServer::start(metrics_addr, std::move(routes), http); !s) {
      return bad("--metrics-addr: " + s.message());
    }
  }

  if (Status s = check_kafka(o.brokers, o.kafka_opts, {o.requests_topic, o.results_topic, o.dlq_topic},
                             std::chrono::milliseconds(*broker_ms));
      !s) {
    std::cerr << "saga-worker: " << s.message() << "\n";
    return 3;
  }

  if (Status s = failpoints::init_from_env(); !s) return bad(s.message());  // SAGA_FAILPOINTS
  SystemClock clock;
  WorkerIo io;
  io.clock = &clock;
  io.lane_ledgers = std::move(lane_ledgers);
  if (Status s = KafkaMessageOutput::create(o, io.output); !s) return bad(s.message());
  if (Status s = KafkaRequestSource::create(o, io.source); !s) return bad(s.message());
  auto worker = std::make_unique<Worker>(o, *ledger, probe, std::move(io));
  running.store(worker.get(), std::memory_order_release);

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);

  // The drain is bounded by --drain-timeout, but librdkafka's consumer close
  // and destroy wait for brokers without a deadline. Everything that matters
  // is in the store by then, so past the deadline (and a grace) the worker
  // leaves like a crash would: uncommitted offsets are consumed again and
  // found as duplicates, unpublished outcomes are republished by recovery.
  std::thread([deadline = o.drain_timeout + std::chrono::seconds(10)] {
    while (!g_stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::this_thread::sleep_for(deadline);
    std::fprintf(stderr, "saga-worker: the drain did not finish within --drain-timeout + 10s "
                         "(a broker is unreachable?); exiting without leaving the group\n");
    std::_Exit(1);
  }).detach();

  spdlog::info("worker {} started: group {}, {} store(s), {} lane(s), batch {}, lease {}ms", o.worker_id,
               o.group, stores.size(), store_lanes, o.batch_size, o.lease_ms);
  Status s = worker->run(g_stop);
  http.reset();  // no request may see the worker go
  running.store(nullptr, std::memory_order_release);
  worker.reset();
  registration.reset();
  if (!s) {
    spdlog::error("stopping on a fatal error: {}", s.message());
    spdlog::shutdown();
    return 1;
  }
  spdlog::shutdown();
  return 0;
}
