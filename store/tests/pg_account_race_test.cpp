// PostgreSQL: a leg that finds its account missing, and the account's
// creation, serialise on the account id (docs/design-additions.md, "Legs on
// accounts that do not exist yet"). The two interleavings of issue 19, driven
// step by step on three connections in the engine's own order: a worker W2
// that took a transfer over voids a leg on an account with no row, inside
// its batch transaction; before W2 commits, an operator creates the account
// and the paused worker W1 (the zombie of epoch 1) tries that very leg. W1's
// leg must come out voided, and the audit must pass.
#include <future>
#include <string>

#include "pg_server.hpp"
#include "sagapool/audit.hpp"
#include "sagapool/ledger.hpp"
#include "store_test.hpp"

namespace sagapool::test {
namespace {

using namespace std::chrono_literals;

constexpr std::int64_t kLeaseMs = 60'000;
constexpr std::int64_t kOpening = 1000;
constexpr std::int64_t kAmount = 100;

class PgAccountRace : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    db_ = "account_race_" + std::to_string(++counter);
    url_ = server_.create_database(db_);
    ASSERT_TRUE(Ledger::open({url_}, ledger_).is_ok());
    SAGA_ASSERT_OK(ledger_->init());
    for (std::unique_ptr<Store>* s : {&w1_, &w2_, &op_}) SAGA_ASSERT_OK(open_store(url_, *s));
  }

  static Account account(const std::string& id) {
    Account a;
    a.id = id;
    a.balance = a.opening_balance = kOpening;
    return a;
  }

  // W1 inserts and claims the transfer (epoch 1); then its lease "expires"
  // and W2 takes it over (epoch 2).
  void start_transfer(const std::string& id, const std::string& from, const std::string& to,
                      bool w1_posts_debit) {
    NewTransfer t;
    t.request = {id, from, to, kAmount, "", ""};
    t.payload_hash = payload_hash(t.request);
    t.origin_topic = "transfers.requests";
    InsertResult inserted{};
    SAGA_ASSERT_OK(w1_->insert_transfers({&t, 1}, "w1", kLeaseMs, {&inserted, 1}));
    ASSERT_EQ(inserted, InsertResult::inserted);
    transition(*w1_, id, TransferState::initial, TransferState::pending, Reason::none, "w1", 1);
    if (w1_posts_debit) EXPECT_EQ(leg(*w1_, LegOp::debit, id, from).status, LegStatus::posted);
    std::optional<TransferDoc> doc;
    SAGA_ASSERT_OK(w2_->take_over(id, "w2", kLeaseMs, doc));
    ASSERT_TRUE(doc.has_value());
    ASSERT_EQ(doc->epoch, 2);
  }

  static void transition(Store& s, const std::string& id, TransferState from, TransferState to,
                         Reason reason, const std::string& owner, std::int64_t epoch) {
    const Transition t{id, from, to, reason, owner, epoch};
    std::uint8_t applied = 0;
    SAGA_ASSERT_OK(s.transition({&t, 1}, kLeaseMs, {&applied, 1}));
    EXPECT_EQ(applied, 1) << id << " " << to_string(from) << " -> " << to_string(to);
  }

  static LegResult leg(Store& s, LegOp op, const std::string& transfer, const std::string& acct) {
    const LegRequest l{op, transfer, acct, kAmount, ""};
    LegResult r;
    const Status st = s.apply_legs({&l, 1}, {&r, 1});
    EXPECT_TRUE(st.is_ok()) << st.message();
    return r;
  }

  // Backends of this database waiting for a lock.
  int waiting() const {
    const RunResult r = server_.psql(
        db_, "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = '" +
                 db_ + "'");
    return r.exit_code == 0 ? std::stoi(r.output) : -1;
  }

  // Before W2 commits its cancel: the operator creates `missing`, then W1
  // wakes and tries `zombie_op` on it. W2 then finishes and commits; returns
  // W1's result.
  LegStatus race_creation_and_zombie(const std::string& transfer, const std::string& missing,
                                     LegOp zombie_op) {
    // Each call gets the time to either finish or queue on a lock (`n`
    // backends waiting), so the steps happen in the interleaving's order.
    const auto finished_or_waiting = [&](auto& call, int n) {
      eventually([&] { return call.wait_for(0ms) == std::future_status::ready || waiting() >= n; },
                 5s);
    };
    auto created = std::async(std::launch::async, [&] {
      const Account a = account(missing);
      return op_->create_accounts({&a, 1});
    });
    finished_or_waiting(created, 1);
    auto zombie =
        std::async(std::launch::async, [&] { return leg(*w1_, zombie_op, transfer, missing); });
    finished_or_waiting(zombie, 2);
    transition(*w2_, transfer, TransferState::canceling, TransferState::canceled,
               Reason::unknown_account, "w2", 2);
    EXPECT_TRUE(w2_->end_scope(true).is_ok());
    EXPECT_EQ(created.wait_for(10s), std::future_status::ready);
    EXPECT_TRUE(created.get().is_ok());
    EXPECT_EQ(zombie.wait_for(10s), std::future_status::ready);
    return zombie.get().status;
  }

