// The answer to a request that started no transfer: which invalid requests
// keep a readable id (parse_request's out.id), and the `rejected` outcome's
// exact text (docs/messages.md).
#include <gtest/gtest.h>

#include <string>
#include <string_view>

#include "sagapool/outcome.hpp"
#include "sagapool/request.hpp"

namespace sagapool {
namespace {

std::string readable_id(std::string_view bytes) {
  RequestView v;
  EXPECT_NE(parse_request(bytes, v), RequestError::ok) << bytes;
  return std::string(v.id);
}

TEST(ReadableId, KeptWhenTheObjectIsWellFormedAndItsIdValid) {
  EXPECT_EQ(readable_id(R"({"id":"t-1","from":"a","to":"b","amount":0})"), "t-1");
  EXPECT_EQ(readable_id(R"({"id":"t-1","from":"a","to":"a","amount":1})"), "t-1");
  EXPECT_EQ(readable_id(R"({"id":"t-1","from":"a","to":"b","amount":1,"memo":"x"})"), "t-1");
  EXPECT_EQ(readable_id(R"({"id":"t-1"})"), "t-1");  // missing_from
  // Another key repeated: the id is still one.
  EXPECT_EQ(readable_id(R"({"id":"t-1","from":"a","from":"c","to":"b","amount":1})"), "t-1");
  EXPECT_EQ(readable_id(R"({"amount":1.5,"id":"t-2","from":"a","to":"b"})"), "t-2");
}

TEST(ReadableId, NoneWhenItCannotBeTrusted) {
  EXPECT_EQ(readable_id(R"({"id":"t-1","from":"a")"), "");                                // truncated
  EXPECT_EQ(readable_id(R"({"id":"t-1","from":"a","to":"b","amount":1} x)"), "");         // trailing data
  EXPECT_EQ(readable_id(R"({"id":"t-1","id":"t-2","from":"a","to":"b","amount":1})"), "");  // which one?
  EXPECT_EQ(readable_id(R"({"id":"a b","from":"a","to":"b","amount":1})"), "");           // bad_id
  EXPECT_EQ(readable_id(R"({"id":5,"from":"a","to":"b","amount":1})"), "");               // bad_id
  EXPECT_EQ(readable_id(R"({"\u0069d":"t-1","from":"a","to":"b","amount":1})"), "");      // not literal
  EXPECT_EQ(readable_id("{\"id\":\"t-1\",\"from\":\"\xff\"}"), "");                        // not UTF-8
  EXPECT_EQ(readable_id(R"(["t-1"])"), "");
  EXPECT_EQ(readable_id(""), "");
}

TEST(Rejection, TheDocumentedText) {
  std::string out;
  format_rejection({"t-42", Reason::invalid, "amount_not_positive", "amount must be at least 1",
                    "transfers.requests", 3, 1207, 1'795'000'000'123},
                   out);
  EXPECT_EQ(out,
            R"({"id":"t-42","state":"rejected","reason":"invalid","error":"amount_not_positive",)"
            R"("message":"amount must be at least 1","request":{"topic":"transfers.requests","partition":3,)"
            R"("offset":1207},"finished_at":"2026-11-18T11:06:40.123Z"})");
}

TEST(Rejection, EscapesWhatItEchoes) {
  std::string out = "reused capacity";
  format_rejection({"t-1", Reason::conflict, "conflict", "a \"quoted\"\nline", "topic\\x", 0, 0, 0}, out);
  EXPECT_EQ(out,
            R"({"id":"t-1","state":"rejected","reason":"conflict","error":"conflict",)"
            R"("message":"a \"quoted\"\nline","request":{"topic":"topic\\x","partition":0,"offset":0},)"
            R"("finished_at":"1970-01-01T00:00:00.000Z"})");
}

}  // namespace
}  // namespace sagapool
