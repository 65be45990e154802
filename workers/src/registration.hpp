#pragma once
// The worker's row in the worker registry (the first store): its build,
// revision and schema version, registered at start, refreshed every
// interval on the store's clock, removed at a clean exit. `sagactl migrate
// --contract` reads it to refuse while a worker of an older build runs; the
// worker reads from it how many share its store (how often its store
// gauges are read, store_collector.hpp).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "sagapool/status.hpp"
#include "sagapool/store.hpp"

namespace sagapool {

class WorkerRegistration {
 public:
  // Opens its own connection to `store_url` and registers once; the
  // heartbeat runs on a thread of its own every `interval`.
  static Status start(const std::string& store_url, const std::string& worker_id,
                      std::int64_t lease_ms, std::unique_ptr<WorkerRegistration>& out);
  // Stops the heartbeat and deregisters (a failure is only logged: the row
  // ages out after kWorkerGoneLeases leases).
  ~WorkerRegistration();

  // The live workers in the registry, this one included, as of the last
  // heartbeat (0 until one has counted them).
  const std::atomic<std::size_t>& live_workers() const { return live_workers_; }

  WorkerRegistration(const WorkerRegistration&) = delete;
  WorkerRegistration& operator=(const WorkerRegistration&) = delete;

 private:
  WorkerRegistration(std::unique_ptr<Store> store, WorkerRecord record);
  void heartbeat();
  void count_live_workers();

  std::unique_ptr<Store> store_;
  WorkerRecord record_;
  std::atomic<std::size_t> live_workers_{0};
  std::vector<WorkerRecord> listed_;  // the heartbeat thread's
  std::chrono::milliseconds interval_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace sagapool
