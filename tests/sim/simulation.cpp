// One simulated run: set-up drawn from the seed, a random walk of actions
// with faults injected around every store call, a quiet phase that lets the
// pool finish, then every check. See simulation.hpp and docs/RELIABILITY.md.
//
// The simulated workers mirror saga-worker (workers/src/worker.cpp) step by
// step: ingest (validate, dead-letter, insert, run the batch, one scope on a
// single store that supports it), publish outcomes with an outbox flag,
// store offsets after the batch is durable, recover expired leases. They
// run the real SagaEngine; the operator runs the real cancel_transfer and
// retry_transfer. Only Kafka and the store are simulated.
#include "simulation.hpp"

#include <algorithm>
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
#include "sagapool/request.hpp"
#include "sagapool/saga_engine.hpp"

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
constexpr std::string_view kRequestsTopic = "transfers.requests";
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
  int deliveries = 0;
};

struct Outcome {
  std::string id;
  TransferState state = TransferState::initial;
  Reason reason = Reason::none;
  std::string from;
  std::string to;
  std::int64_t amount = 0;
  bool operator==(const Outcome&) const = default;
};

struct DeadLetter {
  const Message* message = nullptr;
  std::string reason;
  std::string code;
};

struct Partition {
  std::vector<Message> log;
  std::size_t visible = 0;   // produced so far
  std::int64_t committed = 0;
  int owner = -1;            // worker index, -1: unassigned
};

class World;

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
  int faults_suppressed = 0;
  int restart_in = 0;  // steps until a dead worker restarts
  std::unique_ptr<Ledger> ledger;
  std::unique_ptr<SagaEngine> engine;
  // Kafka: fetch position and stored (not yet committed) offset per owned partition.
  std::map<int, std::int64_t> position;
  std::map<int, std::int64_t> stored;
  std::vector<Outcome> outbox;         // produced, not yet delivered
  std::vector<std::string> notified;   // delivered, not yet marked in the store
  // The batch in flight (ingest or recovery).
  std::vector<SagaItem> items;
  std::vector<const Message*> batch;
  std::vector<NewTransfer> news;
  std::vector<std::size_t> new_message;
  std::vector<InsertResult> inserted;
  std::vector<TransferDoc> claimed;
};

class CountingObserver final : public SagaObserver {
 public:
  explicit CountingObserver(SimStats& stats) : stats_(stats) {}
  void on_transitions(TransferState, TransferState, std::size_t count) override {
    stats_["engine transitions"] += static_cast<std::int64_t>(count);
  }
  void on_compensation(Reason) override { ++stats_["compensations"]; }
  void on_stage(std::string_view, std::chrono::nanoseconds) override {}
  void on_store_error(std::string_view, const Status&) override { ++stats_["store errors seen by the engine"]; }

 private:
  SimStats& stats_;
};

