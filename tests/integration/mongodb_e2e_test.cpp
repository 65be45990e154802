// The bank scenario on MongoDB (issue 16): a real Kafka node, a ledger of two
// shards (two databases of one throwaway FerretDB), three saga-worker
// processes with a 2 s lease; requests published while they run, with
// overdrafts, unknown accounts and duplicates. One worker is frozen
// (SIGSTOP) past its lease while it holds open transfers, the others take
// them over, and it is resumed: fenced out, it keeps running. Another is
// SIGKILLed and replaced. At the end every id has one terminal transfer whose
// published outcomes agree with it, every balance is exact, and the audit
// (in-process and `sagactl audit`) passes.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "ledger_cluster.hpp"

namespace sagapool::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// FerretDB is far slower than SQLite or PostgreSQL: small batches, a
// moderate number of requests.
constexpr int kTransfers = 300;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// As eventually(), polling every `every`: FerretDB answers a query on
// anything but _id by reading the whole collection, so the test's own
// queries would slow the workers down if sent every 50 ms.
template <typename Pred>
bool eventually_every(Pred pred, std::chrono::milliseconds timeout, std::chrono::milliseconds every) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(every);
  }
  return pred();
}

// The open (non-terminal) transfers `worker` owns, with their epochs.
std::map<std::string, std::int64_t> open_transfers_of(Ledger& ledger, const std::string& worker) {
  std::vector<TransferDoc> open;
  const Status s = ledger.transfers().list_stale(std::numeric_limits<std::int64_t>::max(), 100'000, open);
  EXPECT_TRUE(s.is_ok()) << s.message();
  std::map<std::string, std::int64_t> out;
  for (const TransferDoc& d : open) {
    if (d.owner == worker) out[d.id] = d.epoch;
  }
  return out;
}

TEST(MongoE2E, ThreeWorkersOneFrozenOneKilledEveryIdOneOutcome) {
  LedgerCluster cluster(2, 200, {.backend = LedgerCluster::Backend::mongodb});
  const auto transfers = cluster.plan(kTransfers, 16);
  EXPECT_GT(cluster.cross_shard(transfers), transfers.size() / 3);
  // Every tenth request is published twice: one transfer, and its outcome
  // at most republished.
  std::vector<PlannedTransfer> sent;
  for (std::size_t i = 0; i < transfers.size(); ++i) {
    sent.push_back(transfers[i]);
    if (i % 10 == 0) sent.push_back(transfers[i]);
  }
  // A member that stops heartbeating leaves the group after 8 s: the
  // SIGKILLed one then, the frozen one (5 s) only if its take-over is slow.
  const std::vector<std::string> flags = {"--batch-size", "10", "--kafka-opt", "session.timeout.ms=8000",
                                          "--kafka-opt", "heartbeat.interval.ms=300"};
  std::map<std::string, Process> workers;
  for (const std::string name : {"w0", "w1", "w2"}) workers[name] = cluster.start_worker(name, "", flags);
  const auto started = Clock::now();
  std::thread producer = cluster.produce_paced(sent, 10, 300ms);
  struct Join {
    std::thread& t;
    ~Join() {
      if (t.joinable()) t.join();  // also when an assertion below returns early
    }
  } join_producer{producer};

  // Freeze w2 while it holds open transfers: checked again once it is
  // stopped, since it may have finished them in between.
  std::map<std::string, std::int64_t> held;
  for (int attempt = 0; attempt < 20 && held.empty(); ++attempt) {
    ASSERT_TRUE(eventually_every([&] { return !open_transfers_of(cluster.ledger(), "w2").empty(); }, 30s, 200ms))
        << "w2 never held an open transfer\n"
        << cluster.log_tails();
    workers["w2"].signal(SIGSTOP);
    std::this_thread::sleep_for(300ms);  // its store calls already sent land
    held = open_transfers_of(cluster.ledger(), "w2");
    if (held.empty()) workers["w2"].signal(SIGCONT);
  }
  ASSERT_FALSE(held.empty()) << cluster.log_tails();
  const auto frozen = Clock::now();
  std::cout << "w2 frozen at " << seconds_since(started) << " s holding " << held.size() << " open transfers\n";
  // Past its 2 s lease: the others claim what it holds, with a new epoch.
  std::this_thread::sleep_for(5s);
  EXPECT_TRUE(eventually_every(
      [&] {
        for (const auto& [id, epoch] : held) {
          std::optional<TransferDoc> d;
          if (!cluster.ledger().transfers().load_transfer(id, d).is_ok() || !d) return false;
          if (d->owner == "w2" || d->epoch <= epoch) return false;
        }
        return true;
      },
      30s, 250ms))
      << "the others never took over w2's transfers\n"
      << cluster.log_tails();
  workers["w2"].signal(SIGCONT);
  std::cout << "w2 resumed after " << seconds_since(frozen) << " s\n";

  // Then w1 dies mid-run and a new worker takes its place.
  workers["w1"].signal(SIGKILL);
  ASSERT_TRUE(workers["w1"].wait(5s).has_value());
  std::this_thread::sleep_for(1s);
  workers["w1-restarted"] = cluster.start_worker("w1-restarted", "", flags);
  producer.join();
  std::cout << "all requests published after " << seconds_since(started) << " s\n";

  ASSERT_TRUE(eventually_every(
      [&] {
        bool open = false;
        return cluster.finished(open) == transfers.size() && !open;
      },
      240s, 1s))
      << cluster.log_tails();
  std::cout << transfers.size() << " transfers finished in " << seconds_since(started) << " s\n";

  // The take-over is in the others' logs, and the resumed worker, fenced
  // out of what it held, is still running.
  std::string others;
  for (const std::string name : {"w0", "w1", "w1-restarted"}) others += read_file(cluster.log_of(name));
  std::size_t logged = 0;
  for (const auto& [id, epoch] : held) {
    logged += others.find("recovered: its lease had expired transfer_id=" + id + " ") != std::string::npos;
  }
  EXPECT_EQ(logged, held.size()) << cluster.log_tails();
  std::size_t takeovers = 0;
  for (std::size_t at = others.find("recovered: its lease had expired"); at != std::string::npos;
       at = others.find("recovered: its lease had expired", at + 1)) {
    ++takeovers;
  }
  std::cout << takeovers << " transfers taken over by w0, w1 and w1-restarted, " << held.size() << " of them from w2\n";
  EXPECT_TRUE(workers["w2"].running()) << read_file(cluster.log_of("w2"));
  for (auto& [name, w] : workers) {
    if (name != "w1") {
      EXPECT_EQ(w.stop(20s), 0) << name << "\n" << read_file(cluster.log_of(name));
    }
  }

  // Every id: one terminal transfer, the planned one, and every outcome
  // published for it the same (cluster.expect_outcomes).
  std::size_t wrong = 0;
  for (const PlannedTransfer& t : transfers) {
    std::optional<TransferDoc> d;
    ASSERT_TRUE(cluster.ledger().transfers().load_transfer(t.id, d).is_ok());
    ASSERT_TRUE(d.has_value()) << t.id << " lost";
    const std::string reason = d->reason == Reason::none ? "" : std::string(to_string(d->reason));
    if (std::string(to_string(d->state)) != t.state || reason != t.reason) {
      ADD_FAILURE() << t.id << ": the ledger says " << to_string(d->state) << "/" << reason << ", expected "
                    << t.state << "/" << t.reason;
      if (++wrong > 10) break;
    }
  }
  cluster.expect_outcomes(transfers);
  cluster.expect_balances(transfers);
  std::int64_t total = 0;
  for (std::size_t s = 0; s < cluster.ledger().shard_count(); ++s) {
    ASSERT_TRUE(cluster.ledger().shard(s).scan_accounts([&](const Account& a) { total += a.balance; }).is_ok());
  }
  EXPECT_EQ(total, LedgerCluster::kOpening * 200);
  cluster.expect_audit_passes();

  std::vector<std::string> sagactl = {bin("sagactl").string()};
  for (const std::string& url : cluster.urls()) sagactl.insert(sagactl.end(), {"--store", url});
  sagactl.push_back("audit");
  const RunResult audit = run(sagactl, {}, 120s);
  EXPECT_EQ(audit.exit_code, 0) << audit.output;
  EXPECT_NE(audit.output.find("audit passed"), std::string::npos) << audit.output;
}

}  // namespace
}  // namespace sagapool::test
