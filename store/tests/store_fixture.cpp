#include <unistd.h>

#include <atomic>

#include "ferret_server.hpp"
#include "pg_server.hpp"
#include "store_test.hpp"

// How the fixture opens a store on the real backends (by URL); the helpers
// every backend shares are store_test_helpers.cpp.
namespace sagapool::test {

PgServer& shared_pg_server() {
  // Destroyed at exit, which stops the server; a crashed test process takes
  // it down through PR_SET_PDEATHSIG.
  static PgServer server;
  return server;
}

FerretServer& shared_ferret_server() {
  // As shared_pg_server: stopped at exit, or with the test process.
  static FerretServer server;
  return server;
}

std::string StoreTest::new_url() {
  if (GetParam() == "sqlite") {
    dirs_.push_back(std::make_unique<TempDir>("sagapool-store"));
    return "sqlite:" + (dirs_.back()->path() / "store.db").string();
  }
  static std::atomic<int> counter{0};
  const std::string name = "store_" + std::to_string(::getpid()) + "_" + std::to_string(++counter);
  if (GetParam() == "mongodb") return shared_ferret_server().create_database(name);
  return shared_pg_server().create_database(name);
}

std::unique_ptr<Store> StoreTest::fresh_store(bool init) {
  url_ = new_url();
  std::unique_ptr<Store> s;
  const Status st = open_store(url_, s);
  EXPECT_TRUE(st.is_ok()) << st.message();
  if (!s || !init) return s;
  const Status st_init = s->init_schema();
  EXPECT_TRUE(st_init.is_ok()) << st_init.message();
  return s;
}

std::unique_ptr<Store> StoreTest::second_connection() {
  std::unique_ptr<Store> s;
  const Status st = open_store(url_, s);
  EXPECT_TRUE(st.is_ok()) << st.message();
  return s;
}

}  // namespace sagapool::test
