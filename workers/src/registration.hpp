#pragma once
// The worker's row in the worker registry (the first store): its build,
// revision and schema version, registered at start, refreshed every
// interval on the store's clock, removed at a clean exit. `sagactl migrate
// --contract` reads it to refuse while a worker of an older build runs.
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

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

  WorkerRegistration(const WorkerRegistration&) = delete;
  WorkerRegistration& operator=(const WorkerRegistration&) = delete;

 private:
  WorkerRegistration(std::unique_ptr<Store> store, WorkerRecord record);
  void heartbeat();

  std::unique_ptr<Store> store_;
  WorkerRecord record_;
  std::chrono::milliseconds interval_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace sagapool
