// StoreCollector's store gauges are cached for stats_ttl times the pool's
// size: every worker of a pool reports the same store, so the pool reads it
// about once a stats_ttl whatever its size.
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "sagapool/ledger.hpp"
#include "sagapool/store_collector.hpp"
#include "process.hpp"

namespace sagapool::test {
namespace {

using namespace std::chrono_literals;

// saga_transfers{state="initial"} in one collection, -1 if absent.
double initial_transfers(const StoreCollector& c) {
  for (const prometheus::MetricFamily& f : c.Collect()) {
    if (f.name != "saga_transfers") continue;
    for (const prometheus::ClientMetric& m : f.metric) {
      if (!m.label.empty() && m.label[0].value == "initial") return m.gauge.value;
    }
  }
  return -1;
}

TEST(StoreCollector, TheStoreGaugesOfAPoolOfFourAreReadAQuarterAsOften) {
  TempDir dir;
  const std::string url = "sqlite:" + (dir / "ledger.db").string();
  std::unique_ptr<Ledger> ledger;
  ASSERT_TRUE(Ledger::open({url}, ledger).is_ok());
  ASSERT_TRUE(ledger->init().is_ok());

  prometheus::Registry registry;
  WorkerProbe probe(registry);
  const std::atomic<std::size_t> alone{1}, pool_of_four{4};
  auto open = [&](const std::atomic<std::size_t>& pool, std::shared_ptr<StoreCollector>& out) {
    StoreCollectorOptions o;
    o.store_urls = {url};
    o.stats_ttl = 1s;
    o.pool_size = &pool;
    ASSERT_TRUE(StoreCollector::open(o, probe, out).is_ok());
  };
  std::shared_ptr<StoreCollector> one, four;
  open(alone, one);
  open(pool_of_four, four);
  EXPECT_EQ(initial_transfers(*one), 0);
  EXPECT_EQ(initial_transfers(*four), 0);
  const auto read_at = std::chrono::steady_clock::now();

  NewTransfer t;
  t.request = {"t-1", "a", "b", 5, "", ""};
  t.payload_hash = payload_hash(t.request);
  t.origin_topic = "transfers.requests";
  InsertResult inserted{};
  ASSERT_TRUE(ledger->transfers().insert_transfers({&t, 1}, "w", 60'000, {&inserted, 1}).is_ok());

  // Past one stats_ttl, well within four.
  std::this_thread::sleep_for(1500ms);
  EXPECT_EQ(initial_transfers(*one), 1);
  if (std::chrono::steady_clock::now() - read_at < 3500ms) {
    EXPECT_EQ(initial_transfers(*four), 0);
  }
  std::this_thread::sleep_for(3s);
  EXPECT_EQ(initial_transfers(*four), 1);
}

}  // namespace
}  // namespace sagapool::test
