#pragma once
// saga-broker internals: the mock cluster handle and the pieces around it.
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sagapool::broker {

// What librdkafka 2.0.2's mock keeps per partition before it silently drops
// the oldest message sets (rd_kafka_mock_partition_init: max_size = 5 MiB,
// max_cnt = 100000; not configurable through any public API).
inline constexpr std::int64_t kMockPartitionMaxBytes = 5 * 1024 * 1024;
inline constexpr std::int64_t kMockPartitionMaxMessageSets = 100'000;

struct MockClusterDeleter {
  void operator()(rd_kafka_mock_cluster_t* p) const noexcept;
};
// Must be destroyed before the rd_kafka_t it was created on.
using MockClusterPtr = std::unique_ptr<rd_kafka_mock_cluster_t, MockClusterDeleter>;

// Logs librdkafka lines from the broker's own internal handles at debug
// level only (warnings and errors at warn): they are plumbing, and a client
// of the mock logging "connection refused" while a broker is down on purpose
// is noise.
void install_quiet_log_callbacks(rd_kafka_conf_t& conf);

// Runs one control command ("down 2", "rtt 1 200", "errors Produce 3
// NOT_LEADER_FOR_PARTITION", ...) and returns the one-line answer; `ok` is
// false for a malformed command or a failed call.
std::string run_control_command(rd_kafka_mock_cluster_t& cluster, std::string_view line, bool& ok);
std::string_view control_help();

}  // namespace sagapool::broker
