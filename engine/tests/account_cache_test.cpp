#include "sagapool/account_cache.hpp"

#include <gtest/gtest.h>

#include <functional>
#include <string>

namespace sagapool {
namespace {

std::size_t hash_of(std::string_view id) { return std::hash<std::string_view>{}(id); }

void put(AccountCache& cache, const std::string& id, std::int64_t balance) {
  cache.put(id, hash_of(id)).balance = balance;
}

TEST(AccountCache, GivesWhatWasPutLastOrNothing) {
  AccountCache cache(16);
  EXPECT_EQ(cache.find("a", hash_of("a")), nullptr);
  put(cache, "a", 1);
  put(cache, "a", 2);
  ASSERT_NE(cache.find("a", hash_of("a")), nullptr);
  EXPECT_EQ(cache.find("a", hash_of("a"))->balance, 2);
  cache.forget("a", hash_of("a"));
  EXPECT_EQ(cache.find("a", hash_of("a")), nullptr);
  put(cache, "a", 3);
  EXPECT_EQ(cache.find("a", hash_of("a"))->balance, 3);
}

// More ids than slots: each id found is its own, with its last balance, and
// the ids put last are all found.
TEST(AccountCache, AFullTableKeepsTheIdsPutLast) {
  AccountCache cache(16);
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 200; ++i) put(cache, "acct-" + std::to_string(i), round * 1000 + i);
  }
  int found = 0;
  for (int i = 0; i < 200; ++i) {
    const std::string id = "acct-" + std::to_string(i);
    if (const Account* a = cache.find(id, hash_of(id))) {
      EXPECT_EQ(a->id, id);
      EXPECT_EQ(a->balance, 2000 + i);
      ++found;
    }
  }
  EXPECT_GT(found, 0);
  EXPECT_LE(found, 16);
  put(cache, "last", 7);
  EXPECT_EQ(cache.find("last", hash_of("last"))->balance, 7);
}

}  // namespace
}  // namespace sagapool
