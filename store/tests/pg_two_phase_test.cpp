// PostgreSQL: a batch across stores, one transaction on each, made atomic
// by two-phase commit (store.hpp, TwoPhaseStore; write_walk). What each
// store does on its own: a walk's writes, a scope prepared and finished
// under its gid, the prepared transactions listed, and the first store's
// decisions recorded, decided and forgotten.
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "pg_server.hpp"
#include "store_test.hpp"

namespace sagapool::test {
namespace {

using namespace std::chrono_literals;

std::string quoted(const std::string& s) {
  std::string out = "'";
  for (const char c : s) {
    if (c == '\'') out += '\'';
    out += c;
  }
  return out + "'";
}

class PgTwoPhase : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    db_ = "two_phase_" + std::to_string(++counter);
    url_ = server_.create_database(db_);
    s1_ = open(url_);
    ASSERT_NE(s1_, nullptr);
    SAGA_ASSERT_OK(s1_->init_schema());
    s2_ = open(url_);
    ASSERT_NE(s2_, nullptr);
    SAGA_ASSERT_OK(s1_->create_accounts(std::vector<Account>{
        make_account("a", 1000), make_account("b", 0), make_account("c", 50)}));
  }

  // Prepared transactions outlive their sessions and hold their locks: the
  // ones a case leaves (a failed one too) are rolled back here.
  void TearDown() override {
    for (const std::string& db : dbs_with_prepared()) {
      const RunResult r =
          server_.psql(db, "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()");
      if (r.exit_code != 0) continue;
      std::size_t pos = 0;
      while (pos < r.output.size()) {
        std::size_t end = r.output.find('\n', pos);
        if (end == std::string::npos) end = r.output.size();
        const std::string gid = r.output.substr(pos, end - pos);
        pos = end + 1;
        if (gid.empty()) continue;
        const RunResult rb = server_.psql(db, "ROLLBACK PREPARED " + quoted(gid));
        EXPECT_EQ(rb.exit_code, 0) << rb.output;
      }
    }
  }

  std::vector<std::string> dbs_with_prepared() const {
    std::vector<std::string> dbs{db_};
    if (!other_db_.empty()) dbs.push_back(other_db_);
    return dbs;
  }

  static std::unique_ptr<Store> open(const std::string& url) {
    std::unique_ptr<Store> s;
    const Status st = open_store(url, s);
    EXPECT_TRUE(st.is_ok()) << st.message();
    return s;
  }

  std::string sql(const std::string& query) const {
    const RunResult r = server_.psql(db_, query);
    EXPECT_EQ(r.exit_code, 0) << query << ": " << r.output;
    std::string out = r.output;
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    return out;
  }

  std::int64_t balance(const std::string& id) {
    std::optional<Account> a;
    const Status st = s2_->load_account(id, a);
    EXPECT_TRUE(st.is_ok()) << st.message();
    return a ? a->balance : -1;
  }

  // Opens a scope on `s` and locks `ids` (the planning read).
  static void lock(Store& s, const std::vector<std::string_view>& ids) {
    SAGA_ASSERT_OK(s.begin_scope());
    std::vector<std::optional<Account>> out(ids.size());
    SAGA_ASSERT_OK(s.load_accounts(ids, out));
    for (const auto& a : out) ASSERT_TRUE(a.has_value());
  }

  // A walk on a and b: t-1 moves 100 from a to b; t-2's debit on a posts
  // and is reversed, its credit on b voided; t-3's two legs voided.
  static constexpr WalkPosting kPostings[] = {
      {"t-1", "a", PostingKind::debit, 100},
      {"t-1", "b", PostingKind::credit, 100},
      {"t-2", "a", PostingKind::debit, 30},
      {"t-2", "a", PostingKind::reverse_debit, 30},
  };
  static constexpr WalkVoid kVoids[] = {
      {"t-2", "b", true},
      {"t-3", "b", true},
      {"t-3", "a", false},
  };
  static constexpr BalanceMove kMoves[] = {{"a", 1000, 900}, {"b", 0, 100}};