  void expect_audit_passes() {
    AuditReport report;
    SAGA_ASSERT_OK(run_audit(*ledger_, {}, report));
    EXPECT_TRUE(report.ok()) << report.to_text();
  }

  std::int64_t balance(const std::string& id) {
    std::optional<Account> a;
    EXPECT_TRUE(op_->load_account(id, a).is_ok());
    return a ? a->balance : -1;
  }

  enum class Missing { source, destination };

  // One interleaving, start to end: `transfer` moves `from` -> `to`, and the
  // `missing` one of the two has no row. W1 claims the transfer, posting the
  // debit if the source exists; W2 takes it over and, in its batch
  // transaction, finds the account missing (after the debit W1 posted, if
  // any), cancels, voids the credit and voids (never posted) or reverses the
  // debit. Then the operator creates the missing account and the zombie W1
  // tries, on it, the leg W2 found refused. W1's leg must come out voided,
  // both balances as opened, and the audit must pass.
  void run_interleaving(const std::string& transfer, const std::string& from, const std::string& to,
                        Missing missing) {
    const bool source_missing = missing == Missing::source;
    const std::string& absent = source_missing ? from : to;
    const LegOp refused = source_missing ? LegOp::debit : LegOp::credit;
    const Account existing = account(source_missing ? to : from);
    SAGA_ASSERT_OK(op_->create_accounts({&existing, 1}));
    ASSERT_NO_FATAL_FAILURE(start_transfer(transfer, from, to, /*w1_posts_debit=*/!source_missing));

    SAGA_ASSERT_OK(w2_->begin_scope());
    if (!source_missing) {
      EXPECT_EQ(leg(*w2_, LegOp::debit, transfer, from).status, LegStatus::already_posted);
    }
    EXPECT_EQ(leg(*w2_, refused, transfer, absent).reason, Reason::unknown_account);
    transition(*w2_, transfer, TransferState::pending, TransferState::canceling,
               Reason::unknown_account, "w2", 2);
    EXPECT_EQ(leg(*w2_, LegOp::cancel_credit, transfer, to).status, LegStatus::voided);
    EXPECT_EQ(leg(*w2_, LegOp::cancel_debit, transfer, from).status,
              source_missing ? LegStatus::voided : LegStatus::reversed);

    EXPECT_EQ(race_creation_and_zombie(transfer, absent, refused), LegStatus::voided)
        << "W1 posted a leg W2 had voided";
    EXPECT_EQ(balance(from), kOpening) << from;
    EXPECT_EQ(balance(to), kOpening) << to;
    expect_audit_passes();
  }

  PgServer& server_ = shared_pg_server();
  std::string db_;
  std::string url_;
  std::unique_ptr<Ledger> ledger_;
  std::unique_ptr<Store> w1_, w2_, op_;
};

// T1 = A -> B, A missing. W2 voids both legs; A is created; W1's debit would
// post on the new row and never be reversed (money destroyed).
TEST_F(PgAccountRace, DebitVoidedOnAMissingAccountNeverPosts) {
  run_interleaving("T1", "A", "B", Missing::source);
}

// T2 = A -> C, C missing. W1 posted the debit; W2 voids the credit on C and
// reverses the debit; C is created; W1's credit would post as well (money
// created).
TEST_F(PgAccountRace, CreditVoidedOnAMissingAccountNeverPosts) {
  run_interleaving("T2", "A", "C", Missing::destination);
}

// The lock is per id bucket, not global: creating an unrelated account, and
// legs on accounts that exist, do not wait for a batch that voided a leg on
// a missing account.
TEST_F(PgAccountRace, OtherAccountsDoNotWait) {
  Account accounts[] = {account("X"), account("Y")};
  SAGA_ASSERT_OK(op_->create_accounts(accounts));
  ASSERT_NO_FATAL_FAILURE(start_transfer("T3", "missing-3", "X", false));
  SAGA_ASSERT_OK(w2_->begin_scope());
  EXPECT_EQ(leg(*w2_, LegOp::cancel_debit, "T3", "missing-3").status, LegStatus::voided);

  // Different buckets of the id hash than missing-3 (checked below), so
  // nothing here waits on W2's open transaction.
  const RunResult buckets = server_.psql(
      db_, "SELECT count(DISTINCT hashtext(x) & 255) FROM unnest(ARRAY['missing-3', 'Z-9']) x");
  ASSERT_EQ(buckets.exit_code, 0);
  ASSERT_EQ(std::stoi(buckets.output), 2);
  auto other = std::async(std::launch::async, [&] {
    const Account z = account("Z-9");
    return op_->create_accounts({&z, 1});
  });
  ASSERT_EQ(other.wait_for(5s), std::future_status::ready) << "an unrelated creation waited";
  SAGA_EXPECT_OK(other.get());
  EXPECT_EQ(leg(*w1_, LegOp::debit, "T4", "X").status, LegStatus::posted);
  SAGA_ASSERT_OK(w2_->end_scope(false));
}

}  // namespace
}  // namespace sagapool::test
