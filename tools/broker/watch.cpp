// Turns the mock's silent retention drops into warnings: a client of the
// mock polls each partition's log-start offset, which only moves when the
// mock deleted old message sets (nothing else deletes records here).
#include "watch.hpp"

#include <spdlog/spdlog.h>

#include <array>
#include <mutex>

#include "sagapool/kafka.hpp"

namespace sagapool::broker {

RetentionWatcher::RetentionWatcher(std::string bootstrap, std::vector<std::string> topics,
                                   int partitions, std::chrono::milliseconds interval)
    : bootstrap_(std::move(bootstrap)),
      topics_(std::move(topics)),
      partitions_(partitions),
      interval_(interval) {}

RetentionWatcher::~RetentionWatcher() { stop(); }

bool RetentionWatcher::start() {
  ConfPtr conf;
  Status s = make_conf({{"bootstrap.servers", bootstrap_},
                        {"client.id", "saga-broker-watch"},
                        {"log.connection.close", "false"}},
                       conf);
  if (!s) {
    spdlog::warn("retention watch disabled: {}", s.message());
    return false;
  }
  install_quiet_log_callbacks(*conf);
  std::array<char, 512> errstr{};
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf.get(), errstr.data(), errstr.size());
  if (rk == nullptr) {
    spdlog::warn("retention watch disabled: {}", errstr.data());
    return false;
  }
  (void)conf.release();
  client_.reset(rk);
  thread_ = std::jthread([this](std::stop_token st) { run(st); });
  return true;
}

void RetentionWatcher::stop() {
  if (thread_.joinable()) {
    thread_.request_stop();
    cv_.notify_all();
    thread_.join();
  }
  client_.reset();
}

void RetentionWatcher::run(std::stop_token st) {
  std::vector<std::vector<std::int64_t>> seen(topics_.size(),
                                               std::vector<std::int64_t>(
                                                   static_cast<std::size_t>(partitions_), 0));
  std::mutex m;
  while (!st.stop_requested()) {
    {
      std::unique_lock lock(m);
      if (cv_.wait_for(lock, st, interval_, [] { return false; })) break;
    }
    if (st.stop_requested()) break;
    for (std::size_t t = 0; t < topics_.size() && !st.stop_requested(); ++t) {
      check_topic(topics_[t], seen[t], st);
    }
  }
}

void RetentionWatcher::check_topic(const std::string& topic, std::vector<std::int64_t>& seen,
                                   const std::stop_token& st) {
  std::int64_t dropped = 0;
  std::string where;
  for (std::size_t p = 0; p < seen.size() && !st.stop_requested(); ++p) {
    std::int64_t lo = 0;
    std::int64_t hi = 0;
    // Short timeout: a partition led by a broker that is down on purpose
    // is simply skipped this round.
    const rd_kafka_resp_err_t err = rd_kafka_query_watermark_offsets(
        client_.get(), topic.c_str(), static_cast<std::int32_t>(p), &lo, &hi, 1000);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR || lo <= seen[p]) continue;
    dropped += lo - seen[p];
    if (!where.empty()) where += ", ";
    where += std::to_string(p) + ":" + std::to_string(seen[p]) + ".." + std::to_string(lo - 1);
    seen[p] = lo;
  }
  if (dropped == 0) return;
  spdlog::warn(
      "{}: the mock broker DROPPED {} old message(s) (partition:offsets {}) to stay within "
      "{} MiB / {} message sets per partition; a consumer that had not read them has lost them",
      topic, dropped, where, kMockPartitionMaxBytes / (1024 * 1024), kMockPartitionMaxMessageSets);
}

}  // namespace sagapool::broker