  // The walk's rows, as stored: "postings|voids|balances".
  std::string walk_rows() {
    return sql("SELECT (SELECT coalesce(string_agg(transfer_id || ':' || account_id || ':' || "
               "kind || ':' || amount, ',' ORDER BY seq), '') FROM saga_postings) || '|' || "
               "(SELECT coalesce(string_agg(transfer_id || ':' || account_id || ':' || kind, ',' "
               "ORDER BY transfer_id, account_id, kind), '') FROM saga_leg_voids) || '|' || "
               "(SELECT string_agg(id || '=' || balance, ',' ORDER BY id) FROM saga_accounts)");
  }
  static constexpr const char* kWalkWritten =
      "t-1:a:debit:100,t-1:b:credit:100,t-2:a:debit:30,t-2:a:reverse_debit:30|"
      "t-2:b:credit,t-3:a:debit,t-3:b:credit|a=900,b=100,c=50";
  static constexpr const char* kNothingWritten = "||a=1000,b=0,c=50";

  // Sessions of this database waiting for a lock.
  int waiting() const {
    const RunResult r = server_.psql(
        db_, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND "
             "datname = '" + db_ + "'");
    return r.exit_code == 0 ? std::stoi(r.output) : -1;
  }

  // Whether another session can lock account `id` within 200 ms.
  bool lockable(const std::string& id) const {
    const RunResult r = server_.psql(
        db_, "SET lock_timeout = '200ms'; SELECT id FROM saga_accounts WHERE id = '" + id +
                 "' FOR UPDATE");
    return r.exit_code == 0;
  }

  PgServer& server_ = shared_pg_server();
  std::string db_, url_, other_db_;
  std::unique_ptr<Store> s1_, s2_;
};

TEST_F(PgTwoPhase, TheTestServerSupportsPrepare) { EXPECT_TRUE(s1_->supports_prepare()); }

TEST_F(PgTwoPhase, AServerWithoutPreparedTransactionsDoesNotSupportPrepare) {
  PgServer server({"max_prepared_transactions=0"});
  std::unique_ptr<Store> s = open(server.create_database("no_prepare"));
  ASSERT_NE(s, nullptr);
  SAGA_ASSERT_OK(s->init_schema());
  EXPECT_FALSE(s->supports_prepare());
  SAGA_ASSERT_OK(s->begin_scope());
  std::int64_t now = 0;
  SAGA_ASSERT_OK(s->now_ms(now));
  EXPECT_EQ(s->prepare_scope("g-none").kind(), ErrorKind::fatal);
  SAGA_EXPECT_OK(s->begin_scope());  // the scope ended
  SAGA_EXPECT_OK(s->end_scope(false));
}

TEST_F(PgTwoPhase, AWalkWritesPostingsVoidsAndBalancesVisibleAfterCommit) {
  ASSERT_NO_FATAL_FAILURE(lock(*s1_, {"a", "b"}));
  SAGA_ASSERT_OK(s1_->write_walk(kPostings, kVoids, kMoves));
  EXPECT_EQ(walk_rows(), kNothingWritten);  // queued, and uncommitted anyway
  SAGA_ASSERT_OK(s1_->end_scope(true));
  EXPECT_EQ(walk_rows(), kWalkWritten);
  std::vector<Posting> postings;
  SAGA_ASSERT_OK(s2_->postings_for_transfer("t-1", postings));
  ASSERT_EQ(postings.size(), 2u);
  EXPECT_GT(postings[0].at_ms, 0);
  EXPECT_EQ(postings[0].at_ms, postings[1].at_ms);
}

// More records than one statement carries (kStatementMax, 10,000): split
// over statements, one time for all of them.
TEST_F(PgTwoPhase, AWalkLongerThanAStatementIsWrittenWhole) {
  constexpr int kTransfers = 10'001;
  std::vector<std::string> ids;
  for (int i = 0; i < kTransfers; ++i) ids.push_back("t-" + std::to_string(i));
  std::vector<WalkPosting> postings;
  std::vector<WalkVoid> voids;
  for (const std::string& id : ids) {
    postings.push_back({id, "a", PostingKind::debit, 1});
    voids.push_back({id, "b", true});
  }
  postings.push_back({"t-0", "c", PostingKind::credit, 5});
  const BalanceMove moves[] = {{"a", 1000, 1000 - kTransfers}, {"c", 50, 55}};
  ASSERT_NO_FATAL_FAILURE(lock(*s1_, {"a", "b", "c"}));
  SAGA_ASSERT_OK(s1_->write_walk(postings, voids, moves));
  SAGA_ASSERT_OK(s1_->end_scope(true));
  EXPECT_EQ(sql("SELECT count(*) || '/' || count(DISTINCT at_ms) FROM saga_postings"), "10002/1");
  EXPECT_EQ(sql("SELECT count(*) FROM saga_leg_voids"), "10001");
  EXPECT_EQ(balance("a"), 1000 - kTransfers);
  EXPECT_EQ(balance("c"), 55);
}

