// A worker frozen inside a batch transaction (SIGSTOP, a frozen VM, a
// blocked log write) keeps its connection and its accounts' row locks; with
// hot accounts every other worker waited on it for as long as it stayed
// frozen (issue 19, finding 5). The server now ends a session left idle
// inside a batch transaction after 5 s (docs/postgres.md, "Timeouts"): the
// others carry on, and the frozen worker's batch is rolled back and runs
// again when it wakes.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "ledger_cluster.hpp"

namespace sagapool::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST(PostgresStall, AWorkerFrozenInsideABatchDoesNotStopThePool) {
  LedgerCluster cluster(1, 4);  // four accounts: every batch locks all of them
  auto transfers = cluster.plan(3000, 21);
  // Every fourth overdraws: a walk with a leg refused for a balance takes
  // its locks in its settle call (a walk without one would take them only
  // with COMMIT, and a worker frozen before that holds none).
  for (std::size_t i = 0; i < transfers.size(); i += 4) {
    if (transfers[i].from.starts_with("ghost-") || transfers[i].to.starts_with("ghost-")) continue;
    transfers[i].amount = LedgerCluster::kOpening * 4 + 1;
    transfers[i].state = "canceled";
    transfers[i].reason = "insufficient_funds";
  }
  std::vector<Process> workers;
  // w0 freezes for 30 s right after its first batch's sagas ran (one
  // settle call), inside the batch transaction, holding the row locks of
  // every account.
  workers.push_back(cluster.start_worker("w0", "", {"--lease", "60s"},
                                         {"SAGA_FAILPOINTS=after_settle=1*pause:30s"}));
  workers.push_back(cluster.start_worker("w1", "", {"--lease", "60s"}));
  for (const char* name : {"w0", "w1"}) {
    ASSERT_TRUE(cluster.joined(name)) << read_file(cluster.log_of(name));
  }
  std::this_thread::sleep_for(3s);  // the group settles before w0 freezes
  // Keyed by id: both workers' partitions get requests, so w1 has its own
  // work to go on with whatever the assignment.
  std::thread producer = cluster.produce_paced(transfers, 300, 300ms, LedgerCluster::Key::id);

  ASSERT_TRUE(eventually(
      [&] {
        return read_file(cluster.log_of("w0")).find("fail point after_settle: pausing") !=
               std::string::npos;
      },
      30s))
      << read_file(cluster.log_of("w0"));
  const auto frozen_at = Clock::now();
  bool open = false;
  const std::size_t before = cluster.finished(open);
  // w1 keeps finishing its own partitions' transfers while w0 is frozen (it
  // stays frozen 30 s; its partitions wait for it, as nothing tells Kafka a
  // consumer is frozen before max.poll.interval.ms).
  const bool progressed = eventually([&] { return cluster.finished(open) >= before + 200; }, 15s);
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - frozen_at);
  std::cout << "w1 finished 200 transfers " << waited.count() << " ms after w0 froze\n";
  EXPECT_TRUE(progressed) << "the pool waited on the frozen worker: " << cluster.finished(open) - before
                          << " transfers finished in 15 s\n"
                          << read_file(cluster.log_of("w1"));
  producer.join();

  ASSERT_TRUE(cluster.wait_finished(transfers.size(), 120s))
      << cluster.finished(open) << " of " << transfers.size() << " finished and published";
  for (std::size_t i = 0; i < workers.size(); ++i) {
    const std::string name = "w" + std::to_string(i);
    EXPECT_TRUE(workers[i].running()) << name << " exited:\n" << read_file(cluster.log_of(name));
    EXPECT_EQ(workers[i].stop(20s), 0) << read_file(cluster.log_of(name));
  }
  EXPECT_NE(read_file(cluster.log_of("w0")).find("fail point after_settle: resuming"),
            std::string::npos);
  cluster.expect_outcomes(transfers);
  cluster.expect_balances(transfers);
  cluster.expect_audit_passes();
}

}  // namespace
}  // namespace sagapool::test
