// The SQLite store's write-ahead log stays bounded under back-to-back
// commits while readers come and go: SQLite's PASSIVE autocheckpoint alone
// never starts the log over then (it grew past 7 GB in a sustained run).
#include <sqlite3.h>

#include <atomic>
#include <filesystem>
#include <random>
#include <thread>

#include "store_test.hpp"

namespace sagapool::test {
namespace {

constexpr std::uintmax_t kMiB = 1024 * 1024;

// Reads back to back, as scrapes, audits and progress queries do, so that
// some reader is nearly always in the log. Each read is bounded: a count of
// the whole postings table took longer as the test wrote, until under load
// one outlasted the RESTART's 250 ms wait every time.
class OverlappingReaders {
 public:
  explicit OverlappingReaders(const std::string& path) {
    for (int i = 0; i < 2; ++i) {
      threads_.emplace_back([this, path, i] {
        sqlite3* db = nullptr;
        if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) return;
        sqlite3_busy_timeout(db, 1000);
        // Staggered, so that one is still reading when the other starts.
        std::this_thread::sleep_for(std::chrono::milliseconds(10 * i));
        while (!stop_) {
          sqlite3_exec(db,
                       "SELECT count(*), sum(balance) FROM accounts; "
                       "SELECT count(*) FROM (SELECT 1 FROM postings LIMIT 20000)",
                       nullptr, nullptr, nullptr);
          reads_.fetch_add(1);
        }
        sqlite3_close(db);
      });
    }
  }
  ~OverlappingReaders() {
    stop_ = true;
    for (std::thread& t : threads_) t.join();
  }
  int reads() const { return reads_.load(); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> reads_{0};
  std::vector<std::thread> threads_;
};

}  // namespace

TEST(SqliteStore, LogStartsOverUnderSustainedWritesWhileReadersComeAndGo) {
  TempDir dir("sagapool-wal");
  const std::string path = (dir.path() / "store.db").string();
  std::unique_ptr<Store> store;
  SAGA_ASSERT_OK(open_store("sqlite:" + path, store));
  SAGA_ASSERT_OK(store->init_schema());
  constexpr std::size_t kAccounts = 20'000;
  std::vector<Account> accounts(kAccounts);
  for (std::size_t i = 0; i < kAccounts; ++i) {
    accounts[i].id = "acct-" + std::to_string(i);
    accounts[i].balance = accounts[i].opening_balance = 1'000'000;
  }
  SAGA_ASSERT_OK(store->create_accounts(accounts));

  OverlappingReaders readers(path);
  const std::filesystem::path wal = path + "-wal";
  std::mt19937 rng(7);
  std::uniform_int_distribution<std::size_t> pick(0, kAccounts - 1);
  constexpr std::size_t kBatch = 200;
  std::vector<std::string> ids(kBatch);
  std::vector<LegRequest> legs(kBatch);
  std::vector<LegResult> results(kBatch);
  std::uintmax_t largest = 0, last = 0;
  int starts_over = 0, batches = 0;
  // Ends once the log was started over three times (its file cut back to
  // journal_size_limit), or once it is past twice the restart threshold.
  while (starts_over < 3 && largest < 256 * kMiB) {
    for (std::size_t i = 0; i < kBatch; ++i) {
      ids[i] = "t-" + std::to_string(batches) + "-" + std::to_string(i);
      legs[i] = {LegOp::credit, ids[i], accounts[pick(rng)].id, 1, ""};
    }
    SAGA_ASSERT_OK(store->apply_legs(legs, results));
    ++batches;
    std::error_code ec;
    const std::uintmax_t size = std::filesystem::file_size(wal, ec);
    if (ec) continue;
    if (size < last) ++starts_over;
    last = size;
    largest = std::max(largest, size);
  }
  EXPECT_GE(starts_over, 3) << "after " << batches << " batches of " << kBatch << " credits, "
                            << readers.reads() << " reads";
  EXPECT_LT(largest, 192 * kMiB);
  EXPECT_GT(readers.reads(), 10);  // the readers were there
}

}  // namespace sagapool::test
