#pragma once
// The store conformance suite: every backend runs the same cases
// (store_conformance_test.cpp). Each backend's executable instantiates the
// suite for itself (instantiate_*.cpp), so `ctest -L unit` runs the SQLite
// cases without a server and `-L integration` the PostgreSQL and MongoDB ones.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "process.hpp"
#include "sagapool/request.hpp"
#include "sagapool/store.hpp"

namespace sagapool::test {

#define SAGA_ASSERT_OK(expr)                                                     \
  do {                                                                           \
    const ::sagapool::Status saga_status_ = (expr);                              \
    ASSERT_TRUE(saga_status_.is_ok())                                            \
        << #expr << " -> " << ::sagapool::to_string(saga_status_.kind()) << ": " \
        << saga_status_.message();                                               \
  } while (false)

#define SAGA_EXPECT_OK(expr)                                                     \
  do {                                                                           \
    const ::sagapool::Status saga_status_ = (expr);                              \
    EXPECT_TRUE(saga_status_.is_ok())                                            \
        << #expr << " -> " << ::sagapool::to_string(saga_status_.kind()) << ": " \
        << saga_status_.message();                                               \
  } while (false)

// A request with owned strings, so NewTransfer's views stay valid.
struct TransferSpec {
  std::string id;
  std::string from = "acct-a";
  std::string to = "acct-b";
  std::int64_t amount = 100;
  std::string currency;
  std::string metadata;
  std::string topic = "transfers.requests";
  std::int32_t partition = 3;
  std::int64_t offset = 42;
  std::int64_t requested_at_ms = 1'700'000'000'000;
  std::optional<std::uint64_t> hash;  // default: payload_hash of the request

  RequestView view() const;
  NewTransfer to_new() const;
};

inline TransferSpec spec(std::string id, std::string from = "acct-a", std::string to = "acct-b",
                         std::int64_t amount = 100) {
  TransferSpec t;
  t.id = std::move(id);
  t.from = std::move(from);
  t.to = std::move(to);
  t.amount = amount;
  return t;
}

inline Account make_account(std::string id, std::int64_t balance, std::int64_t min_balance = 0,
                            std::string currency = "", bool locked = false) {
  Account a;
  a.id = std::move(id);
  a.balance = balance;
  a.opening_balance = balance;
  a.min_balance = min_balance;
  a.currency = std::move(currency);
  a.locked = locked;
  return a;
}

// Inserts `t` alone through `s`, as `owner` with a lease of `lease_ms`;
// `result` gets its InsertResult.
Status insert_one(Store& s, const TransferSpec& t, std::string_view owner, std::int64_t lease_ms,
                  InsertResult& result);

// What the outbox tests read back: the finished transfers the audit's scan
// sees unpublished ("id,id,"), and the gauges' unpublished counts
// ("done/canceled"), checking that the oldest done one finished at
// `finished_at_ms` and that one transfer is still `initial`.
std::string unpublished_ids(Store& s);
std::string unpublished_counts(Store& s, std::int64_t finished_at_ms);
// Recovery took exactly `ids`, done transfers whose outcomes were never
// published, for `owner`: epoch 2, one attempt.
void expect_reclaimed(const std::vector<TransferDoc>& claimed, const std::set<std::string>& ids,
                      std::string_view owner);

// The op of a random leg, from a roll of 0-99: 35% debit, 30% credit,
// 15% cancel_debit, 10% cancel_credit, 10% release.
LegOp leg_op_for_roll(std::uint64_t roll);

// The parameter is the backend name: "sqlite", "postgresql" or "mongodb".
class StoreTest : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override;

  // A new, empty store of this backend (initialised unless told not to);
  // `url_` names it afterwards.
  std::unique_ptr<Store> fresh_store(bool init = true);
  // A second connection to the store `store_` works on.
  std::unique_ptr<Store> second_connection();

  // ---- helpers on `store_` (or `s`) ----
  InsertResult insert(const TransferSpec& t, std::string_view owner = "w1",
                      std::int64_t lease_ms = 60'000);
  TransferDoc load(std::string_view id);
  bool transition(std::string_view id, TransferState from, TransferState to, std::string_view owner,
                  std::int64_t epoch, Reason reason = Reason::none, std::int64_t lease_ms = 60'000);
  void create(Store& s, const Account& a);
  void create(const Account& a) { create(*store_, a); }
  void create(std::initializer_list<Account> accounts) {
    for (const Account& a : accounts) create(a);
  }
  Account account(std::string_view id);
  LegResult leg(LegOp op, std::string_view transfer, std::string_view account, std::int64_t amount,
                std::string_view currency = {});
  // Legs of one transfer on one account, one amount, applied in turn: each
  // must report the status paired with its op (or `want`, for them all).
  void expect_legs(std::string_view transfer, std::string_view account, std::int64_t amount,
                   const std::vector<std::pair<LegOp, LegStatus>>& ops);
  void expect_legs(std::string_view transfer, std::string_view account, std::int64_t amount,
                   std::initializer_list<LegOp> ops, LegStatus want);
  std::vector<Posting> postings(std::string_view transfer);
  std::vector<std::string> pending(std::string_view account);
  std::int64_t store_now();
  // Waits until the store's clock is past `t` (leases compare strictly).
  void wait_store_clock_past(std::int64_t t);
  // Invariant 3 over every account: balance == opening + sum of postings,
  // balance + reserved <= INT64_MAX, and (`exact_reservations`) reserved ==
  // the amounts of its pending entries' posted, unreversed debits. Random
  // legs no engine sends (a credit re-adding a released debit's entry) break
  // only that last view: every entry still gives back what it holds.
  void expect_balances_match_postings(Store& s, bool exact_reservations = true);

  std::string url_;
  std::unique_ptr<Store> store_;

 private:
  std::string new_url();
  std::vector<std::unique_ptr<TempDir>> dirs_;
};

// The PostgreSQL server the suite shares (started on first use, stopped at
// exit); every test gets its own database.
class PgServer;
PgServer& shared_pg_server();
// The same for MongoDB: one FerretDB, a database per test.
class FerretServer;
FerretServer& shared_ferret_server();

}  // namespace sagapool::test
