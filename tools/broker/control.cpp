// The control channel's commands: fault injection on the mock cluster.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <optional>

#include "mock.hpp"

namespace sagapool::broker {
namespace {

// Bounds: one command cannot queue more than this many injected errors.
constexpr std::int64_t kMaxInjectedErrors = 100'000;
constexpr std::int64_t kMaxRttMs = 600'000;

struct ApiKeyName {
  std::string_view name;
  std::int16_t key;
};
// The requests our clients send (Kafka protocol ApiKey numbers).
constexpr std::array<ApiKeyName, 24> kApiKeys = {{
    {"Produce", 0},           {"Fetch", 1},
    {"ListOffsets", 2},       {"Metadata", 3},
    {"OffsetCommit", 8},      {"OffsetFetch", 9},
    {"FindCoordinator", 10},  {"JoinGroup", 11},
    {"Heartbeat", 12},        {"LeaveGroup", 13},
    {"SyncGroup", 14},        {"DescribeGroups", 15},
    {"ListGroups", 16},       {"SaslHandshake", 17},
    {"ApiVersions", 18},      {"CreateTopics", 19},
    {"DeleteTopics", 20},     {"DeleteRecords", 21},
    {"InitProducerId", 22},   {"OffsetForLeaderEpoch", 23},
    {"AddPartitionsToTxn", 24}, {"AddOffsetsToTxn", 25},
    {"EndTxn", 26},           {"TxnOffsetCommit", 28},
}};

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() &&
         std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::optional<std::int64_t> parse_int(std::string_view s) {
  std::int64_t v = 0;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, v);
  if (ec != std::errc() || ptr != end || s.empty()) return std::nullopt;
  return v;
}

std::optional<std::int16_t> parse_api_key(std::string_view s) {
  if (auto n = parse_int(s)) {
    if (*n >= 0 && *n <= 100) return static_cast<std::int16_t>(*n);
    return std::nullopt;
  }
  for (const ApiKeyName& a : kApiKeys) {
    if (iequals(a.name, s)) return a.key;
  }
  return std::nullopt;
}

// An error by librdkafka name (NOT_LEADER_FOR_PARTITION, _TRANSPORT, with or
// without the RD_KAFKA_RESP_ERR_ prefix, any case) or by number.
std::optional<rd_kafka_resp_err_t> parse_error(std::string_view s) {
  if (auto n = parse_int(s)) {
    if (*n < -200 || *n > 1000) return std::nullopt;
    return static_cast<rd_kafka_resp_err_t>(*n);
  }
  constexpr std::string_view kPrefix = "RD_KAFKA_RESP_ERR_";
  if (s.size() > kPrefix.size() && iequals(s.substr(0, kPrefix.size()), kPrefix)) {
    s.remove_prefix(kPrefix.size());
  }
  const rd_kafka_err_desc* descs = nullptr;
  size_t count = 0;
  rd_kafka_get_err_descs(&descs, &count);
  for (size_t i = 0; i < count; ++i) {
    if (descs[i].name != nullptr && iequals(descs[i].name, s)) return descs[i].code;
  }
  return std::nullopt;
}

// A broker id, or "all" (-1: every broker).
std::optional<std::int32_t> parse_broker(std::string_view s) {
  if (iequals(s, "all")) return -1;
  auto n = parse_int(s);
  if (!n || *n < 0 || *n > 1000) return std::nullopt;
  return static_cast<std::int32_t>(*n);
}

std::vector<std::string_view> split_words(std::string_view line) {
  std::vector<std::string_view> words;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    const std::size_t start = i;
    while (i < line.size() && !std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    if (i > start) words.push_back(line.substr(start, i - start));
  }
  return words;
}

std::string result(rd_kafka_resp_err_t err, bool& ok) {
  ok = err == RD_KAFKA_RESP_ERR_NO_ERROR;
  return ok ? "ok" : std::string("failed: ") + rd_kafka_err2str(err);
}

std::string usage(bool& ok) {
  ok = false;
  return "malformed command; " + std::string(control_help());
}

}  // namespace

std::string_view control_help() {
  return "commands: down <broker|all> | up <broker|all> | rtt <broker|all> <ms> | "
         "errors <api_key> <count> <ERR_NAME|code> | clear <api_key> | "
         "leader <topic> <partition> <broker|-1> | coordinator <group> <broker> | help";
}

std::string run_control_command(rd_kafka_mock_cluster_t& cluster, std::string_view line,
                                bool& ok) {
  const auto w = split_words(line);
  ok = true;
  if (w.empty() || iequals(w[0], "help")) return std::string(control_help());
  const std::string_view cmd = w[0];
  if ((iequals(cmd, "down") || iequals(cmd, "up")) && w.size() == 2) {
    const auto id = parse_broker(w[1]);
    if (!id) return usage(ok);
    return result(iequals(cmd, "down") ? rd_kafka_mock_broker_set_down(&cluster, *id)
                                       : rd_kafka_mock_broker_set_up(&cluster, *id),
                  ok);
  }
  if (iequals(cmd, "rtt") && w.size() == 3) {
    const auto id = parse_broker(w[1]);
    const auto ms = parse_int(w[2]);
    if (!id || !ms || *ms < 0 || *ms > kMaxRttMs) return usage(ok);
    return result(rd_kafka_mock_broker_set_rtt(&cluster, *id, static_cast<int>(*ms)), ok);
  }
  if (iequals(cmd, "errors") && w.size() == 4) {
    const auto api = parse_api_key(w[1]);
    const auto count = parse_int(w[2]);
    const auto err = parse_error(w[3]);
    if (!api || !count || *count < 1 || *count > kMaxInjectedErrors || !err) return usage(ok);
    const std::vector<rd_kafka_resp_err_t> errors(static_cast<std::size_t>(*count), *err);
    rd_kafka_mock_push_request_errors_array(&cluster, *api, errors.size(), errors.data());
    return "ok: the next " + std::to_string(*count) + " request(s) with ApiKey " +
           std::to_string(*api) + " fail with " + rd_kafka_err2name(*err);
  }
  if (iequals(cmd, "clear") && w.size() == 2) {
    const auto api = parse_api_key(w[1]);
    if (!api) return usage(ok);
    rd_kafka_mock_clear_request_errors(&cluster, *api);
    return "ok";
  }
  if (iequals(cmd, "leader") && w.size() == 4) {
    const auto partition = parse_int(w[2]);
    const auto id = parse_int(w[3]);
    if (!partition || *partition < 0 || *partition > 100'000 || !id || *id < -1 || *id > 1000) {
      return usage(ok);
    }
    const std::string topic(w[1]);
    return result(rd_kafka_mock_partition_set_leader(&cluster, topic.c_str(),
                                                     static_cast<std::int32_t>(*partition),
                                                     static_cast<std::int32_t>(*id)),
                  ok);
  }
  if (iequals(cmd, "coordinator") && w.size() == 3) {
    const auto id = parse_int(w[2]);
    if (!id || *id < 0 || *id > 1000) return usage(ok);
    const std::string group(w[1]);
    return result(rd_kafka_mock_coordinator_set(&cluster, "group", group.c_str(),
                                                static_cast<std::int32_t>(*id)),
                  ok);
  }
  return usage(ok);
}

}  // namespace sagapool::broker
