// One simulated run: set-up drawn from the seed, a random walk of actions
// with faults injected around every store call, a quiet phase that lets the
// pool finish, then every check. See simulation.hpp and docs/RELIABILITY.md.
//
// The workers are saga-worker's own loop (sagapool::Worker, one step() per
// turn) wired to a simulated Kafka and a manual clock through worker_io.hpp;
// a crash is a SimCrash unwinding step(), a pause is other actors' turns
// inside one of its store calls. The operator runs the real cancel_transfer
// and retry_transfer. Only Kafka, the clock and the store are simulated.
#include "simulation.hpp"

#include <prometheus/registry.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <vector>

#include "sagapool/audit.hpp"
#include "sagapool/fault_store.hpp"
#include "sagapool/ledger.hpp"
#include "sagapool/memory_store.hpp"
#include "sagapool/operator_actions.hpp"
#include "sagapool/outcome.hpp"
#include "sagapool/probe.hpp"
#include "sagapool/request.hpp"
#include "sagapool/saga_engine.hpp"
#include "sagapool/worker.hpp"
#include "sagapool/worker_io.hpp"

#include <nlohmann/json.hpp>

namespace sagapool::sim {

void SimStats::add(const SimStats& other) {
  for (const auto& [k, v] : other.counters) counters[k] += v;
}

std::string SimStats::to_text() const {
  std::string out;
  for (const auto& [k, v] : counters) out += "  " + k + ": " + std::to_string(v) + "\n";
  return out;
}

namespace {

constexpr std::int64_t kStartMs = 1'700'000'000'000;
const WorkerOptions kTopics;  // the topic names the workers use
constexpr std::string_view kOperator = "sagactl@ops";
constexpr std::int64_t kOperatorLeaseMs = 5'000;  // as in operator_actions.cpp
constexpr int kMaxRoundsToSettle = 80;

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : g_(seed) {}
  std::size_t below(std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(g_() % n); }
  std::int64_t range(std::int64_t lo, std::int64_t hi) {  // inclusive
    return lo + static_cast<std::int64_t>(g_() % (static_cast<std::uint64_t>(hi - lo) + 1));
  }
  bool per_mille(std::size_t p) { return below(1000) < p; }
  template <typename T>
  const T& pick(const std::vector<T>& v) { return v[below(v.size())]; }

 private:
  std::mt19937_64 g_;
};

// One payload an id was produced with; variant 0 is the request itself,
// others are conflicting payloads under the same id.
struct Variant {
  std::string from;
  std::string to;
  std::int64_t amount = 0;
  std::string currency;
  std::string metadata;
  bool operator==(const Variant&) const = default;
};

struct RequestSpec {
  std::string id;
  std::vector<Variant> variants;
};

struct Message {
  std::string key;
  std::string value;
  int partition = 0;
  std::int64_t offset = 0;
  int request = -1;  // -1: invalid input
  int variant = -1;
  std::string invalid_code;  // the validator's code for invalid input
  std::string readable_id;   // the id parse_request could still read from it
  std::vector<CopiedHeader> headers;  // tracing, and now and then a spoofed saga.* one
  std::int64_t timestamp_ms = 0;      // when it was produced (became visible)
  int deliveries = 0;
};

// A message on the outcomes topic: its key and the JSON the worker wrote.
struct Outcome {
  std::string id;
  std::string json;
};

struct DeadLetter {
  const Message* message = nullptr;
  std::string reason;
  std::string code;
};

// A `rejected` outcome, matched to the message it answers by its position.
struct Rejection {
  const Message* message = nullptr;
  std::string id;
  std::string reason;
  std::string error;
};

struct Partition {
  std::vector<Message> log;
  std::size_t visible = 0;   // produced so far
  std::int64_t committed = 0;
  int owner = -1;            // worker index, -1: unassigned
};

class World;
class SimOutput;

// A simulated process: a worker or the operator's sagactl.
struct Actor final : FaultHooks {
  Actor(World& w, int i, bool op) : world(w), index(i), is_operator(op) {}
  Status on_call(std::string_view op, Phase phase, bool in_scope) override;

  World& world;
  int index;
  bool is_operator;
  std::string owner;
  int incarnation = 0;
  bool alive = false;
  bool paused = false;
  bool busy = false;
  bool lost_partitions = false;
  int restart_in = 0;  // steps until a dead worker restarts
  std::unique_ptr<Ledger> ledger;
  // A worker's process: the real loop on the simulated Kafka and clock.
  std::unique_ptr<WorkerClock> clock;  // outlives the worker
  SimOutput* output = nullptr;         // owned by the worker
  std::unique_ptr<Worker> worker;
  bool offer_batch = false;  // this turn's poll returns messages
  int backoffs = 0;          // the worker's sleeps in this turn
  // Kafka: fetch position and stored (not yet committed) offset per owned partition.
  std::map<int, std::int64_t> position;
  std::map<int, std::int64_t> stored;
};

class CountingObserver final : public SagaObserver {
 public:
  explicit CountingObserver(SimStats& stats) : stats_(stats) {}
  void on_transitions(TransferState, TransferState, std::size_t count) override {
    stats_["engine transitions"] += static_cast<std::int64_t>(count);
  }
  void on_compensation(Reason) override { ++stats_["compensations"]; }
  void on_stage(std::string_view, std::chrono::nanoseconds) override {}
  void on_store_error(std::string_view, const Status&) override { ++stats_["store errors seen by the operator"]; }

