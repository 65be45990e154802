#include "registration.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace sagapool {

#ifndef SAGA_GIT_REVISION
#define SAGA_GIT_REVISION "unknown"
#endif

Status WorkerRegistration::start(const std::string& store_url, const std::string& worker_id,
                                 std::int64_t lease_ms, std::unique_ptr<WorkerRegistration>& out) {
  std::unique_ptr<Store> store;
  if (Status s = open_store(store_url, store); !s) return s;
  WorkerRecord record;
  record.worker_id = worker_id;
  record.build_version = SAGAPOOL_VERSION;
  record.git_revision = SAGA_GIT_REVISION;
  record.schema_version = kSchemaVersion;
  record.lease_ms = lease_ms;
  if (Status s = store->register_worker(record); !s) return s;
  out.reset(new WorkerRegistration(std::move(store), std::move(record)));
  return Status::ok();
}

// Three heartbeats per lease: a worker is gone after kWorkerGoneLeases
// leases without one, so a few failed writes do not make it look gone.
WorkerRegistration::WorkerRegistration(std::unique_ptr<Store> store, WorkerRecord record)
    : store_(std::move(store)),
      record_(std::move(record)),
      interval_(std::max<std::int64_t>(record_.lease_ms / 3, 100)) {
  count_live_workers();
  thread_ = std::thread([this] { heartbeat(); });
}

void WorkerRegistration::heartbeat() {
  std::unique_lock lock(mu_);
  while (!wake_.wait_for(lock, interval_, [this] { return stop_; })) {
    if (Status s = store_->register_worker(record_); !s) {
      spdlog::warn("worker registry heartbeat: {}", s.message());
      continue;
    }
    count_live_workers();
  }
}

// A failed read keeps the last count: it only spaces the store gauges'
// reads. The store's time is the newest heartbeat listed, this worker's
// own just written, so counting costs one round trip.
void WorkerRegistration::count_live_workers() {
  if (Status s = store_->list_workers(listed_); !s) {
    spdlog::warn("counting the workers in the registry: {}", s.message());
    return;
  }
  std::int64_t now = 0;
  for (const WorkerRecord& w : listed_) now = std::max(now, w.heartbeat_ms);
  const auto live = std::count_if(listed_.begin(), listed_.end(),
                                  [now](const WorkerRecord& w) { return worker_live(w, now); });
  live_workers_.store(static_cast<std::size_t>(live), std::memory_order_relaxed);
}

WorkerRegistration::~WorkerRegistration() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  if (Status s = store_->deregister_worker(record_.worker_id); !s) {
    spdlog::warn("leaving the worker registry: {}", s.message());
  }
}

}  // namespace sagapool
