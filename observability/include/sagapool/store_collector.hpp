#pragma once
// The store-derived gauges of DESIGN.md ("Metrics"), produced at scrape
// time (a prometheus::Collectable) from the collector's own connections: a
// Store is single-threaded and the worker's loop keeps its own.
//
// - saga_transfers, saga_oldest_transfer_timestamp_seconds and
//   saga_stuck_transfers, per non-terminal state, and
//   saga_unpublished_outcomes and
//   saga_oldest_unpublished_outcome_timestamp_seconds, per terminal state:
//   one Store::state_stats query (indexed, reads unfinished or unpublished
//   transfers only); and saga_prepared_batches and
//   saga_oldest_prepared_batch_timestamp_seconds, per store that can
//   prepare (one read of its prepared transactions each). Cached together for
//   max(stats_ttl x the workers sharing the store (at most 10), 10 x their
//   last duration), so scrapes and readiness probes cost each store at most
//   one such query per TTL, and a pool about one per stats_ttl whatever its
//   size: every worker reports the same store, and the alert rules take the
//   pool's max.
// - saga_ledger_imbalance: needs every account, so it is never read on the
//   scrape path. A background thread takes a reading when scrapes ask for a
//   value older than imbalance_interval (stretched to 20 x the last
//   reading's duration), on a third connection; the gauge shows the last
//   value that two consecutive, self-consistent readings agreed on. See
//   docs/metrics.md, "saga_ledger_imbalance".
#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "sagapool/audit.hpp"
#include "sagapool/ledger.hpp"
#include "sagapool/probe.hpp"

namespace sagapool {

struct StoreCollectorOptions {
  std::vector<std::string> store_urls;
  std::chrono::milliseconds stats_ttl{1000};
  // The live workers on the store, this one included (WorkerRegistration);
  // unset or 0 counts as 1.
  const std::atomic<std::size_t>* pool_size = nullptr;
  std::chrono::milliseconds imbalance_interval{15'000};
  // /readyz: the store counts as reachable when it answered this recently.
  std::chrono::milliseconds ready_window{5000};
  // A reading gives up (no value) above this many unfinished transfers: it
  // reads their postings one transfer at a time.
  std::size_t imbalance_max_in_flight = 1000;
};

class StoreCollector final : public prometheus::Collectable {
 public:
  using Clock = std::chrono::steady_clock;

  // Opens the collector's connections (fails like the worker would on a bad
  // --store) and starts the imbalance thread, idle until a scrape asks.
  static Status open(StoreCollectorOptions options, WorkerProbe& probe,
                     std::shared_ptr<StoreCollector>& out);
  ~StoreCollector() override;
  StoreCollector(const StoreCollector&) = delete;
  StoreCollector& operator=(const StoreCollector&) = delete;

  std::vector<prometheus::MetricFamily> Collect() const override;

  // Readiness: true when the store answered within ready_window; asks it
  // for its clock (one cheap round trip) when the last answer is older.
  // `detail` says why not.
  bool store_reachable(std::string& detail);

 private:
  StoreCollector(StoreCollectorOptions options, WorkerProbe& probe);

  struct Stats {
    bool valid = false;
    StateStatsTable table{};
    std::vector<std::pair<std::size_t, PreparedStats>> prepared;  // by shard, those that can prepare
    Clock::time_point asked{};
    Clock::duration ttl{};
  };
  struct InFlight;  // one reading's view of the unfinished transfers

  // Scrape path; mu_ held.
  void refresh_stats_locked(Clock::time_point now) const;
  void note_error_locked(const char* op, const Status& s, Clock::time_point now) const;

  // Imbalance thread.
  void imbalance_loop();
  // One reading: nullopt when it could not be taken or was not
  // self-consistent (transfers moved while the accounts were read).
  std::optional<Wide> read_imbalance(Ledger& ledger, Status& error);
  Status read_in_flight(Ledger& ledger, InFlight& out);
  Status net_of(Ledger& ledger, const TransferDoc& t, std::vector<Posting>& scratch,
                std::int64_t& net, std::uint8_t& kinds);

  const StoreCollectorOptions options_;
  WorkerProbe& probe_;

  // Scrape path: the ledger for state_stats and readiness pings.
  mutable std::mutex mu_;
  std::unique_ptr<Ledger> ledger_;
  mutable Stats stats_;
  mutable Clock::time_point last_answer_{};  // last successful store call
  mutable Clock::time_point last_error_log_{};

  // Imbalance: published value and the thread's schedule.
  mutable std::mutex imb_mu_;
  mutable std::condition_variable imb_cv_;
  mutable bool wanted_ = false;  // a scrape found the value missing or old
  bool stopping_ = false;
  std::atomic<bool> halt_{false};  // stopping_, readable mid-reading without the lock
  std::optional<double> imbalance_;
  Clock::time_point imbalance_at_{};
  Clock::duration imbalance_every_{};  // effective interval (stretched by cost)
  std::thread imb_thread_;
};

}  // namespace sagapool
