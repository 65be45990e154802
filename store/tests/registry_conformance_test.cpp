// The worker registry and the schema's expand/contract steps, on every
// backend: what `sagactl migrate --contract` relies on to refuse while a
// worker of an older build runs.
#include <algorithm>

#include "sagapool/ledger.hpp"
#include "store_test.hpp"

namespace sagapool::test {
namespace {

WorkerRecord worker(std::string id, int schema_version, std::int64_t lease_ms = 60'000) {
  WorkerRecord w;
  w.worker_id = std::move(id);
  w.build_version = "1.2.3";
  w.git_revision = "abc123";
  w.schema_version = schema_version;
  w.lease_ms = lease_ms;
  return w;
}

std::vector<WorkerRecord> workers(Store& s) {
  std::vector<WorkerRecord> out;
  const Status st = s.list_workers(out);
  EXPECT_TRUE(st.is_ok()) << st.message();
  return out;
}

bool names(const std::vector<std::string>& lines, std::string_view worker_id) {
  const std::string needle = "worker " + std::string(worker_id) + " ";
  return std::any_of(lines.begin(), lines.end(), [&](const std::string& l) { return l.starts_with(needle); });
}

}  // namespace

TEST_P(StoreTest, RegistryKeepsOneRowPerWorkerWithAHeartbeatOnTheStoreClock) {
  EXPECT_TRUE(workers(*store_).empty());
  const std::int64_t before = store_now();
  SAGA_ASSERT_OK(store_->register_worker(worker("w-1", 2)));
  SAGA_ASSERT_OK(store_->register_worker(worker("w-2", kSchemaVersion)));
  const std::int64_t after = store_now();
  auto rows = workers(*store_);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].worker_id, "w-1");
  EXPECT_EQ(rows[0].build_version, "1.2.3");
  EXPECT_EQ(rows[0].git_revision, "abc123");
  EXPECT_EQ(rows[0].schema_version, 2);
  EXPECT_EQ(rows[0].lease_ms, 60'000);
  EXPECT_GE(rows[0].heartbeat_ms, before);
  EXPECT_LE(rows[0].heartbeat_ms, after);

  // A heartbeat (the same call again) refreshes the row, and a restarted
  // worker of another build under the same id replaces it.
  wait_store_clock_past(rows[0].heartbeat_ms);
  WorkerRecord again = worker("w-1", kSchemaVersion);
  again.build_version = "1.3.0";
  SAGA_ASSERT_OK(store_->register_worker(again));
  auto other = second_connection();
  ASSERT_NE(other, nullptr);
  rows = workers(*other);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].build_version, "1.3.0");
  EXPECT_EQ(rows[0].schema_version, kSchemaVersion);
  EXPECT_GT(rows[0].heartbeat_ms, after - 1);

  SAGA_ASSERT_OK(store_->deregister_worker("w-1"));
  SAGA_ASSERT_OK(store_->deregister_worker("never-registered"));
  rows = workers(*other);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].worker_id, "w-2");
}

