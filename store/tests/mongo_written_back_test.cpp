// MongoDB: a leg that writes nothing must not be decided on an account
// document behind its journal. Account documents are set by _id alone, so
// a slower writer's update can land after a later one's and leave the
// document at an older change until someone settles it (FerretDB's updates
// even write whole documents back). A leg that writes a change then fails
// on the journal's key; a release that finds nothing to release, or a
// refusal, writes nothing. Here the document is set back by hand, through
// the driver, between two legs.
#include <bson/bson.h>
#include <mongoc/mongoc.h>

#include <memory>
#include <string>

#include "ferret_server.hpp"
#include "store_test.hpp"

namespace sagapool::test {
FerretServer& shared_ferret_server();  // store_fixture.cpp

namespace {

constexpr std::int64_t kLeaseMs = 60'000;

// The account documents of one database, read and written back raw.
class RawAccounts {
 public:
  explicit RawAccounts(const std::string& url) {
    mongoc_init();
    client_ = mongoc_client_new(url.c_str());
    bson_error_t err;
    mongoc_uri_t* uri = mongoc_uri_new_with_error(url.c_str(), &err);
    accounts_ = mongoc_client_get_collection(client_, mongoc_uri_get_database(uri), "accounts");
    mongoc_uri_destroy(uri);
  }
  ~RawAccounts() {
    mongoc_collection_destroy(accounts_);
    mongoc_client_destroy(client_);
  }
  // The document of account `id`, copied (nullptr if none).
  bson_t* copy(const std::string& id) {
    bson_t* filter = BCON_NEW("_id", BCON_UTF8(id.c_str()));
    mongoc_cursor_t* cursor = mongoc_collection_find_with_opts(accounts_, filter, nullptr, nullptr);
    const bson_t* doc = nullptr;
    bson_t* out = mongoc_cursor_next(cursor, &doc) ? bson_copy(doc) : nullptr;
    mongoc_cursor_destroy(cursor);
    bson_destroy(filter);
    return out;
  }
  // Writes `doc` back over the account's document, as a stale writer would.
  bool write_back(const std::string& id, const bson_t* doc) {
    bson_t* filter = BCON_NEW("_id", BCON_UTF8(id.c_str()));
    bson_error_t err;
    const bool ok = mongoc_collection_replace_one(accounts_, filter, doc, nullptr, nullptr, &err);
    bson_destroy(filter);
    return ok;
  }

 private:
  mongoc_client_t* client_ = nullptr;
  mongoc_collection_t* accounts_ = nullptr;
};

class MongoWrittenBack : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    url_ = shared_ferret_server().create_database("written_back_" + std::to_string(++counter));
    SAGA_ASSERT_OK(open_store(url_, store_));
    SAGA_ASSERT_OK(store_->init_schema());
    const Account accounts[] = {make_account("acct-a", 1000), make_account("acct-b", 0)};
    SAGA_ASSERT_OK(store_->create_accounts(accounts));
    raw_ = std::make_unique<RawAccounts>(url_);
  }

  LegResult leg(LegOp op, const std::string& transfer, const std::string& account, std::int64_t amount) {
    LegRequest r;
    r.op = op;
    r.transfer_id = transfer;
    r.account_id = account;
    r.amount = amount;
    LegResult out;
    const Status s = store_->apply_legs(std::span(&r, 1), std::span(&out, 1));
    EXPECT_TRUE(s.is_ok()) << s.message();
    return out;
  }

  std::string url_;
  std::unique_ptr<Store> store_;
  std::unique_ptr<RawAccounts> raw_;
};

TEST_F(MongoWrittenBack, ReleaseOnADocumentBehindItsDebitReleasesTheReservation) {
  InsertResult inserted{};
  SAGA_ASSERT_OK(insert_one(*store_, spec("t1", "acct-a", "acct-b", 100), "w1", kLeaseMs, inserted));
  bson_t* before = raw_->copy("acct-a");
  ASSERT_NE(before, nullptr);
  EXPECT_EQ(leg(LegOp::debit, "t1", "acct-a", 100).status, LegStatus::posted);
  ASSERT_TRUE(raw_->write_back("acct-a", before));  // the debit's reservation is gone from the document
  bson_destroy(before);

  EXPECT_EQ(leg(LegOp::release, "t1", "acct-a", 0).status, LegStatus::released);

  // The audit's scan settles every document to its journal first.
  SAGA_ASSERT_OK(store_->scan_accounts([](const Account&) {}));
  std::vector<std::string> pending;
  SAGA_ASSERT_OK(store_->pending_for_account("acct-a", pending));
  EXPECT_TRUE(pending.empty()) << "still reserved for " << pending.front();
  std::optional<Account> a;
  SAGA_ASSERT_OK(store_->load_account("acct-a", a));
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->balance, 900);
  EXPECT_EQ(a->reserved, 0);
}

TEST_F(MongoWrittenBack, DebitOnADocumentBehindACreditSeesTheCredit) {
  InsertResult inserted{};
  SAGA_ASSERT_OK(insert_one(*store_, spec("t1", "acct-a", "acct-b", 100), "w1", kLeaseMs, inserted));
  SAGA_ASSERT_OK(insert_one(*store_, spec("t2", "acct-b", "acct-a", 60), "w1", kLeaseMs, inserted));
  bson_t* before = raw_->copy("acct-b");
  ASSERT_NE(before, nullptr);
  EXPECT_EQ(leg(LegOp::credit, "t1", "acct-b", 100).status, LegStatus::posted);
  ASSERT_TRUE(raw_->write_back("acct-b", before));  // the document shows a balance of 0 again
  bson_destroy(before);

  const LegResult debit = leg(LegOp::debit, "t2", "acct-b", 60);
  EXPECT_EQ(debit.status, LegStatus::posted) << "refused: " << to_string(debit.reason);

  std::optional<Account> b;
  SAGA_ASSERT_OK(store_->load_account("acct-b", b));
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(b->balance, 40);
  EXPECT_EQ(b->reserved, 60);
}

}  // namespace
}  // namespace sagapool::test
