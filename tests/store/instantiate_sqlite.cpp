// The conformance suite on the embedded default: no server, label `unit`.
#include "store_test.hpp"

namespace sagapool::test {
INSTANTIATE_TEST_SUITE_P(sqlite, StoreTest, testing::Values(std::string("sqlite")),
                         [](const testing::TestParamInfo<std::string>& p) { return p.param; });
}  // namespace sagapool::test
