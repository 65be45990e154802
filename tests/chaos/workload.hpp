#pragma once
// The chaos run's requests, planned in advance from the seed, and the
// publisher that sends them at a steady rate through every broker fault.
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace sagapool::chaos {

struct PlannedRequest {
  enum class Kind {
    ordinary,         // done or insufficient_funds, depending on the interleaving
    overdraft,        // more than the whole ledger holds: always insufficient_funds
    unknown_account,  // canceled: unknown_account, or insufficient_funds from a known source
    invalid,          // always dead-lettered
  };
  Kind kind = Kind::ordinary;
  std::string id;
  std::string from;
  std::string to;
  std::int64_t amount = 0;
  std::string bytes;  // the message value, exactly as sent
};

struct Workload {
  std::vector<PlannedRequest> requests;
  // Indexes into `requests` in sending order; a few valid requests appear
  // twice (an upstream retry: same id, same bytes).
  std::vector<std::size_t> sends;
  std::size_t valid = 0;
  std::size_t invalid = 0;
};

std::string account_id(int i);

// `count` requests over `accounts` accounts, each opening at `opening`.
Workload plan_workload(std::uint64_t seed, int count, int accounts, std::int64_t opening);

// Sends a workload at `rate` messages per second on its own thread. A
// message whose delivery fails (broker down, injected Produce errors) is sent
// again, as an upstream system would: the copy is a duplicate the workers
// recognise.
class Publisher {
 public:
  Publisher(std::string brokers, const Workload& workload, double rate);
  ~Publisher();
  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  bool finished() const { return finished_.load(); }
  // Stops sending (what is not delivered by then stays undelivered).
  void stop();
  std::uint64_t delivered() const { return delivered_.load(); }
  std::uint64_t resent() const { return resent_.load(); }
  std::string error() const;

 private:
  void run();

  std::string brokers_;
  const Workload& workload_;
  double rate_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> finished_{false};
  std::atomic<std::uint64_t> delivered_{0};
  std::atomic<std::uint64_t> resent_{0};
  mutable std::mutex error_mutex_;
  std::string error_;
  std::thread thread_;
};

}  // namespace sagapool::chaos