TEST_F(PgTwoPhase, AWalkOutsideAScopeIsFatal) {
  EXPECT_EQ(s1_->write_walk(kPostings, kVoids, kMoves).kind(), ErrorKind::fatal);
  EXPECT_EQ(walk_rows(), kNothingWritten);
}

// Moves lock their accounts last, with COMMIT (or PREPARE), and stand where
// the rows as locked still give the walk's verdicts: here b's balance
// moved since the walk read it, and the walk refused a leg on it for its
// balance (t-2's credit is made to look so), so the scope fails and the
// batch would run again.
TEST_F(PgTwoPhase, AMoveThatNoLongerStandsFailsTheScopeAndNothingIsWritten) {
  ASSERT_NO_FATAL_FAILURE(lock(*s1_, {"a", "b"}));
  BalanceMove wrong[] = {{"a", 1000, 900}, {"b", 5, 105}};
  wrong[1].refused = true;
  SAGA_ASSERT_OK(s1_->write_walk(kPostings, kVoids, wrong));
  const Status st = s1_->end_scope(true);
  EXPECT_EQ(st.kind(), ErrorKind::retry_stage) << st.message();
  EXPECT_NE(st.message().find("no longer stands"), std::string::npos) << st.message();
  EXPECT_EQ(walk_rows(), kNothingWritten);
  // The connection is usable again, and so are the accounts.
  ASSERT_NO_FATAL_FAILURE(lock(*s1_, {"a", "b"}));
  SAGA_ASSERT_OK(s1_->write_walk(kPostings, kVoids, kMoves));
  SAGA_ASSERT_OK(s1_->end_scope(true));
  EXPECT_EQ(walk_rows(), kWalkWritten);
}

// A move whose account changed since the walk read it stands when every
// check the walk passed still passes: the balance moves by the walk's
// change, from where the row is.
TEST_F(PgTwoPhase, AMoveStandsOnARowThatChangedWhereItsChecksStillPass) {
  SAGA_ASSERT_OK(s1_->begin_scope());
  BalanceMove moved[] = {{"a", 1200, 1100}, {"b", 0, 100}};
  moved[0].low = 1100;  // a debit left 1,100 where it read 1,200: 900 on the row's 1,000
  SAGA_ASSERT_OK(s1_->write_walk(std::span(kPostings).first(2), {}, moved));
  SAGA_ASSERT_OK(s1_->end_scope(true));
  EXPECT_EQ(walk_rows(), "t-1:a:debit:100,t-1:b:credit:100||a=900,b=100,c=50");
  // A debit that passed on the balance as read but would not on the row
  // as it is now does not stand.
  SAGA_ASSERT_OK(s1_->begin_scope());
  BalanceMove short_of[] = {{"a", 2000, 1000}};
  short_of[0].low = 1000;  // 1,000 below what was read: the row's 900 would go to -100
  SAGA_ASSERT_OK(s1_->write_walk(std::span(kPostings).subspan(2, 1), {}, short_of));
  EXPECT_EQ(s1_->end_scope(true).kind(), ErrorKind::retry_stage);
  EXPECT_EQ(walk_rows(), "t-1:a:debit:100,t-1:b:credit:100||a=900,b=100,c=50");
}

