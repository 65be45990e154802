// The conformance suite on the simulation's in-memory store (label `unit`):
// the deterministic simulation (tests/sim) is only as good as this store's
// fidelity to the real backends, so it runs every case they run.
//
// store_fixture.cpp opens stores by URL through open_store, which knows only
// the real backends; this executable defines instead how the fixture opens
// a store: an in-memory database (`memory:NAME`, one per fresh_store, shared
// by second_connection). The fixture's helpers are store_test_helpers.cpp.
#include <map>
#include <mutex>

#include "sagapool/memory_store.hpp"
#include "store_test.hpp"

namespace sagapool::test {

INSTANTIATE_TEST_SUITE_P(memory, StoreTest, testing::Values(std::string("memory")),
                         [](const testing::TestParamInfo<std::string>& p) { return p.param; });

namespace {

std::mutex g_mu;
std::map<std::string, std::shared_ptr<sim::MemoryDb>> g_dbs;  // by URL

std::unique_ptr<Store> open_memory(const std::string& url) {
  std::lock_guard lock(g_mu);
  const auto it = g_dbs.find(url);
  if (it == g_dbs.end()) {
    ADD_FAILURE() << "no memory database " << url;
    return nullptr;
  }
  return sim::connect(it->second);
}

}  // namespace

std::string StoreTest::new_url() {
  static int counter = 0;
  std::lock_guard lock(g_mu);
  const std::string name = "store-" + std::to_string(++counter);
  sim::MemoryOptions options;
  options.name = name;
  options.initialised = false;  // like a new file: init_schema creates it
  const std::string url = "memory:" + name;
  g_dbs[url] = sim::make_memory_db(std::make_shared<sim::WallClock>(), options);
  return url;
}

std::unique_ptr<Store> StoreTest::fresh_store(bool init) {
  url_ = new_url();
  std::unique_ptr<Store> s = open_memory(url_);
  if (!s || !init) return s;
  const Status st_init = s->init_schema();
  EXPECT_TRUE(st_init.is_ok()) << st_init.message();
  return s;
}

std::unique_ptr<Store> StoreTest::second_connection() { return open_memory(url_); }

}  // namespace sagapool::test