 private:
  SimStats& stats_;
};

class World {
 public:
  World(std::uint64_t seed, const SimOptions& options)
      : seed_(seed), options_(options), rng_(seed ^ 0x5a6a'9001'c0ff'eeULL), observer_(stats_), probe_(registry_) {}

  SimResult run();
  Status on_call(Actor& a, std::string_view op, Phase phase, bool in_scope);

  // ---- the simulated Kafka and clock, as the workers' SimSource, SimOutput
  // and SimClock see them ----
  void fetch(Actor& w, std::size_t max, std::vector<ConsumedMessage>& out);
  void store_offsets(Actor& w, std::span<const PartitionOffset> offsets);
  Status seek(Actor& w, std::span<const PartitionOffset> offsets);
  void commit_offsets(Actor& w);
  void deliver(std::string_view topic, std::string_view key, std::string_view value,
               const std::vector<CopiedHeader>& headers, std::int64_t timestamp_ms);
  void deliver_rejection(std::string_view key, std::string_view value);
  void backoff(Actor& w, std::chrono::milliseconds d);
  bool chance(std::size_t per_mille) { return !quiet_ && rng_.per_mille(per_mille); }
  std::int64_t now() { return clock_->now_ms(); }
  SimStats& stats() { return stats_; }
  template <typename... Args>
  void trace(const Args&... args);

 private:
  // ---- set-up ----
  void draw_config();
  void create_accounts();
  void create_messages();
  void open(Actor& a);
  Variant random_variant(std::size_t i);
  static std::string request_json(const std::string& id, const Variant& v);

  // ---- actions ----
  template <typename Fn>
  void act(Actor& a, const char* what, Fn&& fn);
  void turn(Actor& w, bool batch, const char* what);
  void kill(Actor& a, const std::string& why);
  void stop(Actor& w);
  void restart(Actor& a);
  void rebalance();
  void step();
  void nested_step(Actor& paused);
  void interlude(Actor& a, bool past_lease);
  std::vector<std::pair<std::string, std::int64_t>> held_by(const Actor& a);
  void operator_cancel(const std::string& id);
  void operator_retry(const std::string& id);
  void operator_create_account();
  void produce_more();
  void show(Partition& p, std::size_t visible);
  void settle();

  // ---- checks ----
  void audit(const char* when);
  void final_checks();
  void collect_probe_stats();
  void fail(const std::string& what);

  Actor& worker(std::size_t i) { return *workers_[i]; }
  std::vector<Actor*> live_workers(bool include_busy = false);
  std::string random_request_id();

  std::uint64_t seed_;
  SimOptions options_;
  Rng rng_;
  SimStats stats_;
  CountingObserver observer_;  // the operator's
  prometheus::Registry registry_;
  WorkerProbe probe_;  // the workers'
  std::string config_;
  std::string failure_;

  // Configuration drawn from the seed.
  std::size_t shards_ = 1;
  bool scopes_ = true;
  bool prepare_ = false;  // scopes can be prepared: batches run across the shards (TwoPhaseBatch)
  std::size_t worker_count_ = 2;
  std::int64_t lease_ms_ = 5000;
  std::size_t batch_size_ = 8;
  std::chrono::milliseconds recovery_interval_{1000};
  std::size_t fault_rate_ = 50;  // per 10,000 store calls
  std::size_t steps_ = 200;
  int retry_call_budget_ = 0;

  std::shared_ptr<ManualClock> clock_;
  std::vector<std::shared_ptr<MemoryDb>> dbs_;
  std::unique_ptr<Ledger> check_ledger_;  // plain connections, for set-up and checks
  std::vector<Account> accounts_;
  std::vector<RequestSpec> requests_;
  std::vector<Partition> partitions_;
  std::vector<std::unique_ptr<Actor>> workers_;
  std::unique_ptr<Actor> operator_;
  const std::atomic<bool> never_stop_{false};  // workers stop by drain() (stop())

  // What the simulated Kafka topics received.
  std::vector<Outcome> outcomes_;
  std::vector<DeadLetter> dead_letters_;
  std::vector<Rejection> rejections_;
  // The operator's results, to check against the final states.
  std::set<std::string> expect_canceled_;
  std::set<std::string> expect_done_;
  std::set<std::string> operator_touched_;
  // Accounts the operator created during the run: requests named them
  // before they existed.
  std::set<std::string> created_late_;

  int depth_ = 0;        // interludes in progress
  bool quiet_ = false;   // no faults (the settling phase)
  std::size_t step_no_ = 0;
};

// ---- the workers' connections ---------------------------------------------------

// The consumer-group member: partitions, positions and offsets are the
// world's (World::rebalance moves them).
class SimSource final : public RequestSource {
 public:
  SimSource(World& world, Actor& actor) : world_(world), actor_(actor) {}
  Status poll_batch(std::size_t max, std::chrono::milliseconds, std::vector<ConsumedMessage>& out) override {
    world_.fetch(actor_, max, out);
    return Status::ok();
  }
  Status store_offsets(std::span<const PartitionOffset> offsets) override {
    world_.store_offsets(actor_, offsets);
    return Status::ok();
  }
  Status seek(std::span<const PartitionOffset> offsets) override { return world_.seek(actor_, offsets); }
  void headers_of(const ConsumedMessage& m, std::vector<CopiedHeader>& out) override {
    out = static_cast<const Message*>(m.handle)->headers;
  }
  void close() override { world_.commit_offsets(actor_); }

 private:
  World& world_;
  Actor& actor_;
};

// The producer: messages wait in a queue until a poll reports them, some
// turns later; a few are refused (queue full) or fail to deliver; on a crash
// those in flight reach their topic or not, unreported.
class SimOutput final : public MessageOutput {
 public:
  explicit SimOutput(World& world) : world_(world) {}
  void set_listener(DeliveryListener* listener) override { listener_ = listener; }
  Status produce(const std::string& topic, std::string_view key, std::string_view value,
                 std::span<const MessageHeader> headers, void* opaque, rd_kafka_resp_err_t* err,
                 std::int64_t timestamp_ms) override {
    if (world_.chance(10)) {
      ++world_.stats()["messages refused by the producer (queue full)"];
      if (err != nullptr) *err = RD_KAFKA_RESP_ERR__QUEUE_FULL;
      return Status::retry_call("simulated producer queue full");
    }
    Queued& q = queue_.emplace_back();
    q.topic = topic;
    q.key.assign(key);
    q.value.assign(value);
    for (const MessageHeader& h : headers) {
      q.headers.push_back({std::string(h.name), h.value.data() == nullptr ? std::nullopt
                                                                           : std::optional<std::string>(h.value)});
    }
    q.opaque = opaque;
    q.timestamp_ms = timestamp_ms;
    return Status::ok();
  }
  int poll(std::chrono::milliseconds) override { return report(false); }
  bool flush(std::chrono::milliseconds) override {
    report(true);
    return true;
  }
  int outq_len() const override { return static_cast<int>(queue_.size()); }
  void close(std::chrono::milliseconds) override { report(true); }
  Status keep_usable() override { return Status::ok(); }

  // The process died: what was in flight reached its topic or not.
  void crash() {
    for (const Queued& q : queue_) {
      if (!world_.chance(500)) world_.deliver(q.topic, q.key, q.value, q.headers, q.timestamp_ms);
    }
    queue_.clear();
  }

 private:
  struct Queued {
    std::string topic, key, value;
    std::vector<CopiedHeader> headers;
    void* opaque = nullptr;
    std::int64_t timestamp_ms = 0;
  };

  int report(bool all) {
    std::vector<Queued> now;
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (all || !world_.chance(300)) {
        now.push_back(std::move(*it));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    for (const Queued& q : now) {
      DeliveryReport r{q.opaque, RD_KAFKA_RESP_ERR_NO_ERROR, q.topic, q.key};
      if (world_.chance(20)) {
        ++world_.stats()["deliveries failed"];
        r.err = RD_KAFKA_RESP_ERR__MSG_TIMED_OUT;
      } else {
        world_.deliver(q.topic, q.key, q.value, q.headers, q.timestamp_ms);
      }
      if (listener_ != nullptr) listener_->on_delivery(r);
    }
    return static_cast<int>(now.size());
  }

  World& world_;
  DeliveryListener* listener_ = nullptr;
  std::vector<Queued> queue_;
};

// The manual clock; a worker's backoff moves it on.
class SimClock final : public WorkerClock {
 public:
  SimClock(World& world, Actor& actor) : world_(world), actor_(actor) {}
  std::chrono::steady_clock::time_point now() override {
    return std::chrono::steady_clock::time_point(std::chrono::milliseconds(world_.now()));
  }
  std::int64_t wall_ms() override { return world_.now(); }
  void sleep_for(std::chrono::milliseconds d) override { world_.backoff(actor_, d); }