// Moves lock their accounts in id order, whatever order the walk gives
// them in (the store sends them sorted; saga_walk_move sorts what is not):
// with a held by another scope, a walk that moves b, then a, waits on a
// before it locks b. The walk's session plans as on a ledger of many
// accounts, where the lock pass follows the moves' order (on three rows
// the server would scan the table instead).
TEST_F(PgTwoPhase, MovesLockTheirAccountsInIdOrderWhateverOrderTheyComeIn) {
  sql("ALTER DATABASE " + db_ + " SET enable_seqscan = off");
  sql("ALTER DATABASE " + db_ + " SET enable_hashjoin = off");
  sql("ALTER DATABASE " + db_ + " SET enable_mergejoin = off");
  const std::unique_ptr<Store> walker = open(url_);
  ASSERT_NE(walker, nullptr);
  ASSERT_NO_FATAL_FAILURE(lock(*s2_, {"a"}));
  SAGA_ASSERT_OK(walker->begin_scope());
  const BalanceMove reversed[] = {kMoves[1], kMoves[0]};
  SAGA_ASSERT_OK(walker->write_walk(kPostings, kVoids, reversed));
  auto commit = std::async(std::launch::async, [&] { return walker->end_scope(true); });
  for (int i = 0; i < 500 && waiting() != 1; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(waiting(), 1);
  EXPECT_TRUE(lockable("b"));
  SAGA_ASSERT_OK(s2_->end_scope(false));
  SAGA_EXPECT_OK(commit.get());
  EXPECT_EQ(walk_rows(), kWalkWritten);
}

// Moves not in the server's id order (an older worker's, or ids that do not
// collate as "C") are sorted by saga_walk_move, and stand or fail as
// sorted ones do.
TEST_F(PgTwoPhase, MovesOutOfIdOrderAreSortedByTheServer) {
  const auto call = [](const std::string& b_from, const std::string& b_refused) {
    return "SELECT saga_walk_move(ARRAY['b', 'a'], ARRAY[" + b_from + ", 1000]::bigint[], "
           "ARRAY[100, 900]::bigint[], ARRAY[0, 0]::bigint[], ARRAY[0, 0]::bigint[], ARRAY['', ''], "
           "ARRAY[false, false], ARRAY[NULL, 900]::bigint[], ARRAY[NULL, NULL]::bigint[], "
           "ARRAY[100, NULL]::bigint[], ARRAY[" + b_refused + ", false])";
  };
  const RunResult stale = server_.psql(db_, call("5", "true"));  // b read at 5, refused for it
  EXPECT_NE(stale.exit_code, 0);
  EXPECT_NE(stale.output.find("no longer stands"), std::string::npos) << stale.output;
  EXPECT_EQ(walk_rows(), kNothingWritten);
  sql(call("0", "false"));
  EXPECT_EQ(walk_rows(), "||a=900,b=100,c=50");
}

// Prepared, the walk is durable but invisible, and its accounts stay locked
// after the session moved on; COMMIT PREPARED, from another session as
// recovery would, makes it visible; finishing it again is a no-op.
TEST_F(PgTwoPhase, APreparedScopeHoldsItsLocksUntilCommitPrepared) {
  ASSERT_NO_FATAL_FAILURE(lock(*s1_, {"a", "b"}));
  SAGA_ASSERT_OK(s1_->write_walk(kPostings, kVoids, kMoves));
  SAGA_ASSERT_OK(s1_->prepare_scope("sagapool-test-1"));
  EXPECT_EQ(sql("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"),
            "sagapool-test-1");
  EXPECT_EQ(walk_rows(), kNothingWritten);
  EXPECT_FALSE(lockable("a"));
  EXPECT_FALSE(lockable("b"));
  EXPECT_TRUE(lockable("c"));
  // The session is idle, with no scope open: it runs the next one.
  ASSERT_NO_FATAL_FAILURE(lock(*s1_, {"c"}));
  SAGA_ASSERT_OK(s1_->end_scope(true));
  SAGA_EXPECT_OK(s1_->finish_prepared("sagapool-test-1", true));

  EXPECT_EQ(walk_rows(), kWalkWritten);
  EXPECT_TRUE(lockable("a"));
  EXPECT_EQ(sql("SELECT count(*) FROM pg_prepared_xacts"), "0");
  SAGA_EXPECT_OK(s2_->finish_prepared("sagapool-test-1", true));
  SAGA_EXPECT_OK(s2_->finish_prepared("sagapool-test-1", false));
}

TEST_F(PgTwoPhase, RollbackPreparedDiscardsTheWalk) {
  ASSERT_NO_FATAL_FAILURE(lock(*s1_, {"a", "b"}));
  SAGA_ASSERT_OK(s1_->write_walk(kPostings, kVoids, kMoves));
  // A gid with a quote: a literal, quoted.
  SAGA_ASSERT_OK(s1_->prepare_scope("it's-2"));
  EXPECT_EQ(sql("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"), "it's-2");
  SAGA_ASSERT_OK(s2_->finish_prepared("it's-2", false));
  EXPECT_EQ(walk_rows(), kNothingWritten);
  EXPECT_TRUE(lockable("a"));
  EXPECT_EQ(sql("SELECT count(*) FROM pg_prepared_xacts"), "0");
}

TEST_F(PgTwoPhase, FinishingAnUnknownGidIsOk) {
  SAGA_EXPECT_OK(s1_->finish_prepared("never-prepared", true));
  SAGA_EXPECT_OK(s1_->finish_prepared("never-prepared", false));
  SAGA_ASSERT_OK(s1_->begin_scope());
  // Inside a scope: refused.
  EXPECT_EQ(s1_->finish_prepared("never-prepared", true).kind(), ErrorKind::fatal);
  SAGA_ASSERT_OK(s1_->end_scope(false));
}

TEST_F(PgTwoPhase, AnEmptyScopePreparesNothing) {
  SAGA_ASSERT_OK(s1_->begin_scope());
  SAGA_ASSERT_OK(s1_->prepare_scope("empty-1"));
  EXPECT_EQ(sql("SELECT count(*) FROM pg_prepared_xacts"), "0");
  SAGA_EXPECT_OK(s1_->begin_scope());  // the scope ended
  SAGA_EXPECT_OK(s1_->end_scope(false));
  EXPECT_EQ(s1_->prepare_scope("empty-2").kind(), ErrorKind::fatal);  // no scope open
}

TEST_F(PgTwoPhase, BadGidsAreFatalAndEndTheScope) {
  for (const std::string& gid : {std::string(), std::string(200, 'g'), std::string("a\0b", 3)}) {
    ASSERT_NO_FATAL_FAILURE(lock(*s1_, {"a"}));
    EXPECT_EQ(s1_->prepare_scope(gid).kind(), ErrorKind::fatal) << gid.size();
    EXPECT_TRUE(lockable("a"));  // rolled back
  }
  ASSERT_NO_FATAL_FAILURE(lock(*s1_, {"a"}));
  SAGA_ASSERT_OK(s1_->prepare_scope(std::string(199, 'g')));
  SAGA_ASSERT_OK(s1_->finish_prepared(std::string(199, 'g'), false));
}

// The first store's scope (it inserted transfers) and one that used the
// session's temporary tables (legs) are refused, rolled back.
TEST_F(PgTwoPhase, OnlyAWalksScopeIsPrepared) {
  SAGA_ASSERT_OK(s1_->begin_scope());
  InsertResult inserted{};
  SAGA_ASSERT_OK(insert_one(*s1_, spec("t-9", "a", "b"), "w1", 60'000, inserted));
  ASSERT_EQ(inserted, InsertResult::inserted);
  Status st = s1_->prepare_scope("kept-1");
  EXPECT_EQ(st.kind(), ErrorKind::fatal) << st.message();
  std::optional<TransferDoc> doc;
  SAGA_ASSERT_OK(s2_->load_transfer("t-9", doc));
  EXPECT_FALSE(doc.has_value());

  SAGA_ASSERT_OK(s1_->begin_scope());
  const LegRequest debit{LegOp::debit, "t-8", "a", 10, ""};
  LegResult result;
  SAGA_ASSERT_OK(s1_->apply_legs(std::span(&debit, 1), std::span(&result, 1)));
  st = s1_->prepare_scope("legs-1");
  EXPECT_EQ(st.kind(), ErrorKind::fatal) << st.message();
  EXPECT_EQ(sql("SELECT count(*) FROM pg_prepared_xacts"), "0");
  EXPECT_EQ(balance("a"), 1000);
  EXPECT_TRUE(lockable("a"));
}

// This database's prepared transactions, by prefix (not a pattern) and by
// age on the server's clock, oldest first; counted with the oldest's time
// for monitoring.
TEST_F(PgTwoPhase, PreparedTransactionsAreListedAndCountedByPrefixAndAge) {
  other_db_ = db_ + "_other";
  std::unique_ptr<Store> elsewhere = open(server_.create_database(other_db_));
  ASSERT_NE(elsewhere, nullptr);
  SAGA_ASSERT_OK(elsewhere->init_schema());
  std::unique_ptr<Store> s3 = open(url_);
  ASSERT_NE(s3, nullptr);
  // A scope that sent something (the clock) prepares.
  const auto prepare = [](Store& s, const std::string& gid) {
    SAGA_ASSERT_OK(s.begin_scope());
    std::int64_t now = 0;
    SAGA_ASSERT_OK(s.now_ms(now));
    SAGA_ASSERT_OK(s.prepare_scope(gid));
  };
  ASSERT_NO_FATAL_FAILURE(prepare(*s1_, "p1-old"));
  ASSERT_NO_FATAL_FAILURE(prepare(*elsewhere, "p1-elsewhere"));
  std::this_thread::sleep_for(1500ms);
  ASSERT_NO_FATAL_FAILURE(prepare(*s2_, "p1-new"));
  ASSERT_NO_FATAL_FAILURE(prepare(*s3, "q1-new"));

  std::vector<std::string> gids;
  SAGA_ASSERT_OK(s1_->list_prepared("p1-", 0, gids));
  EXPECT_EQ(gids, (std::vector<std::string>{"p1-old", "p1-new"}));
  SAGA_ASSERT_OK(s1_->list_prepared("", 0, gids));
  EXPECT_EQ(gids, (std::vector<std::string>{"p1-old", "p1-new", "q1-new"}));
  SAGA_ASSERT_OK(s1_->list_prepared("p1-", 1000, gids));
  EXPECT_EQ(gids, (std::vector<std::string>{"p1-old"}));
  SAGA_ASSERT_OK(s1_->list_prepared("p1-", 600'000, gids));
  EXPECT_TRUE(gids.empty());
  SAGA_ASSERT_OK(s1_->list_prepared("p_-", 0, gids));
  EXPECT_TRUE(gids.empty());
  SAGA_ASSERT_OK(s1_->list_prepared("%", 0, gids));
  EXPECT_TRUE(gids.empty());

  std::int64_t now = 0;
  SAGA_ASSERT_OK(s1_->now_ms(now));
  PreparedStats p1;
  PreparedStats q1;
  PreparedStats all;
  SAGA_ASSERT_OK(s1_->prepared_stats("p1-", p1));
  SAGA_ASSERT_OK(s1_->prepared_stats("q1-", q1));
  SAGA_ASSERT_OK(s1_->prepared_stats("", all));
  EXPECT_EQ(p1.count, 2);
  EXPECT_EQ(q1.count, 1);
  EXPECT_EQ(all.count, 3);
  // p1-old, 1.5 s before q1-new.
  EXPECT_EQ(all.oldest_ms, p1.oldest_ms);
  EXPECT_GE(q1.oldest_ms - p1.oldest_ms, 1400);
  EXPECT_LE(q1.oldest_ms, now);
  EXPECT_GE(p1.oldest_ms, now - 60'000);
  PreparedStats none;
  SAGA_ASSERT_OK(s1_->prepared_stats("p_-", none));
  EXPECT_EQ(none.count, 0);
  EXPECT_EQ(none.oldest_ms, 0);

  for (const char* gid : {"p1-old", "p1-new", "q1-new"}) {
    SAGA_EXPECT_OK(s1_->finish_prepared(gid, false));
  }
  SAGA_EXPECT_OK(elsewhere->finish_prepared("p1-elsewhere", false));
  SAGA_ASSERT_OK(s1_->prepared_stats("", all));
  EXPECT_EQ(all.count, 0);
  EXPECT_EQ(all.oldest_ms, 0);
}

TEST_F(PgTwoPhase, ADecisionCommittedWithItsScopeDecidesCommitted) {
  SAGA_ASSERT_OK(s1_->begin_scope());
  SAGA_ASSERT_OK(s1_->record_decision("g-1"));
  SAGA_ASSERT_OK(s1_->end_scope(true));
  bool committed = false;
  SAGA_ASSERT_OK(s2_->decide("g-1", committed));
  EXPECT_TRUE(committed);
  EXPECT_EQ(sql("SELECT committed FROM saga_decisions WHERE gid = 'g-1'"), "t");
  // Outside a scope, recording is refused; inside one, deciding is.
  EXPECT_EQ(s1_->record_decision("g-x").kind(), ErrorKind::fatal);
  SAGA_ASSERT_OK(s1_->begin_scope());
  EXPECT_EQ(s1_->decide("g-1", committed).kind(), ErrorKind::fatal);
  SAGA_ASSERT_OK(s1_->end_scope(false));
}

// A scope that rolls back leaves no decision; decide then records an abort,
// and a later scope recording the same gid cannot commit.
TEST_F(PgTwoPhase, NoDecisionDecidesAbortedForGood) {
  SAGA_ASSERT_OK(s1_->begin_scope());
  SAGA_ASSERT_OK(s1_->record_decision("g-2"));
  std::int64_t now = 0;
  SAGA_ASSERT_OK(s1_->now_ms(now));  // executed with it
  SAGA_ASSERT_OK(s1_->end_scope(false));
  bool committed = true;
  SAGA_ASSERT_OK(s2_->decide("g-2", committed));
  EXPECT_FALSE(committed);
  SAGA_ASSERT_OK(s2_->decide("g-2", committed));
  EXPECT_FALSE(committed);

  SAGA_ASSERT_OK(s1_->begin_scope());
  SAGA_ASSERT_OK(s1_->record_decision("g-2"));
  const Status st = s1_->end_scope(true);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.kind(), ErrorKind::fatal) << st.message();
  SAGA_ASSERT_OK(s2_->decide("g-2", committed));
  EXPECT_FALSE(committed);
  EXPECT_EQ(sql("SELECT committed FROM saga_decisions WHERE gid = 'g-2'"), "f");
}

// decide waits for a scope that recorded the gid and is still open: its
// commit (or rollback) decides.
TEST_F(PgTwoPhase, DecideWaitsForAnOpenScopeThatRecordedTheGid) {
  for (const bool commit : {true, false}) {
    SCOPED_TRACE(commit ? "commit" : "rollback");
    const std::string gid = commit ? "g-3" : "g-4";
    SAGA_ASSERT_OK(s1_->begin_scope());
    SAGA_ASSERT_OK(s1_->record_decision(gid));
    std::int64_t now = 0;
    SAGA_ASSERT_OK(s1_->now_ms(now));  // the insert is executed, not committed
    auto decided = std::async(std::launch::async, [&] {
      bool committed = !commit;
      const Status st = s2_->decide(gid, committed);
      return std::pair(st, committed);
    });
    EXPECT_TRUE(eventually([&] { return waiting() >= 1; }, 5s));
    EXPECT_EQ(decided.wait_for(200ms), std::future_status::timeout);
    SAGA_EXPECT_OK(s1_->end_scope(commit));
    ASSERT_EQ(decided.wait_for(10s), std::future_status::ready);
    const auto [st, committed] = decided.get();
    SAGA_EXPECT_OK(st);
    EXPECT_EQ(committed, commit);
  }
}

TEST_F(PgTwoPhase, ALockTimeoutWhileDecidingIsRetryCall) {
  std::unique_ptr<Store> impatient = open(url_ + "?options=-c%20lock_timeout%3D200ms");
  ASSERT_NE(impatient, nullptr);
  SAGA_ASSERT_OK(s1_->begin_scope());
  SAGA_ASSERT_OK(s1_->record_decision("g-5"));
  std::int64_t now = 0;
  SAGA_ASSERT_OK(s1_->now_ms(now));
  bool committed = true;
  const Status st = impatient->decide("g-5", committed);
  EXPECT_EQ(st.kind(), ErrorKind::retry_call) << st.message();
  SAGA_ASSERT_OK(s1_->end_scope(true));
  SAGA_ASSERT_OK(impatient->decide("g-5", committed));
  EXPECT_TRUE(committed);
}

TEST_F(PgTwoPhase, DecisionsAreListedOldestFirstAndForgotten) {
  for (const char* gid : {"g-a", "g-b", "g-c"}) {
    SAGA_ASSERT_OK(s1_->begin_scope());
    SAGA_ASSERT_OK(s1_->record_decision(gid));
    SAGA_ASSERT_OK(s1_->end_scope(true));
    std::this_thread::sleep_for(5ms);
  }
  std::vector<std::string> gids;
  SAGA_ASSERT_OK(s1_->list_decisions(0, 10, gids));
  EXPECT_EQ(gids, (std::vector<std::string>{"g-a", "g-b", "g-c"}));
  SAGA_ASSERT_OK(s1_->list_decisions(0, 2, gids));
  EXPECT_EQ(gids, (std::vector<std::string>{"g-a", "g-b"}));
  SAGA_ASSERT_OK(s1_->list_decisions(600'000, 10, gids));
  EXPECT_TRUE(gids.empty());
  SAGA_ASSERT_OK(s1_->list_decisions(0, 0, gids));
  EXPECT_TRUE(gids.empty());

  SAGA_ASSERT_OK(s1_->forget_decisions(std::vector<std::string>{}));
  SAGA_ASSERT_OK(s1_->forget_decisions(std::vector<std::string>{"g-a", "g-unknown"}));
  SAGA_ASSERT_OK(s1_->list_decisions(0, 10, gids));
  EXPECT_EQ(gids, (std::vector<std::string>{"g-b", "g-c"}));
  // Inside a scope: queued, gone with its commit (and kept by a rollback).
  SAGA_ASSERT_OK(s1_->begin_scope());
  SAGA_ASSERT_OK(s1_->forget_decisions(std::vector<std::string>{"g-b"}));
  SAGA_ASSERT_OK(s1_->end_scope(false));
  SAGA_ASSERT_OK(s1_->begin_scope());
  SAGA_ASSERT_OK(s1_->forget_decisions(std::vector<std::string>{"g-c"}));
  SAGA_ASSERT_OK(s1_->end_scope(true));
  SAGA_ASSERT_OK(s1_->list_decisions(0, 10, gids));
  EXPECT_EQ(gids, (std::vector<std::string>{"g-b"}));
}

// The worker's order on a store other than the first, and the first's
// commit point: the decision, then the prepared walk committed by it.
TEST_F(PgTwoPhase, ABatchAcrossTwoDatabasesCommitsInTwoPhases) {
  other_db_ = db_ + "_second";
  std::unique_ptr<Store> second = open(server_.create_database(other_db_));
  ASSERT_NE(second, nullptr);
  SAGA_ASSERT_OK(second->init_schema());
  SAGA_ASSERT_OK(second->create_accounts(std::vector<Account>{make_account("b", 0)}));

  SAGA_ASSERT_OK(s1_->begin_scope());
  SAGA_ASSERT_OK(s1_->record_decision("batch-1"));
  InsertResult inserted{};
  SAGA_ASSERT_OK(insert_one(*s1_, spec("t-1", "a", "b", 100), "w1", 60'000, inserted));
  std::vector<std::optional<Account>> out(1);
  SAGA_ASSERT_OK(s1_->load_accounts(std::vector<std::string_view>{"a"}, out));
  ASSERT_NO_FATAL_FAILURE(lock(*second, {"b"}));
  const WalkPosting debit{"t-1", "a", PostingKind::debit, 100};
  const BalanceMove a_move{"a", 1000, 900};
  SAGA_ASSERT_OK(s1_->write_walk(std::span(&debit, 1), {}, std::span(&a_move, 1)));
  const WalkPosting credit{"t-1", "b", PostingKind::credit, 100};
  const BalanceMove b_move{"b", 0, 100};
  SAGA_ASSERT_OK(second->write_walk(std::span(&credit, 1), {}, std::span(&b_move, 1)));
  const Transition done{"t-1", TransferState::initial, TransferState::done, Reason::none, "w1", 1};
  std::uint8_t applied = 0;
  SAGA_ASSERT_OK(s1_->transition(std::span(&done, 1), 60'000, std::span(&applied, 1), nullptr));
  EXPECT_EQ(applied, 1);
  SAGA_ASSERT_OK(second->prepare_scope("batch-1"));
  SAGA_ASSERT_OK(s1_->end_scope(true));
  bool committed = false;
  SAGA_ASSERT_OK(s2_->decide("batch-1", committed));
  EXPECT_TRUE(committed);
  SAGA_ASSERT_OK(second->finish_prepared("batch-1", committed));

  EXPECT_EQ(balance("a"), 900);
  std::optional<Account> b;
  SAGA_ASSERT_OK(second->load_account("b", b));
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->balance, 100);
  std::optional<TransferDoc> doc;
  SAGA_ASSERT_OK(s2_->load_transfer("t-1", doc));
  ASSERT_TRUE(doc.has_value());
  EXPECT_EQ(doc->state, TransferState::done);
  SAGA_ASSERT_OK(s1_->forget_decisions(std::vector<std::string>{"batch-1"}));
  std::vector<std::string> gids;
  SAGA_ASSERT_OK(s1_->list_decisions(0, 10, gids));
  EXPECT_TRUE(gids.empty());
}

}  // namespace
}  // namespace sagapool::test
