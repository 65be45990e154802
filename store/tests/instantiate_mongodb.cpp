// The conformance suite on MongoDB (label `integration`), against one
// throwaway FerretDB (MongoDB's wire protocol on SQLite) that every case
// shares, each in a database of its own (store_fixture.cpp).
#include <string>

#include "store_test.hpp"

namespace sagapool::test {

INSTANTIATE_TEST_SUITE_P(mongodb, StoreTest, testing::Values(std::string("mongodb")),
                         [](const testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace sagapool::test