class World {
 public:
  World(std::uint64_t seed, const SimOptions& options)
      : seed_(seed), options_(options), rng_(seed ^ 0x5a6a'9001'c0ff'eeULL), observer_(stats_) {}

  SimResult run();
  Status on_call(Actor& a, std::string_view op, Phase phase, bool in_scope);

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
  void kill(Actor& a, const std::string& why);
  void restart(Actor& a);
  void rebalance();
  void step();
  void nested_step(Actor& paused);
  void interlude(Actor& a, bool past_lease);
  void ingest(Actor& w);
  Status write_batch(Actor& w);
  Status mark_notified(Actor& w);
  Status mark_notified_in_store(Actor& w);
  void recover(Actor& w);
  void publish_finished(Actor& w);
  void poll(Actor& w);
  void commit_offsets(Actor& w);
  void operator_cancel(const std::string& id);
  void operator_retry(const std::string& id);
  void operator_create_account();
  void produce_more();
  void settle();

  // ---- checks ----
  void audit(const char* when);
  void final_checks();
  void fail(const std::string& what);
  template <typename... Args>
  void trace(const Args&... args);

  Actor& worker(std::size_t i) { return *workers_[i]; }
  std::vector<Actor*> live_workers(bool include_busy = false);
  std::string random_request_id();
  std::int64_t now() { return clock_->now_ms(); }
  std::int64_t backoff_ms(int attempt) { return std::min<std::int64_t>(5000, 50LL << std::min(attempt, 7)); }

  std::uint64_t seed_;
  SimOptions options_;
  Rng rng_;
  SimStats stats_;
  CountingObserver observer_;
  std::string config_;
  std::string failure_;

  // Configuration drawn from the seed.
  std::size_t shards_ = 1;
  bool scopes_ = true;
  std::size_t worker_count_ = 2;
  std::int64_t lease_ms_ = 5000;
  std::size_t batch_size_ = 8;
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

  // What the simulated Kafka topics received.
  std::vector<Outcome> outcomes_;
  std::vector<DeadLetter> dead_letters_;
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

Status Actor::on_call(std::string_view op, Phase phase, bool in_scope) {
  return world.on_call(*this, op, phase, in_scope);
}

// ---- set-up -------------------------------------------------------------------

// Requests name these accounts, which do not exist at the start; the
// operator creates some during the run.
constexpr std::size_t kGhostAccounts = 3;
std::string ghost_id(std::size_t k) { return "ghost-" + std::to_string(k); }

void World::draw_config() {
  const std::size_t mode = rng_.below(3);
  shards_ = mode == 2 ? 2 : 1;
  scopes_ = mode == 0;
  worker_count_ = 2 + rng_.below(3);
  const std::int64_t leases[] = {2'000, 5'000, 30'000};
  lease_ms_ = leases[rng_.below(3)];
  batch_size_ = 1 + rng_.below(12);
  fault_rate_ = 150 + rng_.below(600);  // 1.5 % .. 7.5 % of store calls
  steps_ = 200 + rng_.below(500);
  retry_call_budget_ = rng_.per_mille(300) ? 1 : 0;  // each costs the engine a real 10 ms backoff
  const char* modes[] = {"one store with scopes (SQLite-like)", "one store without scopes (PostgreSQL-like)",
                         "two shards"};
  std::ostringstream c;
  c << modes[mode] << ", " << worker_count_ << " workers, lease " << lease_ms_ << "ms, batch "
    << batch_size_ << ", faults on " << static_cast<double>(fault_rate_) / 100.0 << "% of store calls, " << steps_ << " steps";
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
    all.push_back(m);
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
    a.engine = std::make_unique<SagaEngine>(*a.ledger, SagaEngine::Options{a.owner, lease_ms_, 5}, &observer_);
  }
  a.alive = true;
}

// ---- fault injection ------------------------------------------------------------

Status World::on_call(Actor& a, std::string_view op, Phase phase, bool in_scope) {
  if (quiet_ || a.faults_suppressed > 0 || op == "rollback" || !failure_.empty()) return Status::ok();
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
  const bool can_interleave = depth_ == 0 && !in_scope && !a.paused;
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
  std::vector<std::pair<std::string, std::int64_t>> held;
  for (const SagaItem& it : a.items) {
    if (!it.dropped && !is_terminal(it.state)) held.emplace_back(it.id, it.epoch);
  }
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

void World::kill(Actor& a, const std::string& why) {
  trace(a.owner, " dies: ", why);
  a.engine.reset();
  a.ledger.reset();  // drops its connections: an open scope rolls back
  a.outbox.clear();
  a.notified.clear();
  a.items.clear();
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
  for (Partition& p : partitions_) {
    p.visible = std::min(p.log.size(), p.visible + rng_.below(batch_size_ * 2 + 2));
  }
}

void World::poll(Actor& w) {
  for (Outcome& o : w.outbox) {
    if (!quiet_ && rng_.per_mille(20)) {  // delivery failed: recovery publishes it again
      ++stats_["outcome deliveries failed"];
      continue;
    }
    w.notified.push_back(o.id);
    outcomes_.push_back(std::move(o));
  }
  w.outbox.clear();
}

void World::publish_finished(Actor& w) {
  for (const SagaItem& it : w.items) {
    if (it.dropped || !is_terminal(it.state)) continue;
    w.outbox.push_back({it.id, it.state, it.reason, it.source, it.destination, it.amount});
  }
}

Status World::mark_notified_in_store(Actor& w) {
  std::vector<std::string_view> views(w.notified.begin(), w.notified.end());
  return w.ledger->transfers().mark_notified(views);
}

// Worker::mark_notified: in its own transaction; a transient failure leaves
// the outcomes to be published again after their lease.
Status World::mark_notified(Actor& w) {
  if (w.notified.empty()) return Status::ok();
  Status s = mark_notified_in_store(w);
  if (!s && s.kind() == ErrorKind::fatal) return s;
  w.notified.clear();
  return Status::ok();
}

// Worker::write_batch.
Status World::write_batch(Actor& w) {
  Store& transfers = w.ledger->transfers();
  const bool scoped = w.ledger->shard_count() == 1 && transfers.supports_scope();
  w.items.clear();
  if (scoped) {
    if (Status s = transfers.begin_scope(); !s) return s;
  }
  auto failed = [&](Status s) {
    if (scoped) transfers.end_scope(false).ignore();
    return s;
  };
  if (scoped && !w.notified.empty()) {
    if (Status s = mark_notified_in_store(w); !s) return failed(s);
  }
  w.inserted.resize(w.news.size());
  if (!w.news.empty()) {
    if (Status s = transfers.insert_transfers(w.news, w.owner, lease_ms_, w.inserted); !s) return failed(s);
  }
  for (std::size_t i = 0; i < w.news.size(); ++i) {
    if (w.inserted[i] != InsertResult::inserted) continue;
    const RequestView& r = w.news[i].request;
    SagaItem& it = w.items.emplace_back();
    it.id.assign(r.id);
    it.source.assign(r.from);
    it.destination.assign(r.to);
    it.currency.assign(r.currency);
    it.amount = r.amount;
    it.epoch = 1;
    it.requested_at_ms = w.news[i].requested_at_ms;
    it.state = TransferState::initial;
    it.fresh = scoped;
  }
  if (!scoped) {
    if (Status s = w.engine->run(w.items); !s) return s;
    return mark_notified(w);
  }
  if (Status s = w.engine->run_in_scope(w.items); !s) return failed(s);
  if (Status s = transfers.end_scope(true); !s) return failed(s);
  return Status::ok();
}

// Worker::ingest_batch for one fetched batch of one partition.
void World::ingest(Actor& w) {
  std::vector<int> ready;
  for (const auto& [p, pos] : w.position) {
    if (static_cast<std::size_t>(pos) < partitions_[static_cast<std::size_t>(p)].visible) ready.push_back(p);
  }
  if (ready.empty()) return;
  const int p = rng_.pick(ready);
  Partition& part = partitions_[static_cast<std::size_t>(p)];
  const std::int64_t from = w.position[p];
  const std::size_t n = std::min(batch_size_, part.visible - static_cast<std::size_t>(from));
  const std::int64_t end = from + static_cast<std::int64_t>(n);
  w.position[p] = end;
  ++stats_["batches ingested"];
  w.batch.clear();
  w.news.clear();
  w.new_message.clear();
  for (std::size_t k = 0; k < n; ++k) {
    Message& m = part.log[static_cast<std::size_t>(from) + k];
    if (++m.deliveries > 1) ++stats_["messages redelivered"];
    ++stats_["messages delivered"];
    w.batch.push_back(&m);
    NewTransfer t;
    const RequestError e = parse_request(m.value, t.request);
    if (e != RequestError::ok) {
      dead_letters_.push_back({&m, "invalid", std::string(error_code(e))});
      continue;
    }
    t.payload_hash = payload_hash(t.request);
    t.requested_at_ms = now();
    t.origin_topic = kRequestsTopic;
    t.origin_partition = p;
    t.origin_offset = m.offset;
    w.news.push_back(t);
    w.new_message.push_back(k);
    trace("  ", t.request.id, ": ", t.request.from, " -> ", t.request.to, " ", t.request.amount,
          " (", p, "/", m.offset, ")");
  }
  w.inserted.assign(w.news.size(), InsertResult::duplicate);
  // The store may fail: keep the batch and retry (the real worker retries
  // until it succeeds); after a few attempts the simulated store "comes back".
  int attempt = 0;
  for (;; ++attempt) {
    if (attempt == 4) ++w.faults_suppressed;
    Status s = write_batch(w);
    if (s) break;
    if (s.kind() == ErrorKind::fatal || attempt == 50) {
      if (attempt >= 4) --w.faults_suppressed;
      fail("store error during ingest by " + w.owner + " (attempt " + std::to_string(attempt + 1) +
           "): " + s.message());
      return;
    }
    ++stats_["ingest retries"];
    clock_->advance(backoff_ms(attempt));
  }
  if (attempt >= 4) --w.faults_suppressed;
  w.notified.clear();
  for (std::size_t i = 0; i < w.news.size(); ++i) {
    if (w.inserted[i] != InsertResult::conflict) continue;
    dead_letters_.push_back({w.batch[w.new_message[i]], "conflict", "conflict"});
  }
  publish_finished(w);
  // Dead letters are delivered at once here; store the batch's offsets if
  // the partition is still ours (a zombie's were revoked).
  if (part.owner == w.index) w.stored[p] = std::max(w.stored[p], end);
  else ++stats_["offsets not stored (partition revoked meanwhile)"];
}

// Worker::recover.
void World::recover(Actor& w) {
  for (int round = 0; round < 8; ++round) {
    Status s = w.ledger->transfers().claim_expired(w.owner, lease_ms_, batch_size_, w.claimed);
    if (!s) {
      if (s.kind() == ErrorKind::fatal) fail("fatal store error in recovery by " + w.owner + ": " + s.message());
      return;
    }
    if (w.claimed.empty()) break;
    stats_["transfers claimed by recovery"] += static_cast<std::int64_t>(w.claimed.size());
    w.items.clear();
    for (const TransferDoc& d : w.claimed) {
      if (is_terminal(d.state)) {
        ++stats_["outcomes republished by recovery"];
        w.outbox.push_back({d.id, d.state, d.reason, d.source, d.destination, d.amount});
      } else {
        w.items.emplace_back().assign(d);
      }
    }
    if (Status r = w.engine->run(w.items); !r) {
      fail("fatal error from the engine in recovery by " + w.owner + ": " + r.message());
      return;
    }
    publish_finished(w);
    if (w.claimed.size() < batch_size_) break;
  }
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
    Actor& w = *rng_.pick(live);
    act(w, "ingests", [&] {
      poll(w);
      ingest(w);
    });
  } else if (dice < 600) {
    Actor& w = *rng_.pick(live);
    act(w, "recovers", [&] {
      poll(w);
      recover(w);
    });
  } else if (dice < 680) {
    Actor& w = *rng_.pick(live);
    act(w, "idles", [&] {
      poll(w);
      if (Status s = mark_notified(w); !s) fail(s.message());
    });
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
  } else if (dice < 975) {
    Actor& w = *rng_.pick(live);
    ++stats_["crashes"];
    ++stats_["crash site between batches (SIGKILL)"];
    kill(w, "killed between batches");
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
    Actor& w = *rng_.pick(live);
    act(w, "recovers (during a pause)", [&] {
      poll(w);
      recover(w);
    });
  } else if (dice < 85) {
    Actor& w = *rng_.pick(live);
    act(w, "ingests (during a pause)", [&] {
      poll(w);
      ingest(w);
    });
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
  for (Partition& p : partitions_) p.visible = p.log.size();
  for (int round = 0; round < kMaxRoundsToSettle && failure_.empty(); ++round) {
    for (auto& w : workers_) {
      act(*w, "drains", [&] {
        poll(*w);
        if (Status s = mark_notified(*w); !s) fail(s.message());
        for (int guard = 0; guard < 10'000; ++guard) {
          bool more = false;
          for (const auto& [p, pos] : w->position) {
            more |= static_cast<std::size_t>(pos) < partitions_[static_cast<std::size_t>(p)].visible;
          }
          if (!more) break;
          ingest(*w);
          poll(*w);
        }
      });
      commit_offsets(*w);
    }
    clock_->advance(std::max(lease_ms_, kOperatorLeaseMs) + 1);
    for (auto& w : workers_) {
      act(*w, "recovers", [&] {
        recover(*w);
        poll(*w);
        if (Status s = mark_notified(*w); !s) fail(s.message());
      });
    }
    bool open = false;
    for (const Partition& p : partitions_) open |= p.committed != static_cast<std::int64_t>(p.log.size());
    for (auto& w : workers_) open |= !w->outbox.empty() || !w->notified.empty();
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
  std::map<std::string, std::vector<const Outcome*>> published;
  for (const Outcome& o : outcomes_) published[o.id].push_back(&o);
  std::map<const Message*, std::set<std::string>> dead;
  for (const DeadLetter& d : dead_letters_) dead[d.message].insert(d.reason + "/" + d.code);
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
    const Outcome expected{d->id, d->state, d->reason, d->source, d->destination, d->amount};
    const auto pub = published.find(r.id);
    if (pub == published.end()) {
      fail("transfer " + r.id + " finished " + std::string(to_string(d->state)) + " but no outcome was published");
    } else {
      stats_["outcome messages published more than once"] += static_cast<std::int64_t>(pub->second.size() - 1);
      for (const Outcome* o : pub->second) {
        if (!(*o == expected)) {
          fail("transfer " + r.id + ": a published outcome (" + std::string(to_string(o->state)) + "/" +
               std::string(to_string(o->reason)) + ") differs from the ledger's (" +
               std::string(to_string(d->state)) + "/" + std::string(to_string(d->reason)) + ")");
        }
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
    }
  }
  stats_["dead letters"] += static_cast<std::int64_t>(dead_letters_.size());
  stats_["outcome messages"] += static_cast<std::int64_t>(outcomes_.size());
}

SimResult World::run() {
  draw_config();
  clock_ = std::make_shared<ManualClock>(kStartMs);
  std::vector<std::unique_ptr<Store>> plain;
  for (std::size_t s = 0; s < shards_; ++s) {
    MemoryOptions o;
    o.name = "shard" + std::to_string(s);
    o.scopes = scopes_;
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