TEST_P(StoreTest, RecentOwnersAreTheOwnersOfLeasesEndingThen) {
  InsertResult r{};
  SAGA_ASSERT_OK(insert_one(*store_, spec("t-1"), "w-old", 60'000, r));
  SAGA_ASSERT_OK(insert_one(*store_, spec("t-2"), "w-old", 60'000, r));
  SAGA_ASSERT_OK(insert_one(*store_, spec("t-3"), "w-short", 1'000, r));
  const std::int64_t now = store_now();
  std::vector<std::string> owners;
  SAGA_ASSERT_OK(store_->recent_owners(now, owners));
  EXPECT_EQ(owners, (std::vector<std::string>{"w-old", "w-short"}));
  SAGA_ASSERT_OK(store_->recent_owners(now + 30'000, owners));
  EXPECT_EQ(owners, std::vector<std::string>{"w-old"});
  SAGA_ASSERT_OK(store_->recent_owners(now + 120'000, owners));
  EXPECT_TRUE(owners.empty());
}

// A store made from nothing has no older build to wait for: it starts
// contracted, and a contract is then a no-op.
TEST_P(StoreTest, AFreshStoreIsContractedAndContractIsIdempotent) {
  SAGA_ASSERT_OK(store_->write_topology({"ledger-1", 0, 1, kSchemaVersion, kSchemaVersion}));
  std::optional<Topology> t;
  SAGA_ASSERT_OK(store_->read_topology(t));
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->schema_version, kSchemaVersion);
  EXPECT_EQ(t->schema_expanded, kSchemaVersion);
  EXPECT_TRUE(schema_runs(*t, kSchemaVersion));
  EXPECT_FALSE(schema_runs(*t, kSchemaVersion - 1));  // an older build refuses it
  SAGA_ASSERT_OK(store_->contract_schema());
  SAGA_ASSERT_OK(store_->init_schema());
  SAGA_ASSERT_OK(store_->read_topology(t));
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->schema_version, kSchemaVersion);
  EXPECT_EQ(t->schema_expanded, kSchemaVersion);
}

TEST_P(StoreTest, ContractIsRefusedBeforeInit) {
  std::unique_ptr<Store> bare = fresh_store(/*init=*/false);
  ASSERT_NE(bare, nullptr);
  EXPECT_EQ(bare->contract_schema().kind(), ErrorKind::fatal);
}

// Who blocks a contract: live registered workers of an older schema
// version, and owners of recent leases that never registered (builds from
// before the registry), but not workers of this build, gone workers, or
// sagactl's own claims.
TEST_P(StoreTest, OlderWorkersAreTheLiveOnesThatNeedWhatTheContractDrops) {
  SAGA_ASSERT_OK(store_->write_topology({"ledger-1", 0, 1, kSchemaVersion, kSchemaVersion}));
  SAGA_ASSERT_OK(store_->register_worker(worker("old-live", kSchemaVersion - 1)));
  SAGA_ASSERT_OK(store_->register_worker(worker("new-live", kSchemaVersion)));
  SAGA_ASSERT_OK(store_->register_worker(worker("old-gone", kSchemaVersion - 1, /*lease_ms=*/1)));
  std::vector<WorkerRecord> rows = workers(*store_);
  for (const WorkerRecord& w : rows) {
    if (w.worker_id == "old-gone") wait_store_clock_past(w.heartbeat_ms + kWorkerGoneLeases * w.lease_ms);
  }
  InsertResult r{};
  SAGA_ASSERT_OK(insert_one(*store_, spec("t-1"), "unregistered", 60'000, r));
  SAGA_ASSERT_OK(insert_one(*store_, spec("t-2"), "new-live", 60'000, r));
  SAGA_ASSERT_OK(insert_one(*store_, spec("t-3"), "sagactl@ops-host", 60'000, r));

  std::vector<std::unique_ptr<Store>> stores;
  stores.push_back(second_connection());
  ASSERT_NE(stores.back(), nullptr);
  auto ledger = Ledger::from_stores(std::move(stores));
  std::vector<std::string> older;
  SAGA_ASSERT_OK(ledger->older_workers(90'000, older));
  EXPECT_EQ(older.size(), 2u);
  EXPECT_TRUE(names(older, "old-live")) << testing::PrintToString(older);
  EXPECT_TRUE(names(older, "unregistered")) << testing::PrintToString(older);

  // A deregistered worker no longer blocks; an unregistered owner blocks
  // until its lease has ended longer ago than the window.
  SAGA_ASSERT_OK(store_->deregister_worker("old-live"));
  SAGA_ASSERT_OK(ledger->older_workers(90'000, older));
  EXPECT_EQ(older.size(), 1u);
  EXPECT_TRUE(names(older, "unregistered"));
  // The contract itself (the caller checks first) leaves a store this build
  // still runs on.
  SAGA_ASSERT_OK(ledger->contract());
  std::optional<Topology> t;
  SAGA_ASSERT_OK(store_->read_topology(t));
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->schema_version, kSchemaVersion);
}

}  // namespace sagapool::test
