// What the conformance suite does not cover of the in-memory store: scopes
// with real rollback, SQLite-like locking while a scope is open, a dropped
// connection rolling its scope back, the manual clock, and the record of
// transfers moving backwards.
#include <gtest/gtest.h>

#include "sagapool/memory_store.hpp"

namespace sagapool::sim {
namespace {

Account account(const std::string& id, std::int64_t balance) {
  Account a;
  a.id = id;
  a.balance = a.opening_balance = balance;
  return a;
}

NewTransfer transfer(const std::string& id) {
  static std::vector<std::string> keep;  // NewTransfer only views its strings
  keep.push_back(id);
  NewTransfer t;
  t.request.id = keep.back();
  t.request.from = "a";
  t.request.to = "b";
  t.request.amount = 10;
  t.payload_hash = payload_hash(t.request);
  return t;
}

class MemoryStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    db_ = make_memory_db(clock_);
    s1_ = connect(db_);
    s2_ = connect(db_);
    const std::vector<Account> accounts = {account("a", 100), account("b", 0)};
    ASSERT_TRUE(s1_->create_accounts(accounts).is_ok());
  }
  std::int64_t balance(Store& s, const std::string& id) {
    std::optional<Account> a;
    EXPECT_TRUE(s.load_account(id, a).is_ok());
    return a ? a->balance : -1;
  }
  LegResult debit(Store& s, const std::string& transfer, std::int64_t amount) {
    const LegRequest leg{LegOp::debit, transfer, "a", amount, {}};
    LegResult r;
    EXPECT_TRUE(s.apply_legs({&leg, 1}, {&r, 1}).is_ok());
    return r;
  }

  std::shared_ptr<ManualClock> clock_ = std::make_shared<ManualClock>(1'000'000);
  std::shared_ptr<MemoryDb> db_;
  std::unique_ptr<Store> s1_;
  std::unique_ptr<Store> s2_;
};

TEST_F(MemoryStoreTest, AScopeRollsBackEverythingAndCommitsEverything) {
  ASSERT_TRUE(s1_->supports_scope());
  ASSERT_TRUE(s1_->begin_scope().is_ok());
  const NewTransfer t = transfer("t-1");
  InsertResult r;
  ASSERT_TRUE(s1_->insert_transfers({&t, 1}, "w", 1000, {&r, 1}).is_ok());
  EXPECT_EQ(debit(*s1_, "t-1", 30).status, LegStatus::posted);
  EXPECT_EQ(balance(*s1_, "a"), 70);
  ASSERT_TRUE(s1_->end_scope(false).is_ok());
  EXPECT_EQ(balance(*s1_, "a"), 100);
  std::optional<TransferDoc> d;
  ASSERT_TRUE(s1_->load_transfer("t-1", d).is_ok());
  EXPECT_FALSE(d.has_value());
  std::vector<Posting> postings;
  ASSERT_TRUE(s1_->postings_for_transfer("t-1", postings).is_ok());
  EXPECT_TRUE(postings.empty());
  std::vector<std::string> pending;
  ASSERT_TRUE(s1_->pending_for_account("a", pending).is_ok());
  EXPECT_TRUE(pending.empty());

  ASSERT_TRUE(s1_->begin_scope().is_ok());
  EXPECT_EQ(debit(*s1_, "t-1", 30).status, LegStatus::posted);
  ASSERT_TRUE(s1_->end_scope(true).is_ok());
  EXPECT_EQ(balance(*s2_, "a"), 70);
  EXPECT_EQ(s1_->end_scope(true).kind(), ErrorKind::fatal) << "no scope is open";
  EXPECT_TRUE(s1_->end_scope(false).is_ok());
}

TEST_F(MemoryStoreTest, OtherConnectionsAreLockedOutWhileAScopeIsOpen) {
  ASSERT_TRUE(s1_->begin_scope().is_ok());
  EXPECT_EQ(s1_->begin_scope().kind(), ErrorKind::fatal);
  std::optional<Account> a;
  EXPECT_EQ(s2_->load_account("a", a).kind(), ErrorKind::retry_call);
  EXPECT_EQ(s2_->begin_scope().kind(), ErrorKind::retry_call);
  LegResult r;
  const LegRequest leg{LegOp::debit, "t-2", "a", 5, {}};
  EXPECT_EQ(s2_->apply_legs({&leg, 1}, {&r, 1}).kind(), ErrorKind::retry_call);
  ASSERT_TRUE(s1_->end_scope(true).is_ok());
  EXPECT_TRUE(s2_->load_account("a", a).is_ok());
}

TEST_F(MemoryStoreTest, ADroppedConnectionRollsItsScopeBack) {
  ASSERT_TRUE(s1_->begin_scope().is_ok());
  EXPECT_EQ(debit(*s1_, "t-1", 40).status, LegStatus::posted);
  s1_.reset();  // the process died mid-transaction
  EXPECT_FALSE(db_->scope_open());
  EXPECT_EQ(balance(*s2_, "a"), 100);
}

TEST_F(MemoryStoreTest, AFailedBatchLeavesNothingBehind) {
  const std::vector<LegRequest> legs = {{LegOp::debit, "t-1", "a", 10, {}}, {LegOp::debit, "t-2", "a", 0, {}}};
  std::vector<LegResult> results(legs.size());
  EXPECT_EQ(s1_->apply_legs(legs, results).kind(), ErrorKind::fatal);
  EXPECT_EQ(balance(*s1_, "a"), 100);
}

TEST_F(MemoryStoreTest, LeasesFollowTheManualClock) {
  const NewTransfer t = transfer("t-lease");
  InsertResult r;
  ASSERT_TRUE(s1_->insert_transfers({&t, 1}, "w", 1000, {&r, 1}).is_ok());
  std::vector<TransferDoc> claimed;
  clock_->advance(1000);
  ASSERT_TRUE(s2_->claim_expired("w2", 1000, 10, claimed).is_ok());
  EXPECT_TRUE(claimed.empty()) << "leases compare strictly";
  clock_->advance(1);
  ASSERT_TRUE(s2_->claim_expired("w2", 1000, 10, claimed).is_ok());
  ASSERT_EQ(claimed.size(), 1U);
  EXPECT_EQ(claimed[0].epoch, 2);
  EXPECT_EQ(claimed[0].lease_until_ms, 1'002'001);
}

TEST_F(MemoryStoreTest, ATransferMovingBackwardsIsRecorded) {
  const NewTransfer t = transfer("t-back");
  InsertResult r;
  ASSERT_TRUE(s1_->insert_transfers({&t, 1}, "w", 1000, {&r, 1}).is_ok());
  const std::vector<Transition> forward = {{"t-back", TransferState::initial, TransferState::done, Reason::none, "w", 1}};
  std::vector<std::uint8_t> applied(1);
  ASSERT_TRUE(s1_->transition(forward, 1000, applied).is_ok());
  EXPECT_TRUE(db_->illegal_transitions().empty()) << "initial -> done is ahead (a coalesced write)";
  const std::vector<Transition> back = {{"t-back", TransferState::done, TransferState::pending, Reason::none, "w", 1}};
  ASSERT_TRUE(s1_->transition(back, 1000, applied).is_ok());
  ASSERT_EQ(db_->illegal_transitions().size(), 1U);
  EXPECT_EQ(db_->illegal_transitions()[0], "t-back: done -> pending by w@1");
}

}  // namespace
}  // namespace sagapool::sim
