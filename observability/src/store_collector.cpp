#include "sagapool/store_collector.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>

#include "sagapool/two_phase.hpp"

namespace sagapool {
namespace {

using namespace std::chrono_literals;

constexpr TransferState kUnfinished[] = {TransferState::initial, TransferState::pending,
                                         TransferState::applied, TransferState::canceling};

// A failed store call is logged at most this often per path; every failure
// is counted in saga_store_errors_total.
constexpr auto kErrorLogEvery = 60s;
// Readings that do not settle are retried this many times before waiting a
// full interval again.
constexpr int kUnsettledRetries = 3;
// The published imbalance is dropped when no reading has confirmed it for
// this long (or 5 intervals, if longer): better no value than an old one.
constexpr auto kImbalanceExpiry = 5min;
// The store gauges' TTL grows with the pool up to this many stats_ttl (10 s
// by default): the alert rules wait minutes, a dashboard no longer than that.
constexpr std::size_t kPoolShareMax = 10;

prometheus::MetricFamily gauge_family(const char* name, const char* help) {
  prometheus::MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = prometheus::MetricType::Gauge;
  return f;
}

void add_gauge(prometheus::MetricFamily& f, std::string_view label_value, double value,
               const char* label = "state") {
  prometheus::ClientMetric& m = f.metric.emplace_back();
  if (!label_value.empty()) m.label.push_back({label, std::string(label_value)});
  m.gauge.value = value;
}

constexpr std::uint8_t kind_bit(PostingKind k) {
  return static_cast<std::uint8_t>(1u << static_cast<unsigned>(k));
}

}  // namespace

struct StoreCollector::InFlight {
  struct Entry {
    std::string id;
    std::string source;
    std::string destination;
    std::int64_t net = 0;     // signed sum of its postings, all shards
    std::uint8_t kinds = 0;   // which postings exist
  };
  std::vector<Entry> entries;  // sorted by id
  bool too_many = false;
};

StoreCollector::StoreCollector(StoreCollectorOptions options, WorkerProbe& probe)
    : options_(std::move(options)), probe_(probe), imbalance_every_(options_.imbalance_interval) {}

Status StoreCollector::open(StoreCollectorOptions options, WorkerProbe& probe,
                            std::shared_ptr<StoreCollector>& out) {
  auto c = std::shared_ptr<StoreCollector>(new StoreCollector(std::move(options), probe));
  if (Status s = Ledger::open(c->options_.store_urls, c->ledger_); !s) return s;
  c->imb_thread_ = std::thread([raw = c.get()] { raw->imbalance_loop(); });
  out = std::move(c);
  return Status::ok();
}

StoreCollector::~StoreCollector() {
  {
    std::lock_guard lock(imb_mu_);
    stopping_ = true;
  }
  // A reading in progress stops at its next step; reading one shard's
  // accounts cannot be interrupted.
  halt_.store(true);
  imb_cv_.notify_all();
  if (imb_thread_.joinable()) imb_thread_.join();
}

// ---- scrape path ------------------------------------------------------------

void StoreCollector::note_error_locked(const char* op, const Status& s, Clock::time_point now) const {
  probe_.count_store_error(op);
  if (last_error_log_ == Clock::time_point{} || now - last_error_log_ >= kErrorLogEvery) {
    last_error_log_ = now;
    spdlog::warn("metrics: store call {} failed: {} (store gauges not exported meanwhile)", op,
                 s.message());
  }
}

void StoreCollector::refresh_stats_locked(Clock::time_point now) const {
  if (stats_.asked != Clock::time_point{} && now - stats_.asked < stats_.ttl) return;
  StateStatsTable table{};
  const Status s = ledger_->transfers().state_stats(table);
  // Batches across stores left prepared, on every store that can prepare.
  // A store that does not answer loses its own series only: the first
  // store's gauges matter most while another store is out.
  stats_.prepared.clear();
  for (std::size_t i = 0; i < ledger_->shard_count(); ++i) {
    Store& store = ledger_->shard(i);
    if (!store.supports_prepare()) continue;
    PreparedStats p;
    if (const Status ps = store.prepared_stats(kBatchGidPrefix, p); !ps) {
      note_error_locked("stats", ps, Clock::now());
      continue;
    }
    stats_.prepared.emplace_back(i, p);
  }
  const auto done = Clock::now();
  stats_.asked = done;
  // Under a backlog the query walks many unfinished transfers (15-30 ms at
  // full load, bench/REPORT.md, "The thirty-eighth session"): with each
  // worker asking once a stats_ttl, the server's cost grew with the pool.
  const std::size_t pool =
      options_.pool_size != nullptr ? options_.pool_size->load(std::memory_order_relaxed) : 1;
  const auto share = options_.stats_ttl * static_cast<long>(std::clamp<std::size_t>(pool, 1, kPoolShareMax));
  stats_.ttl = std::max<Clock::duration>(share, 10 * (done - now));
  if (!s) {
    stats_.valid = false;
    note_error_locked("stats", s, done);
    return;
  }
  stats_.valid = true;
  stats_.table = table;
  last_answer_ = done;
}

std::vector<prometheus::MetricFamily> StoreCollector::Collect() const {
  std::vector<prometheus::MetricFamily> out;
  const auto now = Clock::now();
  {
    std::lock_guard lock(mu_);
    refresh_stats_locked(now);
    if (stats_.valid) {
      auto count = gauge_family("saga_transfers",
                                "Transfers in the store per non-terminal state (terminal states "
                                "are not counted: see saga_transfers_finished_total)");
      auto oldest = gauge_family("saga_oldest_transfer_timestamp_seconds",
                                 "Creation time (Unix seconds) of the oldest transfer per "
                                 "non-terminal state; 0 when there is none");
      auto stuck = gauge_family("saga_stuck_transfers",
                                "Non-terminal transfers whose lease has expired (waiting for "
                                "recovery), per state");
      for (TransferState state : kUnfinished) {
        const StateStats& st = stats_.table[static_cast<std::size_t>(state)];
        const std::string_view name = to_string(state);
        add_gauge(count, name, static_cast<double>(st.count));
        add_gauge(oldest, name, st.count > 0 ? static_cast<double>(st.oldest_ms) / 1000.0 : 0.0);
        add_gauge(stuck, name, static_cast<double>(st.stuck));
      }
      // The outbox: an outage of outcome publishing shows here, and only here.
      auto unpublished = gauge_family("saga_unpublished_outcomes",
                                      "Finished transfers whose outcome is not yet published, per "
                                      "terminal state");
      auto unpublished_oldest = gauge_family(
          "saga_oldest_unpublished_outcome_timestamp_seconds",
          "Finish time (Unix seconds) of the oldest transfer whose outcome is not yet published, "
          "per terminal state; 0 when there is none");
      for (TransferState state : {TransferState::done, TransferState::canceled}) {
        const StateStats& st = stats_.table[static_cast<std::size_t>(state)];
        const std::string_view name = to_string(state);
        add_gauge(unpublished, name, static_cast<double>(st.count));
        add_gauge(unpublished_oldest, name, st.count > 0 ? static_cast<double>(st.oldest_ms) / 1000.0 : 0.0);
      }
      out.push_back(std::move(count));
      out.push_back(std::move(oldest));
      out.push_back(std::move(stuck));
      out.push_back(std::move(unpublished));
      out.push_back(std::move(unpublished_oldest));
    }
    if (!stats_.prepared.empty()) {
      auto prepared = gauge_family("saga_prepared_batches",
                                   "Transactions of batches across stores prepared on this store "
                                   "and not yet committed or rolled back, per store");
      auto prepared_oldest = gauge_family(
          "saga_oldest_prepared_batch_timestamp_seconds",
          "When (Unix seconds) the oldest transaction of a batch across stores still prepared "
          "on this store was prepared, per store; 0 when there is none");
      for (const auto& [shard, p] : stats_.prepared) {
        const std::string name = std::to_string(shard);
        add_gauge(prepared, name, static_cast<double>(p.count), "shard");
        add_gauge(prepared_oldest, name, p.count > 0 ? static_cast<double>(p.oldest_ms) / 1000.0 : 0.0,
                  "shard");
      }
      out.push_back(std::move(prepared));
      out.push_back(std::move(prepared_oldest));
    }
  }
  std::lock_guard lock(imb_mu_);
  const bool fresh = imbalance_ && now - imbalance_at_ < imbalance_every_;
  if (!fresh && !wanted_) {
    wanted_ = true;
    imb_cv_.notify_one();
  }
  const auto expiry = std::max<Clock::duration>(kImbalanceExpiry, 5 * imbalance_every_);
  if (imbalance_ && now - imbalance_at_ < expiry) {
    auto f = gauge_family("saga_ledger_imbalance",
                          "Sum of balances minus opening balances minus in-flight legs, in "
                          "minor units; 0 when money is conserved");
    add_gauge(f, {}, *imbalance_);
    out.push_back(std::move(f));
  }
  return out;
}

bool StoreCollector::store_reachable(std::string& detail) {
  std::lock_guard lock(mu_);
  const auto now = Clock::now();
  if (last_answer_ != Clock::time_point{} && now - last_answer_ <= options_.ready_window) return true;
  // Every shard: a worker whose batches touch an unreachable shard makes no
  // progress on them, so it is not ready.
  for (std::size_t i = 0; i < ledger_->shard_count(); ++i) {
    Store& store = ledger_->shard(i);
    std::int64_t store_ms = 0;
    if (const Status s = store.now_ms(store_ms); !s) {
      note_error_locked("ping", s, now);
      detail = "store " + store.display_name() + " does not answer: " + s.message();
      return false;
    }
  }
  last_answer_ = Clock::now();
  return true;
}

// ---- imbalance ----------------------------------------------------------------

void StoreCollector::imbalance_loop() {
  std::unique_ptr<Ledger> ledger;  // opened on first use, kept
  std::optional<Wide> previous;    // the last self-consistent reading
  int unsettled = 0;
  Clock::time_point not_before{};
  Clock::time_point last_log{};
  std::unique_lock lock(imb_mu_);
  for (;;) {
    imb_cv_.wait(lock, [&] { return stopping_ || wanted_; });
    if (stopping_) return;
    if (Clock::now() < not_before) {
      imb_cv_.wait_until(lock, not_before, [&] { return stopping_; });
      continue;
    }
    wanted_ = false;
    lock.unlock();

    const auto started = Clock::now();
    Status error;
    std::optional<Wide> reading;
    if (!ledger) error = Ledger::open(options_.store_urls, ledger);
    if (ledger) reading = read_imbalance(*ledger, error);
    const auto finished = Clock::now();
    const auto took = finished - started;
    if (!error && !halt_.load()) {
      probe_.count_store_error("imbalance");
      if (last_log == Clock::time_point{} || finished - last_log >= kErrorLogEvery) {
        last_log = finished;
        spdlog::warn("metrics: ledger imbalance reading failed: {}", error.message());
      }
    }

    lock.lock();
    imbalance_every_ = std::max<Clock::duration>(options_.imbalance_interval, 20 * took);
    if (reading && previous && *reading == *previous) {
      imbalance_ = static_cast<double>(*reading);
      imbalance_at_ = finished;
      unsettled = 0;
      not_before = finished + imbalance_every_;
    } else if (++unsettled <= kUnsettledRetries) {
      wanted_ = true;  // try again soon, without waiting for a scrape
      not_before = finished + std::max<Clock::duration>(1s, 10 * took);
    } else {
      unsettled = 0;
      not_before = finished + imbalance_every_;
    }
    previous = reading;
  }
}

Status StoreCollector::net_of(Ledger& ledger, const TransferDoc& t, std::vector<Posting>& scratch,
                              std::int64_t& net, std::uint8_t& kinds) {
  // A transfer's postings live on the shards of its two accounts.
  net = 0;
  kinds = 0;
  auto add = [&](std::size_t shard) {
    if (Status s = ledger.shard(shard).postings_for_transfer(t.id, scratch); !s) return s;
    for (const Posting& p : scratch) {
      net += signed_amount(p.kind, p.amount);
      kinds = static_cast<std::uint8_t>(kinds | kind_bit(p.kind));
    }
    return Status::ok();
  };
  const std::size_t from = ledger.shard_index(t.source);
  const std::size_t to = ledger.shard_index(t.destination);
  if (Status s = add(from); !s) return s;
  if (to != from) return add(to);
  return Status::ok();
}

Status StoreCollector::read_in_flight(Ledger& ledger, InFlight& out) {
  out = InFlight{};
  std::vector<TransferDoc> docs;
  const std::size_t limit = options_.imbalance_max_in_flight;
  if (Status s = ledger.transfers().list_stale(std::numeric_limits<std::int64_t>::max(), limit + 1, docs);
      !s) {
    return s;
  }
  if (docs.size() > limit) {
    out.too_many = true;
    return Status::ok();
  }
  std::vector<Posting> scratch;
  out.entries.reserve(docs.size());
  for (TransferDoc& d : docs) {
    if (halt_.load(std::memory_order_relaxed)) return Status::retry_call("stopping");
    InFlight::Entry& e = out.entries.emplace_back();
    if (Status s = net_of(ledger, d, scratch, e.net, e.kinds); !s) return s;
    e.id = std::move(d.id);
    e.source = std::move(d.source);
    e.destination = std::move(d.destination);
  }
  std::sort(out.entries.begin(), out.entries.end(),
            [](const InFlight::Entry& x, const InFlight::Entry& y) { return x.id < y.id; });
  return Status::ok();
}

std::optional<Wide> StoreCollector::read_imbalance(Ledger& ledger, Status& error) {
  // Conserved ledger: sum(balance - opening) == the postings of unfinished
  // transfers (a finished one nets to 0). The unfinished transfers and their
  // postings are read before and after the accounts; the reading counts only
  // if no posting of theirs appeared in between (postings are never
  // deleted, so equal before and after means equal while the accounts were
  // read). A transfer born and finished inside the window is invisible
  // here: two consecutive readings must agree before a value is published.
  InFlight before;
  InFlight after;
  if (error = read_in_flight(ledger, before); !error) return std::nullopt;
  if (before.too_many) return std::nullopt;
  Wide sum = 0;
  for (std::size_t shard = 0; shard < ledger.shard_count(); ++shard) {
    if (halt_.load(std::memory_order_relaxed)) return std::nullopt;
    error = ledger.shard(shard).scan_accounts(
        [&](const Account& a) { sum += static_cast<Wide>(a.balance) - a.opening_balance; });
    if (!error) return std::nullopt;
  }
  if (error = read_in_flight(ledger, after); !error) return std::nullopt;
  if (after.too_many) return std::nullopt;

  Wide in_flight = 0;
  std::vector<Posting> scratch;
  auto b = before.entries.begin();
  auto a = after.entries.begin();
  while (b != before.entries.end() || a != after.entries.end()) {
    if (a == after.entries.end() || (b != before.entries.end() && b->id < a->id)) {
      // Finished since the first read: its postings must not have moved.
      TransferDoc d;
      d.id = b->id;
      d.source = b->source;
      d.destination = b->destination;
      std::int64_t net = 0;
      std::uint8_t kinds = 0;
      if (error = net_of(ledger, d, scratch, net, kinds); !error) return std::nullopt;
      if (kinds != b->kinds) return std::nullopt;
      in_flight += b->net;
      ++b;
    } else if (b == before.entries.end() || a->id < b->id) {
      // Started since the first read: it must not have posted anything yet.
      if (a->kinds != 0) return std::nullopt;
      ++a;
    } else {
      if (a->kinds != b->kinds) return std::nullopt;
      in_flight += b->net;
      ++a;
      ++b;
    }
  }
  return sum - in_flight;
}

}  // namespace sagapool
