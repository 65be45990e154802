// The SQLite scope's flat table (store/sqlite/src/scope_table.hpp): what the
// scope conformance cases do not reach, growth past the first index and
// reuse of a cleared table's entries.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "scope_table.hpp"

namespace sagapool {
namespace {

struct Value {
  std::string text;
  int n = 0;
};

TEST(SqliteScopeTable, FindsEveryIdAfterGrowingAndEntriesStayPut) {
  ScopeTable<Value> table;
  EXPECT_EQ(table.find("t-0"), nullptr);
  Value& first = table.insert("t-0");
  first.n = 0;
  std::vector<Value*> where = {&first};
  for (int i = 1; i < 5'000; ++i) {  // several index doublings
    Value& v = table.insert("t-" + std::to_string(i));
    v.n = i;
    where.push_back(&v);
  }
  for (std::size_t i = 0; i < where.size(); ++i) {
    Value* v = table.find("t-" + std::to_string(i));
    ASSERT_EQ(v, where[i]) << "an insert moved entry " << i;
    EXPECT_EQ(v->n, static_cast<int>(i));
  }
  EXPECT_EQ(table.find("t-5000"), nullptr);
  EXPECT_EQ(table.find("t-"), nullptr);
}

TEST(SqliteScopeTable, ClearForgetsEveryIdAndReusesEntriesInOrder) {
  ScopeTable<Value> table;
  for (const char* id : {"a", "b", "c"}) table.insert(id).text = std::string(100, id[0]);
  table.clear();
  EXPECT_TRUE(table.empty());
  for (const char* id : {"a", "b", "c"}) EXPECT_EQ(table.find(id), nullptr) << id;

  // The first entry comes back under the new id, its string's capacity
  // kept for the caller to reuse; the old ids stay forgotten.
  Value& x = table.insert("x");
  EXPECT_GE(x.text.capacity(), 100U);
  x.text = "x";
  table.insert("y").text = "y";
  EXPECT_EQ(table.find("x"), &x);
  for (const char* id : {"a", "b", "c"}) EXPECT_EQ(table.find(id), nullptr) << id;
  std::vector<std::string> order;
  for (auto& [id, v] : table) order.push_back(id + "=" + v.text);
  EXPECT_EQ(order, (std::vector<std::string>{"x=x", "y=y"}));
}

TEST(SqliteScopeTable, RefilledPastItsLastSizeAfterGrowingItFindsOnlyTheNewIds) {
  ScopeTable<Value> table;
  for (int i = 0; i < 3'000; ++i) table.insert("old-" + std::to_string(i)).n = i;
  table.clear();
  for (int i = 0; i < 4'000; ++i) table.insert("new-" + std::to_string(i)).n = i;
  for (int i = 0; i < 4'000; ++i) {
    const Value* v = table.find("new-" + std::to_string(i));
    ASSERT_NE(v, nullptr) << i;
    EXPECT_EQ(v->n, i);
  }
  for (int i = 0; i < 3'000; ++i) EXPECT_EQ(table.find("old-" + std::to_string(i)), nullptr) << i;
}

}  // namespace
}  // namespace sagapool
