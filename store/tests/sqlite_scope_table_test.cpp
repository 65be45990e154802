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

  // A reused entry keeps its old value until the caller resets it: the
  // table hands it back under the new id, in insertion order.
  Value& x = table.insert("x");
  EXPECT_EQ(x.text, std::string(100, 'a'));
  x.text = "x";
  table.insert("y").text = "y";
  EXPECT_EQ(table.find("x"), &x);
  std::vector<std::string> order;
  for (auto& [id, v] : table) order.push_back(id + "=" + v.text);
  EXPECT_EQ(order, (std::vector<std::string>{"x=x", "y=y"}));
}

}  // namespace
}  // namespace sagapool
