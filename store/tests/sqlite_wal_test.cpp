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

// A store of 20,000 accounts that credits 200 random ones a commit.
class CreditWriter {
 public:
  static constexpr std::size_t kBatch = 200;

  explicit CreditWriter(const std::string& path) : wal_(path + "-wal"), rng_(7) {
    SAGA_EXPECT_OK(open_store("sqlite:" + path, store_));
    SAGA_EXPECT_OK(store_->init_schema());
    accounts_.resize(20'000);
    for (std::size_t i = 0; i < accounts_.size(); ++i) {
      accounts_[i].id = "acct-" + std::to_string(i);
      accounts_[i].balance = accounts_[i].opening_balance = 1'000'000;
    }
    SAGA_EXPECT_OK(store_->create_accounts(accounts_));
  }

  // Commits one batch and returns the log's size after it.
  std::uintmax_t commit() {
    std::uniform_int_distribution<std::size_t> pick(0, accounts_.size() - 1);
    for (std::size_t i = 0; i < kBatch; ++i) {
      ids_[i] = "t-" + std::to_string(batches_) + "-" + std::to_string(i);
      legs_[i] = {LegOp::credit, ids_[i], accounts_[pick(rng_)].id, 1, ""};
    }
    SAGA_EXPECT_OK(store_->apply_legs(legs_, results_));
    ++batches_;
    std::error_code ec;
    const std::uintmax_t size = std::filesystem::file_size(wal_, ec);
    if (!ec) size_ = size;  // unreadable: the last size, never a false start-over
    return size_;
  }
  int batches() const { return batches_; }

 private:
  std::unique_ptr<Store> store_;
  std::vector<Account> accounts_;
  std::filesystem::path wal_;
  std::mt19937 rng_;
  std::vector<std::string> ids_ = std::vector<std::string>(kBatch);
  std::vector<LegRequest> legs_ = std::vector<LegRequest>(kBatch);
  std::vector<LegResult> results_ = std::vector<LegResult>(kBatch);
  int batches_ = 0;
  std::uintmax_t size_ = 0;
};

// Where the store tries to start the log over: 32,768 frames of 4 KiB pages.
constexpr std::uintmax_t kRestartBytes = 32768 * (4096 + 24);

}  // namespace

TEST(SqliteStore, LogStartsOverUnderSustainedWritesWhileReadersComeAndGo) {
  TempDir dir("sagapool-wal");
  const std::string path = (dir.path() / "store.db").string();
  CreditWriter writer(path);
  OverlappingReaders readers(path);
  std::uintmax_t largest = 0, last = 0;
  int starts_over = 0;
  // Ends once the log was started over three times (its file cut back to
  // journal_size_limit), or once it is past twice the restart threshold.
  while (starts_over < 3 && largest < 256 * kMiB && !testing::Test::HasFailure()) {
    const std::uintmax_t size = writer.commit();
    if (size < last) ++starts_over;
    last = size;
    largest = std::max(largest, size);
  }
  EXPECT_GE(starts_over, 3) << "after " << writer.batches() << " batches of "
                            << CreditWriter::kBatch << " credits, " << readers.reads() << " reads";
  EXPECT_LT(largest, 192 * kMiB);  // a restart that timed out once is tried again at 160 MiB
  EXPECT_GT(readers.reads(), 10);  // the readers were there
}

// A reader that holds its snapshot past the threshold makes the restart's
// wait time out; once it lets go, the next try comes 32 MiB later, not
// another 128 MiB (after each later timeout twice as much later, up to 128).
TEST(SqliteStore, ARestartThatTimedOutIsTriedAgainSoon) {
  TempDir dir("sagapool-wal");
  const std::string path = (dir.path() / "store.db").string();
  CreditWriter writer(path);
  sqlite3* held = nullptr;
  ASSERT_EQ(sqlite3_open_v2(path.c_str(), &held, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(held, "BEGIN; SELECT count(*) FROM accounts", nullptr, nullptr, nullptr),
            SQLITE_OK);
  // Without readers coming and going a PASSIVE checkpoint would let the
  // next commit start the log over by itself, retry or not.
  OverlappingReaders readers(path);
  std::uintmax_t size = 0;
  while (size < kRestartBytes && !testing::Test::HasFailure()) size = writer.commit();
  const std::uintmax_t tried_at = size;
  sqlite3_exec(held, "COMMIT", nullptr, nullptr, nullptr);
  sqlite3_close(held);

  std::uintmax_t largest = size, last = size;
  bool started_over = false;
  while (!started_over && largest < 320 * kMiB && !testing::Test::HasFailure()) {
    size = writer.commit();
    started_over = size < last;
    last = size;
    largest = std::max(largest, size);
  }
  EXPECT_TRUE(started_over) << "the held reader let go at " << tried_at / kMiB << " MiB";
  // 32 MiB after the first try; 96 if that try too timed out. Before, the
  // log grew to 256 MiB.
  EXPECT_LT(largest, tried_at + 100 * kMiB) << "the held reader let go at " << tried_at / kMiB
                                            << " MiB";
}

}  // namespace sagapool::test
