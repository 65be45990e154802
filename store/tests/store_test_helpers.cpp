// The fixture's helpers, the same for every backend: store_fixture.cpp
// (stores opened by URL) and instantiate_memory.cpp (in-memory stores) each
// define only how a store is opened.
#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <set>
#include <thread>

#include "store_test.hpp"

namespace sagapool::test {

RequestView TransferSpec::view() const {
  RequestView r;
  r.id = id;
  r.from = from;
  r.to = to;
  r.amount = amount;
  r.currency = currency;
  r.metadata = metadata;
  return r;
}

NewTransfer TransferSpec::to_new() const {
  NewTransfer t;
  t.request = view();
  t.payload_hash = hash ? *hash : payload_hash(t.request);
  t.requested_at_ms = requested_at_ms;
  t.origin_topic = topic;
  t.origin_partition = partition;
  t.origin_offset = offset;
  return t;
}

LegOp leg_op_for_roll(std::uint64_t roll) {
  return roll < 35   ? LegOp::debit
         : roll < 65 ? LegOp::credit
         : roll < 80 ? LegOp::cancel_debit
         : roll < 90 ? LegOp::cancel_credit
                     : LegOp::release;
}

void StoreTest::SetUp() {
  store_ = fresh_store();
  ASSERT_NE(store_, nullptr);
}

Status insert_one(Store& s, const TransferSpec& t, std::string_view owner, std::int64_t lease_ms,
                  InsertResult& result) {
  const NewTransfer n = t.to_new();
  return s.insert_transfers(std::span(&n, 1), owner, lease_ms, std::span(&result, 1));
}

std::string unpublished_ids(Store& s) {
  std::string out;
  EXPECT_TRUE(s.scan_transfer_states([&](std::string_view id, TransferState st, bool notified) {
                 if (is_terminal(st) && !notified) out += std::string(id) + ",";
               }).is_ok());
  return out;
}

std::string unpublished_counts(Store& s, std::int64_t finished_at_ms) {
  StateStatsTable stats;
  EXPECT_TRUE(s.state_stats(stats).is_ok());
  const StateStats& done = stats[static_cast<std::size_t>(TransferState::done)];
  const StateStats& canceled = stats[static_cast<std::size_t>(TransferState::canceled)];
  EXPECT_EQ(stats[static_cast<std::size_t>(TransferState::initial)].count, 1);
  if (done.count > 0) {
    EXPECT_EQ(done.oldest_ms, finished_at_ms);
  }
  return std::to_string(done.count) + "/" + std::to_string(canceled.count);
}

void expect_reclaimed(const std::vector<TransferDoc>& claimed, const std::set<std::string>& ids,
                      std::string_view owner) {
  std::set<std::string> got;
  for (const TransferDoc& d : claimed) {
    got.insert(d.id);
    EXPECT_EQ(d.state, TransferState::done);
    EXPECT_FALSE(d.notified);
    EXPECT_EQ(d.owner, owner);
    EXPECT_EQ(d.epoch, 2);
    EXPECT_EQ(d.attempts, 1);
  }
  EXPECT_EQ(got, ids);
}

InsertResult StoreTest::insert(const TransferSpec& t, std::string_view owner,
                               std::int64_t lease_ms) {
  InsertResult r = InsertResult::conflict;
  const Status s = insert_one(*store_, t, owner, lease_ms, r);
  EXPECT_TRUE(s.is_ok()) << s.message();
  return r;
}

TransferDoc StoreTest::load(std::string_view id) {
  std::optional<TransferDoc> d;
  const Status s = store_->load_transfer(id, d);
  EXPECT_TRUE(s.is_ok()) << s.message();
  EXPECT_TRUE(d.has_value()) << "transfer " << id << " not found";
  return d.value_or(TransferDoc{});
}

bool StoreTest::transition(std::string_view id, TransferState from, TransferState to,
                           std::string_view owner, std::int64_t epoch, Reason reason,
                           std::int64_t lease_ms) {
  Transition t{id, from, to, reason, owner, epoch};
  std::uint8_t applied = 2;
  const Status s = store_->transition(std::span(&t, 1), lease_ms, std::span(&applied, 1));
  EXPECT_TRUE(s.is_ok()) << s.message();
  EXPECT_LE(applied, 1);
  return applied == 1;
}

void StoreTest::create(Store& s, const Account& a) {
  const Status st = s.create_accounts(std::span(&a, 1));
  EXPECT_TRUE(st.is_ok()) << st.message();
}

Account StoreTest::account(std::string_view id) {
  std::optional<Account> a;
  const Status s = store_->load_account(id, a);
  EXPECT_TRUE(s.is_ok()) << s.message();
  EXPECT_TRUE(a.has_value()) << "account " << id << " not found";
  return a.value_or(Account{});
}

LegResult StoreTest::leg(LegOp op, std::string_view transfer, std::string_view account_id,
                         std::int64_t amount, std::string_view currency) {
  const LegRequest req{op, transfer, account_id, amount, currency};
  LegResult r;
  r.account_currency = "unset";
  const Status s = store_->apply_legs(std::span(&req, 1), std::span(&r, 1));
  EXPECT_TRUE(s.is_ok()) << s.message();
  return r;
}

void StoreTest::expect_legs(std::string_view transfer, std::string_view account_id,
                            std::int64_t amount, const std::vector<std::pair<LegOp, LegStatus>>& ops) {
  std::size_t step = 0;
  for (const auto& [op, want] : ops) {
    ++step;
    EXPECT_EQ(leg(op, transfer, account_id, amount).status, want)
        << transfer << " on " << account_id << ", leg " << step << " of " << ops.size();
  }
}

void StoreTest::expect_legs(std::string_view transfer, std::string_view account_id,
                            std::int64_t amount, std::initializer_list<LegOp> ops, LegStatus want) {
  std::vector<std::pair<LegOp, LegStatus>> each;
  for (const LegOp op : ops) each.emplace_back(op, want);
  expect_legs(transfer, account_id, amount, each);
}

std::vector<Posting> StoreTest::postings(std::string_view transfer) {
  std::vector<Posting> out;
  const Status s = store_->postings_for_transfer(transfer, out);
  EXPECT_TRUE(s.is_ok()) << s.message();
  return out;
}

std::vector<std::string> StoreTest::pending(std::string_view account_id) {
  std::vector<std::string> out;
  const Status s = store_->pending_for_account(account_id, out);
  EXPECT_TRUE(s.is_ok()) << s.message();
  std::sort(out.begin(), out.end());
  return out;
}

std::int64_t StoreTest::store_now() {
  std::int64_t now = 0;
  const Status s = store_->now_ms(now);
  EXPECT_TRUE(s.is_ok()) << s.message();
  return now;
}

void StoreTest::wait_store_clock_past(std::int64_t t) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (store_now() <= t) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "store clock stuck";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void StoreTest::expect_balances_match_postings(Store& s, bool exact_reservations) {
  std::map<std::string, std::int64_t> sums;
  // (transfer, account) -> amount of a debit posted there and not reversed
  std::map<std::pair<std::string, std::string>, std::int64_t> reversible;
  std::set<std::pair<std::string, std::string>> reversed;
  SAGA_ASSERT_OK(s.scan_postings([&](const Posting& p) {
    sums[p.account_id] += signed_amount(p.kind, p.amount);
    if (p.kind == PostingKind::debit) reversible[{p.transfer_id, p.account_id}] = p.amount;
    if (p.kind == PostingKind::reverse_debit) reversed.emplace(p.transfer_id, p.account_id);
  }));
  for (const auto& key : reversed) reversible.erase(key);
  // The reservation: what the pending entries of reversible debits hold.
  std::map<std::string, std::int64_t> reserved;
  SAGA_ASSERT_OK(s.scan_pending([&](const PendingEntry& e) {
    const auto it = reversible.find({e.transfer_id, e.account_id});
    if (it != reversible.end()) reserved[e.account_id] += it->second;
  }));
  std::size_t accounts = 0;
  SAGA_ASSERT_OK(s.scan_accounts([&](const Account& a) {
    ++accounts;
    EXPECT_EQ(a.balance, a.opening_balance + sums[a.id]) << "account " << a.id;
    EXPECT_GE(a.balance, a.min_balance) << "account " << a.id;
    if (exact_reservations) {
      EXPECT_EQ(a.reserved, reserved[a.id]) << "account " << a.id;
    }
    EXPECT_GE(a.reserved, 0) << "account " << a.id;
    EXPECT_TRUE(a.balance < 0 || a.reserved <= std::numeric_limits<std::int64_t>::max() - a.balance)
        << "account " << a.id << ": balance + reserved passes INT64_MAX";
  }));
  EXPECT_GT(accounts, 0U);
}

}  // namespace sagapool::test