 private:
  World& world_;
  Actor& actor_;
};

Status Actor::on_call(std::string_view op, Phase phase, bool in_scope) {
  return world.on_call(*this, op, phase, in_scope);
}

// ---- set-up -------------------------------------------------------------------

// Requests name these accounts, which do not exist at the start; the
// operator creates some during the run.
constexpr std::size_t kGhostAccounts = 3;
std::string ghost_id(std::size_t k) { return "ghost-" + std::to_string(k); }

void World::draw_config() {
  const std::size_t mode = rng_.below(4);
  shards_ = mode >= 2 ? 2 : 1;
  scopes_ = mode == 0 || mode == 3;
  prepare_ = mode == 3 && rng_.below(2) == 0;
  worker_count_ = 2 + rng_.below(3);
  const std::int64_t leases[] = {2'000, 5'000, 30'000};
  lease_ms_ = leases[rng_.below(3)];
  batch_size_ = 1 + rng_.below(12);
  const std::chrono::milliseconds intervals[] = {std::chrono::milliseconds(0), std::chrono::milliseconds(200),
                                                 std::chrono::milliseconds(1000)};
  recovery_interval_ = intervals[rng_.below(3)];
  fault_rate_ = 150 + rng_.below(600);  // 1.5 % .. 7.5 % of store calls
  steps_ = 200 + rng_.below(500);
  retry_call_budget_ = rng_.per_mille(300) ? 1 : 0;  // each costs the engine a real 10 ms backoff
  const char* modes[] = {"one store with scopes (SQLite-like)", "one store without scopes (PostgreSQL-like)",
                         "two shards", "two shards with scopes (the first store's part of a batch in one transaction)"};
  std::ostringstream c;
  c << modes[mode] << (prepare_ ? ", prepared (a batch in one transaction on each, by two-phase commit)" : "")
    << ", " << worker_count_ << " workers, lease " << lease_ms_ << "ms, batch "
    << batch_size_ << ", recovery every " << recovery_interval_.count() << "ms, faults on " << static_cast<double>(fault_rate_) / 100.0 << "% of store calls, " << steps_ << " steps";
  config_ = c.str();
}

void World::create_accounts() {
  const std::size_t n = 5 + rng_.below(4);  // hot accounts
  for (std::size_t i = 0; i < n; ++i) {
    Account a;
    a.id = "a" + std::to_string(i);
    a.balance = rng_.range(0, 4000);
    if (rng_.per_mille(200)) a.min_balance = -rng_.range(1, 1500);  // a credit line
    if (rng_.per_mille(150)) a.currency = rng_.per_mille(500) ? "EUR" : "USD";
    a.locked = rng_.per_mille(80);
    if (i > 0 && rng_.per_mille(60)) a.balance = std::numeric_limits<std::int64_t>::max() - rng_.range(0, 3000);
    a.opening_balance = a.balance;
    accounts_.push_back(a);
  }
  std::vector<std::vector<Account>> per_shard(shards_);
  for (const Account& a : accounts_) per_shard[shard_of(a.id, shards_)].push_back(a);
  for (std::size_t s = 0; s < shards_; ++s) {
    if (per_shard[s].empty()) continue;
    if (Status st = check_ledger_->shard(s).create_accounts(per_shard[s]); !st) fail(st.message());
  }
}

Variant World::random_variant(std::size_t i) {
  Variant v;
  const std::size_t n = accounts_.size();
  const std::size_t from = rng_.below(n);
  v.from = accounts_[from].id;
  v.to = accounts_[(from + 1 + rng_.below(n - 1)) % n].id;
  if (rng_.per_mille(40)) (rng_.per_mille(500) ? v.from : v.to) = ghost_id(rng_.below(kGhostAccounts));
  v.amount = rng_.range(1, 1500);
  if (rng_.per_mille(30)) v.amount = rng_.range(1, std::numeric_limits<std::int64_t>::max());
  if (rng_.per_mille(100)) v.currency = rng_.per_mille(500) ? "EUR" : "USD";
  if (rng_.per_mille(150)) v.metadata = R"({"ref":"invoice )" + std::to_string(i) + R"(","n":[1,{"k":null}]})";
  return v;
}

std::string World::request_json(const std::string& id, const Variant& v) {
  std::string s = R"({"id":")" + id + R"(","from":")" + v.from + R"(","to":")" + v.to +
                  R"(","amount":)" + std::to_string(v.amount);
  if (!v.currency.empty()) s += R"(,"currency":")" + v.currency + "\"";
  if (!v.metadata.empty()) s += R"(,"metadata":)" + v.metadata;
  return s + "}";
}

void World::create_messages() {
  const std::size_t count = 30 + rng_.below(120);
  std::vector<Message> all;
  for (std::size_t i = 0; i < count; ++i) {
    RequestSpec r;
    r.id = "t-" + std::to_string(i);
    r.variants.push_back(random_variant(i));
    requests_.push_back(r);
  }
  // A few ids reused with another payload (conflicts).
  const std::size_t conflict_draws = rng_.below(4);
  for (std::size_t k = 0; k < conflict_draws; ++k) {
    RequestSpec& r = requests_[rng_.below(requests_.size())];
    Variant v = r.variants.front();
    if (rng_.per_mille(500)) v.amount = v.amount == 1 ? 2 : v.amount - 1;
    else v.metadata = R"({"conflict":)" + std::to_string(k) + "}";
    bool seen = false;
    for (const Variant& x : r.variants) seen |= x == v;
    if (!seen) r.variants.push_back(v);
  }
  std::size_t conflicts = 0;
  for (std::size_t i = 0; i < requests_.size(); ++i) {
    conflicts += requests_[i].variants.size() - 1;
    for (std::size_t v = 0; v < requests_[i].variants.size(); ++v) {
      Message m;
      m.key = requests_[i].variants[v].from;
      m.value = request_json(requests_[i].id, requests_[i].variants[v]);
      m.request = static_cast<int>(i);
      m.variant = static_cast<int>(v);
      all.push_back(m);
    }
  }
  // Duplicates (an upstream retrying): up to half of all messages.
  const std::size_t dups = rng_.below(requests_.size() + 1);
  for (std::size_t k = 0; k < dups; ++k) all.push_back(all[rng_.below(count)]);
  // Hostile input.
  const std::vector<std::string> invalid = {
      "", "not json", "{}", "[1,2]", R"({"id":"x","from":"a1","to":"a1","amount":1})",
      R"({"id":"x","from":"a1","to":"a2","amount":1.5})", R"({"id":"x","from":"a1","to":"a2","amount":01})",
      R"({"id":"x","from":"a1","to":"a2","amount":-0})", R"({"id":"x","from":"a1","to":"a2","amount":1e2})",
      R"({"id":"x","from":"a1","to":"a2","amount":9223372036854775808})",
      R"({"id":"x","id":"y","from":"a1","to":"a2","amount":1})",
      R"({"id":"x","from":"a1","to":"a2","amount":1,"extra":1})", "{\"id\":\"\xff\"}",
      std::string(40, '[') + std::string(40, ']'), R"({"id":"x","from":"a1","to":"a2","amount":1} x)"};
  const std::size_t bad = rng_.below(6);
  for (std::size_t k = 0; k < bad; ++k) {
    Message m;
    m.value = rng_.pick(invalid);
    m.key = rng_.per_mille(300) ? "" : accounts_[rng_.below(accounts_.size())].id;
    RequestView v;
    const RequestError e = parse_request(m.value, v);
    if (e == RequestError::ok) fail("catalogue input is valid: " + m.value);
    m.invalid_code = std::string(error_code(e));
    m.readable_id = std::string(v.id);
    all.push_back(m);
  }
  for (std::size_t k = 0; k < all.size(); ++k) {
    if (rng_.per_mille(300)) all[k].headers.push_back({"traceparent", "00-" + std::to_string(k) + "-01"});
    if (rng_.per_mille(100)) all[k].headers.push_back({"x-null", std::nullopt});
    if (rng_.per_mille(100)) all[k].headers.push_back({"saga.error", "spoofed"});
  }
  std::shuffle(all.begin(), all.end(), std::mt19937_64(rng_.below(1'000'000'000)));
  partitions_.resize(1 + rng_.below(3));
  for (Message& m : all) {
    const std::size_t p = m.key.empty() ? rng_.below(partitions_.size()) : fnv1a64(m.key) % partitions_.size();
    m.partition = static_cast<int>(p);
    m.offset = static_cast<std::int64_t>(partitions_[p].log.size());
    partitions_[p].log.push_back(m);
  }
  stats_["requests (valid ids)"] += static_cast<std::int64_t>(requests_.size());
  stats_["messages"] += static_cast<std::int64_t>(all.size());
  stats_["duplicate messages produced"] += static_cast<std::int64_t>(dups);
  stats_["conflicting messages produced"] += static_cast<std::int64_t>(conflicts);
  stats_["invalid messages produced"] += static_cast<std::int64_t>(bad);
  config_ += ", " + std::to_string(partitions_.size()) + " partition(s), " + std::to_string(accounts_.size()) +
             " hot accounts, " + std::to_string(requests_.size()) + " requests in " +
             std::to_string(all.size()) + " messages (" + std::to_string(dups) + " duplicates, " +
             std::to_string(conflicts) + " conflicts, " + std::to_string(bad) + " invalid)";
}

void World::open(Actor& a) {
  std::vector<std::unique_ptr<Store>> stores;
  for (const auto& db : dbs_) stores.push_back(std::make_unique<FaultStore>(connect(db), a));
  a.ledger = Ledger::from_stores(std::move(stores));
  ++a.incarnation;
  if (a.is_operator) {
    a.owner = std::string(kOperator);
  } else {
    // Half the restarts keep the worker id (--worker-id, a StatefulSet pod),
    // half get a new one (host:pid).
    a.owner = "w" + std::to_string(a.index) + (a.incarnation > 1 && rng_.per_mille(500) ? "" : "#" + std::to_string(a.incarnation));
    WorkerOptions o;
    o.worker_id = a.owner;
    o.lease_ms = lease_ms_;
    o.batch_size = batch_size_;
    o.recovery_interval = recovery_interval_;
    a.clock = std::make_unique<SimClock>(*this, a);
    WorkerIo io;
    io.source = std::make_unique<SimSource>(*this, a);
    auto output = std::make_unique<SimOutput>(*this);
    a.output = output.get();
    io.output = std::move(output);
    io.clock = a.clock.get();
    a.worker = std::make_unique<Worker>(o, *a.ledger, probe_, std::move(io));
  }
  a.alive = true;
}

// ---- fault injection ------------------------------------------------------------

Status World::on_call(Actor& a, std::string_view op, Phase phase, bool in_scope) {
  if (quiet_ || op == "rollback" || !failure_.empty()) return Status::ok();
  if (rng_.below(10'000) >= fault_rate_) return Status::ok();
  const std::string where = std::string(op) + (phase == Phase::before ? " (before)" : " (after)");
  const std::size_t dice = rng_.below(100);
  if (dice < 22) {
    ++stats_["crashes"];
    if (in_scope) ++stats_["crashes inside a scope (rolled back)"];
    if (phase == Phase::after) ++stats_["crashes after a write was applied"];
    ++stats_["crash site " + where];
    trace(a.owner, " CRASH at ", where);
    throw SimCrash{a.owner + " at " + where};
  }
  // Not while any of its connections holds a scope (a batch across stores
  // holds the first store's while it calls the others): the others would
  // wait for it, and nothing here ends an idle transaction as PostgreSQL's
  // idle_in_transaction_session_timeout does.
  bool holds_scope = in_scope;
  for (std::size_t s = 0; a.ledger && s < a.ledger->shard_count(); ++s) {
    holds_scope |= static_cast<FaultStore&>(a.ledger->shard(s)).in_scope();
  }
  const bool can_interleave = depth_ == 0 && !holds_scope && !a.paused;
  if (dice >= 50 && dice < 72 && can_interleave) {
    interlude(a, true);
    return Status::ok();
  }
  if (dice >= 72 && can_interleave) {
    interlude(a, false);
    return Status::ok();
  }
  if (dice >= 47 && dice < 50 && retry_call_budget_ > 0 && op != "begin_scope") {
    --retry_call_budget_;
    ++stats_["injected errors (retry_call)"];
    trace(a.owner, " error retry_call at ", where);
    return Status::retry_call("simulated busy store at " + where);
  }
  if (op == "begin_scope" && phase == Phase::after) return Status::ok();  // BEGIN either began or failed
  ++stats_["injected errors (retry_stage)"];
  if (phase == Phase::after) ++stats_["injected errors after the write was applied"];
  trace(a.owner, " error retry_stage at ", where);
  return Status::retry_stage("simulated lost connection at " + where);
}

// A pause: `a` stops at this store call while others act. Past its lease,
// it is a zombie: others may claim its transfers, the group revokes its
// partitions, and it resumes with stale epochs.
void World::interlude(Actor& a, bool past_lease) {
  ++depth_;
  a.paused = true;
  const std::vector<std::pair<std::string, std::int64_t>> held = held_by(a);
  if (past_lease) {
    ++stats_["zombies (paused past the lease)"];
    clock_->advance(std::max(lease_ms_, kOperatorLeaseMs) + rng_.range(1, lease_ms_));
    if (!a.is_operator) {
      a.lost_partitions = true;
      rebalance();
    }
  } else {
    ++stats_["races (others act between two store calls)"];
  }
  trace(a.owner, past_lease ? " PAUSED past its lease" : " interleaved", " holding ", held.size(), " transfer(s)");
  const std::size_t n = 1 + rng_.below(4);
  for (std::size_t i = 0; i < n && failure_.empty(); ++i) {
    // Aim the operator at the paused process's transfers now and then.
    if (!held.empty() && !a.is_operator && rng_.per_mille(350)) {
      operator_cancel(rng_.pick(held).first);
    } else {
      nested_step(a);
    }
  }
  std::size_t taken = 0;
  for (const auto& [id, epoch] : held) {
    std::optional<TransferDoc> d;
    if (check_ledger_->transfers().load_transfer(id, d) && d && d->epoch != epoch) ++taken;
  }
  if (past_lease) stats_["zombie transfers taken over while paused"] += static_cast<std::int64_t>(taken);
  trace(a.owner, " resumes; ", taken, " of its transfer(s) changed hands");
  a.paused = false;
  --depth_;
}

// Transfers under `a`'s lease, with their epochs, as the store has them.
std::vector<std::pair<std::string, std::int64_t>> World::held_by(const Actor& a) {
  std::vector<std::pair<std::string, std::int64_t>> held;
  for (const RequestSpec& r : requests_) {
    std::optional<TransferDoc> d;
    if (check_ledger_->transfers().load_transfer(r.id, d) && d && d->owner == a.owner &&
        !is_terminal(d->state) && d->lease_until_ms > now()) {
      held.emplace_back(r.id, d->epoch);
    }
  }
  return held;
}

// ---- actions --------------------------------------------------------------------

template <typename Fn>
void World::act(Actor& a, const char* what, Fn&& fn) {
  if (!a.alive || a.busy || a.paused || !failure_.empty()) return;
  a.busy = true;
  try {
    trace(a.owner, " ", what);
    fn();
  } catch (const SimCrash& c) {
    a.busy = false;
    kill(a, "crashed " + c.where);
    return;
  }
  a.busy = false;
  if (a.lost_partitions) {  // it rejoins the group
    a.lost_partitions = false;
    rebalance();
  }
}

// One turn of a worker's loop: Worker::step, with a batch to consume or not.
void World::turn(Actor& w, bool batch, const char* what) {
  act(w, what, [&] {
    w.offer_batch = batch;
    w.backoffs = 0;
    if (Status s = w.worker->step(never_stop_); !s) fail("worker " + w.owner + " stopped: " + s.message());
  });
}

void World::kill(Actor& a, const std::string& why) {
  trace(a.owner, " dies: ", why);
  if (a.output != nullptr) a.output->crash();
  a.output = nullptr;
  a.worker.reset();
  a.clock.reset();
  a.ledger.reset();  // drops its connections: an open scope rolls back
  a.stored.clear();
  a.position.clear();
  a.alive = false;
  a.lost_partitions = false;
  if (a.is_operator) {
    open(a);  // the next sagactl command is a new process
    return;
  }
  a.restart_in = 1 + static_cast<int>(rng_.below(15));
  for (Partition& p : partitions_) {
    if (p.owner == a.index) p.owner = -1;
  }
  rebalance();
}

// SIGTERM: the worker drains (publishes what is queued, stores and commits
// its offsets, leaves the group), then the process exits.
void World::stop(Actor& w) {
  bool drained = false;
  act(w, "stops (SIGTERM)", [&] {
    w.worker->drain();
    drained = true;
  });
  if (!drained) return;  // it crashed while draining
  ++stats_["graceful stops"];
  kill(w, "stopped");
}

void World::restart(Actor& a) {
  ++stats_["restarts"];
  open(a);
  trace(a.owner, " starts");
  rebalance();
}

std::vector<Actor*> World::live_workers(bool include_busy) {
  std::vector<Actor*> out;
  for (auto& w : workers_) {
    if (w->alive && !w->paused && (include_busy || !w->busy)) out.push_back(w.get());
  }
  return out;
}

// The consumer group: partitions spread over the live members; a member
// that loses a partition commits what it stored first (commit on revoke),
// unless it is dead or paused; a new owner starts at the committed offset.
void World::rebalance() {
  std::vector<Actor*> members = live_workers(true);
  for (std::size_t p = 0; p < partitions_.size(); ++p) {
    Partition& part = partitions_[p];
    const int next = members.empty() ? -1 : members[(p + rng_.below(members.size())) % members.size()]->index;
    if (next == part.owner) continue;
    const int key = static_cast<int>(p);
    if (part.owner >= 0) {
      Actor& old = worker(static_cast<std::size_t>(part.owner));
      if (old.alive && !old.paused) {
        const auto it = old.stored.find(key);
        if (it != old.stored.end()) part.committed = std::max(part.committed, it->second);
      }
      old.stored.erase(key);
      old.position.erase(key);
    }
    part.owner = next;
    if (next >= 0) worker(static_cast<std::size_t>(next)).position[key] = part.committed;
  }
}

void World::commit_offsets(Actor& w) {
  for (const auto& [p, offset] : w.stored) {
    Partition& part = partitions_[static_cast<std::size_t>(p)];
    if (part.owner == w.index) part.committed = std::max(part.committed, offset);
  }
  w.stored.clear();
}

void World::produce_more() {
  for (Partition& p : partitions_) show(p, std::min(p.log.size(), p.visible + rng_.below(batch_size_ * 2 + 2)));
}

// Messages up to `visible` are produced now.
void World::show(Partition& p, std::size_t visible) {
  for (; p.visible < visible; ++p.visible) p.log[p.visible].timestamp_ms = now();
}

// The worker's poll: when the turn offers a batch, up to `max` messages from
// one or more of its partitions, from their fetch positions.
void World::fetch(Actor& w, std::size_t max, std::vector<ConsumedMessage>& out) {
  out.clear();
  if (!std::exchange(w.offer_batch, false)) return;
  for (bool first = true; out.size() < max && (first || rng_.per_mille(300)); first = false) {
    std::vector<int> ready;
    for (const auto& [p, pos] : w.position) {
      if (static_cast<std::size_t>(pos) < partitions_[static_cast<std::size_t>(p)].visible) ready.push_back(p);
    }
    if (ready.empty()) break;
    const int p = rng_.pick(ready);
    Partition& part = partitions_[static_cast<std::size_t>(p)];
    std::int64_t& pos = w.position[p];
    const std::size_t n = std::min(max - out.size(), part.visible - static_cast<std::size_t>(pos));
    for (std::size_t k = 0; k < n; ++k, ++pos) {
      Message& m = part.log[static_cast<std::size_t>(pos)];
      if (++m.deliveries > 1) ++stats_["messages redelivered"];
      ++stats_["messages delivered"];
      out.push_back({kTopics.requests_topic, p, m.offset, m.timestamp_ms, m.key, m.value, &m});
      trace("  ", p, "/", m.offset, ": ", m.value);
    }
  }
  if (!out.empty()) ++stats_["batches consumed"];
}

// Offsets of partitions revoked meanwhile are not stored (librdkafka: _STATE).
void World::store_offsets(Actor& w, std::span<const PartitionOffset> offsets) {
  for (const PartitionOffset& o : offsets) {
    if (partitions_[static_cast<std::size_t>(o.partition)].owner != w.index) {
      ++stats_["offsets not stored (partition revoked meanwhile)"];
      continue;
    }
    std::int64_t& stored = w.stored[o.partition];
    stored = std::max(stored, o.offset);
  }
}

Status World::seek(Actor& w, std::span<const PartitionOffset> offsets) {
  ++stats_["batches consumed again (seek)"];
  for (const PartitionOffset& o : offsets) {
    if (partitions_[static_cast<std::size_t>(o.partition)].owner != w.index) {
      return Status::retry_call("seek: partition " + std::to_string(o.partition) + " is not assigned");
    }
    w.position[o.partition] = o.offset;
  }
  return Status::ok();
}

// The worker retries a store that is down with a backoff: time passes.
void World::backoff(Actor& w, std::chrono::milliseconds d) {
  ++stats_["worker backoffs (store unavailable)"];
  if (++w.backoffs > 200) {
    fail(w.owner + " retried the store 200 times in one turn");
    throw SimCrash{"an endless retry"};
  }
  clock_->advance(d.count());
}

// A message reached its topic. Dead letters are read back from their headers.
void World::deliver(std::string_view topic, std::string_view key, std::string_view value,
                    const std::vector<CopiedHeader>& headers, std::int64_t timestamp_ms) {
  if (topic == kTopics.results_topic) {
    if (value.find(R"("state":"rejected")") != std::string_view::npos) {
      deliver_rejection(key, value);
    } else {
      outcomes_.push_back({std::string(key), std::string(value)});
    }
    return;
  }
  if (topic != kTopics.dlq_topic) {
    fail("a message was produced to " + std::string(topic));
    return;
  }
  auto header = [&](std::string_view name) -> std::string {
    for (const CopiedHeader& h : headers) {
      if (h.name == name) return h.value.value_or("");
    }
    return {};
  };
  std::size_t p = 0;
  std::int64_t offset = -1;
  const std::string ps = header("saga.source.partition");
  const std::string os = header("saga.source.offset");
  std::from_chars(ps.data(), ps.data() + ps.size(), p);
  std::from_chars(os.data(), os.data() + os.size(), offset);
  if (header("saga.source.topic") != kTopics.requests_topic || p >= partitions_.size() || offset < 0 ||
      static_cast<std::size_t>(offset) >= partitions_[p].log.size()) {
    fail("a dead letter names no message it came from: " + ps + "/" + os);
    return;
  }
  const Message& m = partitions_[p].log[static_cast<std::size_t>(offset)];
  if (m.key != key || m.value != value) fail("dead letter " + ps + "/" + os + " does not carry its message's bytes");
  // After the six saga.* headers, the original's own, in order, but any
  // saga.* one (a spoof); and the original's timestamp.
  std::vector<CopiedHeader> carried(headers.begin() + static_cast<std::ptrdiff_t>(std::min<std::size_t>(6, headers.size())), headers.end());
  std::vector<CopiedHeader> expected = m.headers;
  std::erase_if(expected, [](const CopiedHeader& h) { return h.name.starts_with("saga."); });
  auto same = [](const CopiedHeader& a, const CopiedHeader& b) { return a.name == b.name && a.value == b.value; };
  if (!std::equal(carried.begin(), carried.end(), expected.begin(), expected.end(), same) ||
      timestamp_ms != m.timestamp_ms) {
    fail("dead letter " + ps + "/" + os + " does not carry its message's headers and timestamp");
  }
  dead_letters_.push_back({&m, header("saga.reason"), header("saga.error")});
}

void World::deliver_rejection(std::string_view key, std::string_view value) {
  const auto j = nlohmann::json::parse(value, nullptr, false);
  const auto request = j.is_object() ? j.value("request", nlohmann::json()) : nlohmann::json();
  const auto p = request.is_object() ? request.value("partition", -1) : -1;
  const auto offset = request.is_object() ? request.value("offset", std::int64_t{-1}) : -1;
  if (!request.is_object() || request.value("topic", "") != kTopics.requests_topic || p < 0 ||
      static_cast<std::size_t>(p) >= partitions_.size() || offset < 0 ||
      static_cast<std::size_t>(offset) >= partitions_[static_cast<std::size_t>(p)].log.size()) {
    fail("a rejected outcome names no message it answers: " + std::string(value));
    return;
  }
  const std::string id = j.value("id", "");
  if (id != key) fail("a rejected outcome for " + id + " is keyed " + std::string(key));
  rejections_.push_back({&partitions_[static_cast<std::size_t>(p)].log[static_cast<std::size_t>(offset)], id,
                         j.value("reason", ""), j.value("error", "")});
}

void World::operator_cancel(const std::string& id) {
  Actor& op = *operator_;
  act(op, "cancel", [&] {
    ++stats_["operator cancels"];
    operator_touched_.insert(id);
    ActionOutcome out;
    const Status s = cancel_transfer(*op.ledger, id, kOperator, observer_, out);
    if (!s) {
      if (s.kind() == ErrorKind::fatal) fail("operator cancel of " + id + " failed: " + s.message());
      ++stats_["operator cancels failed (transient)"];
      return;
    }
    trace("cancel ", id, ": ", out.message);
    if (out.result == ActionResult::done || out.state == TransferState::canceled) {
      if (out.result == ActionResult::done) ++stats_["operator cancels that canceled"];
      expect_canceled_.insert(id);
    } else if (out.state == TransferState::applied || out.state == TransferState::done) {
      ++stats_["operator cancels refused (applied)"];
      expect_done_.insert(id);
    }
  });
}

void World::operator_retry(const std::string& id) {
  Actor& op = *operator_;
  act(op, "retry", [&] {
    ++stats_["operator retries"];
    ActionOutcome out;
    const Status s = retry_transfer(*op.ledger, id, kOperator, observer_, out);
    if (!s && s.kind() == ErrorKind::fatal) fail("operator retry of " + id + " failed: " + s.message());
  });
}

// The operator creates an account that requests in flight name but that did
// not exist (a ghost): legs that found it missing, voided it or were refused
// before, and legs after, must agree (issue 19).
void World::operator_create_account() {
  const std::string id = ghost_id(rng_.below(kGhostAccounts));
  if (created_late_.count(id) != 0) return;
  Account a;
  a.id = id;
  a.balance = a.opening_balance = rng_.range(0, 4000);
  Actor& op = *operator_;
  act(op, "creates an account", [&] {
    ++stats_["accounts created during the run"];
    Store& store = op.ledger->shard_for(id);
    const Status created = store.create_accounts({&a, 1});
    // A fault may report a creation that applied as failed: the store tells.
    std::optional<Account> found;
    if (Status s = store.load_account(id, found); !s) {
      if (s.kind() == ErrorKind::fatal) fail("operator load of " + id + " failed: " + s.message());
      return;
    }
    if (!found) {
      if (created.kind() == ErrorKind::fatal) fail("operator create of " + id + " failed: " + created.message());
      return;
    }
    trace("account ", id, " created: balance ", found->opening_balance);
    created_late_.insert(id);
    accounts_.push_back(*found);
  });
}

std::string World::random_request_id() {
  return requests_[rng_.below(requests_.size())].id;
}

// One top-level event.
void World::step() {
  for (auto& w : workers_) {
    if (!w->alive && --w->restart_in <= 0) restart(*w);
  }
  std::vector<Actor*> live = live_workers();
  const std::size_t dice = rng_.below(1000);
  if (live.empty() || dice < 60) {
    produce_more();
  } else if (dice < 460) {
    turn(*rng_.pick(live), true, "steps with a batch");
  } else if (dice < 680) {
    turn(*rng_.pick(live), false, "steps without a batch");
  } else if (dice < 740) {
    commit_offsets(*rng_.pick(live));
  } else if (dice < 860) {
    clock_->advance(rng_.range(1, 400));
  } else if (dice < 890) {
    clock_->advance(lease_ms_ + rng_.range(1, lease_ms_));
  } else if (dice < 940) {
    operator_cancel(random_request_id());
  } else if (dice < 950) {
    operator_retry(random_request_id());
  } else if (dice < 960) {
    operator_create_account();
  } else if (dice < 970) {
    Actor& w = *rng_.pick(live);
    ++stats_["crashes"];
    ++stats_["crash site between batches (SIGKILL)"];
    kill(w, "killed between batches");
  } else if (dice < 975) {
    stop(*rng_.pick(live));
  } else {
    rebalance();
  }
}

// What others do while `paused` is stopped at a store call.
void World::nested_step(Actor& paused) {
  std::vector<Actor*> live = live_workers();
  const std::size_t dice = rng_.below(100);
  if (live.empty() || dice < 10) {
    clock_->advance(rng_.range(1, 300));
  } else if (dice < 55) {
    turn(*rng_.pick(live), false, "steps without a batch (during a pause)");
  } else if (dice < 85) {
    turn(*rng_.pick(live), true, "steps with a batch (during a pause)");
  } else if (!paused.is_operator && dice < 95) {
    operator_cancel(random_request_id());
  } else if (!paused.is_operator) {
    operator_create_account();
  }
}

// No more faults: every worker up, every message consumed, every lease run
// out and recovered, every outcome delivered and marked.
void World::settle() {
  quiet_ = true;
  for (auto& w : workers_) {
    if (!w->alive) restart(*w);
  }
  rebalance();
  for (Partition& p : partitions_) show(p, p.log.size());
  for (int round = 0; round < kMaxRoundsToSettle && failure_.empty(); ++round) {
    for (auto& w : workers_) {
      // Steps until it has consumed everything, and one more to deliver and
      // record the last outcomes.
      for (int guard = 0; guard < 10'000 && failure_.empty(); ++guard) {
        bool more = false;
        for (const auto& [p, pos] : w->position) {
          more |= static_cast<std::size_t>(pos) < partitions_[static_cast<std::size_t>(p)].visible;
        }
        turn(*w, more, "drains");
        if (!more) break;
      }
      commit_offsets(*w);
    }
    clock_->advance(std::max(lease_ms_, kOperatorLeaseMs) + 1);
    for (auto& w : workers_) {
      turn(*w, false, "recovers");  // recovery is due: the clock passed its interval
      turn(*w, false, "publishes");
    }
    bool open = false;
    for (const Partition& p : partitions_) open |= p.committed != static_cast<std::int64_t>(p.log.size());
    for (auto& w : workers_) open |= w->output != nullptr && w->output->outq_len() > 0;
    std::size_t unfinished = 0;
    if (Status s = check_ledger_->transfers().scan_transfer_states([&](std::string_view, TransferState st, bool n) {
          if (!is_terminal(st) || !n) ++unfinished;
        });
        !s) {
      fail("scan after settling: " + s.message());
    }
    if (!open && unfinished == 0) {
      stats_["rounds to settle"] += round + 1;
      return;
    }
  }
  if (failure_.empty()) {
    fail("invariant 6: the pool did not finish every transfer, publish every outcome and commit every "
         "offset within " + std::to_string(kMaxRoundsToSettle) + " lease periods");
  }
}

// ---- checks ------------------------------------------------------------------------

void World::fail(const std::string& what) {
  if (failure_.empty()) failure_ = "step " + std::to_string(step_no_) + ": " + what;
  trace("FAILURE: ", what);
}

template <typename... Args>
void World::trace(const Args&... args) {
  if (!options_.trace) return;
  std::ostringstream line;
  line << "[" << step_no_ << " +" << (clock_ ? clock_->now_ms() - kStartMs : 0) << "ms] ";
  (line << ... << args);
  std::cout << line.str() << "\n";
}

void World::audit(const char* when) {
  // A batch prepared and not finished holds its store (as its rows would
  // be locked) and may have committed on the first: it is in doubt until
  // resolved, and settle() resolves it before the final audit.
  for (const auto& db : dbs_) {
    if (db->prepared()) {
      ++stats_["audits skipped: a batch across stores in doubt"];
      return;
    }
  }
  AuditOptions options;
  options.stuck_after_ms = 1'000LL * 3600 * 24 * 365;  // invariant 6 is checked by settle()
  AuditReport report;
  if (Status s = run_audit(*check_ledger_, options, report); !s) {
    fail(std::string("audit ") + when + " could not run: " + s.message());
    return;
  }
  ++stats_["audits passed"];
  if (!report.ok()) fail(std::string("audit ") + when + " failed:\n" + report.to_text());
  for (const auto& db : dbs_) {
    for (const std::string& t : db->illegal_transitions()) fail("a transfer moved backwards: " + t);
  }
}

void World::final_checks() {
  audit("at the end");
  if (!failure_.empty()) return;
  Ledger& L = *check_ledger_;
  // An operator command that crashed after its creation applied never
  // heard of it: the store says which accounts exist.
  for (std::size_t k = 0; k < kGhostAccounts; ++k) {
    const std::string id = ghost_id(k);
    std::optional<Account> found;
    if (Status st = L.shard_for(id).load_account(id, found); !st) fail(st.message());
    if (found && created_late_.insert(id).second) accounts_.push_back(*found);
  }
  std::map<std::string, const Account*> accounts;
  for (const Account& a : accounts_) accounts[a.id] = &a;
  std::map<std::string, std::vector<Posting>> postings;
  for (std::size_t s = 0; s < L.shard_count(); ++s) {
    if (Status st = L.shard(s).scan_postings([&](const Posting& p) { postings[p.transfer_id].push_back(p); }); !st) {
      fail(st.message());
    }
  }
  std::map<std::string, std::vector<const std::string*>> published;
  for (const Outcome& o : outcomes_) published[o.id].push_back(&o.json);
  std::map<const Message*, std::set<std::string>> dead;
  for (const DeadLetter& d : dead_letters_) dead[d.message].insert(d.reason + "/" + d.code);
  // Every answer a message got, as "id reason/error"; at least once each.
  std::map<const Message*, std::set<std::string>> answered;
  for (const Rejection& r : rejections_) answered[r.message].insert(r.id + " " + r.reason + "/" + r.error);
  auto expect_answer = [&](const Message& m, const std::string& answer) {
    const auto it = answered.find(&m);
    const std::set<std::string> want = answer.empty() ? std::set<std::string>() : std::set<std::string>{answer};
    const std::set<std::string> got = it == answered.end() ? std::set<std::string>() : it->second;
    if (got != want) {
      fail("message " + std::to_string(m.partition) + "/" + std::to_string(m.offset) + " was answered " +
           (got.empty() ? "nothing" : *got.begin()) + ", expected " + (answer.empty() ? "nothing" : answer));
    }
  };
  std::set<std::string> valid_ids;

  for (std::size_t i = 0; i < requests_.size(); ++i) {
    const RequestSpec& r = requests_[i];
    valid_ids.insert(r.id);
    std::optional<TransferDoc> d;
    if (Status st = L.transfers().load_transfer(r.id, d); !st || !d) {
      fail("request " + r.id + " was lost: no transfer document");
      continue;
    }
    // Which payload stands: one of those produced under this id.
    int standing = -1;
    for (std::size_t v = 0; v < r.variants.size(); ++v) {
      const Variant& x = r.variants[v];
      if (x.from == d->source && x.to == d->destination && x.amount == d->amount &&
          x.currency == d->currency && x.metadata == d->metadata) {
        standing = static_cast<int>(v);
      }
    }
    if (standing < 0) fail("transfer " + r.id + " holds a payload nobody sent");
    if (!is_terminal(d->state) || !d->notified) {
      fail("transfer " + r.id + " not finished: " + std::string(to_string(d->state)) +
           (d->notified ? "" : ", outcome not marked published"));
    }
    ++stats_[d->state == TransferState::done ? "transfers done" : "transfers canceled"];
    // Exactly one outcome: published at least once, every copy the same, and
    // the same as the ledger's.
    std::string expected;
    format_outcome({d->id, d->state, d->reason, d->source, d->destination, d->amount, d->finished_at_ms,
                    d->currency, d->metadata}, expected);
    const auto pub = published.find(r.id);
    if (pub == published.end()) {
      fail("transfer " + r.id + " finished " + std::string(to_string(d->state)) + " but no outcome was published");
    } else {
      stats_["outcome messages published more than once"] += static_cast<std::int64_t>(pub->second.size() - 1);
      for (const std::string* o : pub->second) {
        if (*o != expected) fail("transfer " + r.id + ": a published outcome " + *o + " differs from the ledger's " + expected);
      }
    }
    // Postings: the transfer's own accounts and amount, on the legs its
    // state allows (the audit checks the set of kinds).
    for (const Posting& p : postings[r.id]) {
      const std::string& want = p.kind == PostingKind::credit ? d->destination : d->source;
      if (p.account_id != want || p.amount != d->amount) {
        fail("transfer " + r.id + ": " + std::string(to_string(p.kind)) + " posting of " +
             std::to_string(p.amount) + " on " + p.account_id);
      }
    }
    // The outcome agrees with the accounts, which (but for balances) never change.
    const auto src = accounts.find(d->source);
    const auto dst = accounts.find(d->destination);
    const bool both = src != accounts.end() && dst != accounts.end();
    if (d->state == TransferState::done) {
      if (!both || src->second->locked || dst->second->locked) fail("transfer " + r.id + " done on an unusable account");
    } else if (d->reason == Reason::unknown_account && both && created_late_.count(d->source) == 0 &&
               created_late_.count(d->destination) == 0) {
      fail("transfer " + r.id + " canceled for an unknown account, but both exist");
    } else if (d->reason == Reason::account_locked && both && !src->second->locked && !dst->second->locked) {
      fail("transfer " + r.id + " canceled for a locked account, but neither is locked");
    } else if (d->reason == Reason::canceled_by_operator && operator_touched_.count(r.id) == 0) {
      fail("transfer " + r.id + " canceled by an operator who never asked");
    }
    if (expect_canceled_.count(r.id) != 0 && d->state != TransferState::canceled) {
      fail("the operator was told " + r.id + " is canceled, but it is " + std::string(to_string(d->state)));
    }
    if (expect_done_.count(r.id) != 0 && d->state != TransferState::done) {
      fail("the operator was told " + r.id + " applied, but it is " + std::string(to_string(d->state)));
    }
    // Dead letters: every message with another payload than the standing
    // one is a conflict; the others never are.
    for (const Partition& part : partitions_) {
      for (const Message& m : part.log) {
        if (m.request != static_cast<int>(i)) continue;
        const bool conflict = m.variant != standing;
        const bool lettered = dead[&m].count("conflict/conflict") != 0;
        if (conflict != lettered) {
          fail("message " + std::to_string(m.partition) + "/" + std::to_string(m.offset) + " (" + r.id +
               (conflict ? ") conflicts but was not dead-lettered" : ") was dead-lettered as a conflict"));
        }
        expect_answer(m, conflict ? r.id + " conflict/conflict" : "");
      }
    }
  }
  for (const auto& [id, list] : published) {
    if (valid_ids.count(id) == 0) fail("an outcome was published for " + id + ", which nobody requested");
  }
  std::size_t transfers = 0;
  if (Status st = L.transfers().scan_transfer_states([&](std::string_view id, TransferState, bool) {
        ++transfers;
        if (valid_ids.count(std::string(id)) == 0) fail("a transfer exists that nobody requested: " + std::string(id));
      });
      !st) {
    fail(st.message());
  }
  for (const Partition& part : partitions_) {
    for (const Message& m : part.log) {
      if (m.deliveries == 0) fail("message " + std::to_string(m.partition) + "/" + std::to_string(m.offset) + " never consumed");
      if (m.request >= 0) continue;
      if (dead[&m].count("invalid/" + m.invalid_code) == 0) {
        fail("invalid message " + std::to_string(m.partition) + "/" + std::to_string(m.offset) +
             " was not dead-lettered with saga.error " + m.invalid_code);
      }
      expect_answer(m, m.readable_id.empty() ? "" : m.readable_id + " invalid/" + m.invalid_code);
    }
  }
  stats_["dead letters"] += static_cast<std::int64_t>(dead_letters_.size());
  stats_["outcome messages"] += static_cast<std::int64_t>(outcomes_.size());
  stats_["rejected outcomes"] += static_cast<std::int64_t>(rejections_.size());
}

// What the workers' probe counted (saga-worker's metrics).
void World::collect_probe_stats() {
  for (const prometheus::MetricFamily& family : registry_.Collect()) {
    for (const prometheus::ClientMetric& m : family.metric) {
      const auto value = static_cast<std::int64_t>(m.counter.value);
      if (family.name == "saga_stage_transitions_total") {
        stats_["engine transitions"] += value;
      } else if (family.name == "saga_compensations_total") {
        stats_["compensations"] += value;
      } else if (family.name == "saga_store_errors_total") {
        stats_["store errors seen by the workers"] += value;
      } else if (family.name == "saga_recoveries_total") {
        const bool terminal = !m.label.empty() && (m.label[0].value == "done" || m.label[0].value == "canceled");
        stats_[terminal ? "outcomes republished by recovery" : "transfers resumed by recovery"] += value;
      }
    }
  }
}

SimResult World::run() {
  draw_config();
  clock_ = std::make_shared<ManualClock>(kStartMs);
  std::vector<std::unique_ptr<Store>> plain;
  for (std::size_t s = 0; s < shards_; ++s) {
    MemoryOptions o;
    o.name = "shard" + std::to_string(s);
    o.scopes = scopes_;
    o.prepare = prepare_;
    dbs_.push_back(make_memory_db(clock_, o));
    plain.push_back(connect(dbs_.back()));
  }
  check_ledger_ = Ledger::from_stores(std::move(plain));
  create_accounts();
  create_messages();
  for (std::size_t i = 0; i < worker_count_; ++i) {
    workers_.push_back(std::make_unique<Actor>(*this, static_cast<int>(i), false));
    open(*workers_.back());
  }
  operator_ = std::make_unique<Actor>(*this, -1, true);
  open(*operator_);
  rebalance();
  trace("config: ", config_);
  for (const Account& a : accounts_) {
    trace("account ", a.id, ": balance ", a.balance, ", min ", a.min_balance, a.locked ? ", locked" : "",
          a.currency.empty() ? "" : ", " + a.currency);
  }

  for (step_no_ = 1; step_no_ <= steps_ && failure_.empty(); ++step_no_) {
    step();
    if (step_no_ % 40 == 0 && failure_.empty()) audit("during the run");
  }
  if (failure_.empty()) settle();
  if (failure_.empty()) final_checks();
  collect_probe_stats();
  ++stats_["seeds"];
  SimResult r;
  r.ok = failure_.empty();
  r.config = config_;
  r.failure = failure_;
  r.stats = stats_;
  return r;
}

}  // namespace

SimResult run_simulation(std::uint64_t seed, const SimOptions& options) {
  World world(seed, options);
  return world.run();
}

}  // namespace sagapool::sim
