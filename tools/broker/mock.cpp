#include "mock.hpp"

#include <spdlog/spdlog.h>

namespace sagapool::broker {

void MockClusterDeleter::operator()(rd_kafka_mock_cluster_t* p) const noexcept {
  rd_kafka_mock_cluster_destroy(p);
}

namespace {

void quiet_log_cb(const rd_kafka_t* rk, int level, const char* fac, const char* buf) {
  const auto lvl = level <= 3 ? spdlog::level::warn : spdlog::level::debug;
  if (!spdlog::should_log(lvl)) return;
  spdlog::log(lvl, "librdkafka {} {}: {}", rd_kafka_name(rk), fac, buf);
}

void quiet_error_cb(rd_kafka_t* rk, int err, const char* reason, void* /*opaque*/) {
  const auto code = static_cast<rd_kafka_resp_err_t>(err);
  const auto lvl = code == RD_KAFKA_RESP_ERR__FATAL ? spdlog::level::err : spdlog::level::debug;
  if (!spdlog::should_log(lvl)) return;
  spdlog::log(lvl, "librdkafka {}: {} ({})", rd_kafka_name(rk), reason, rd_kafka_err2name(code));
}

}  // namespace

void install_quiet_log_callbacks(rd_kafka_conf_t& conf) {
  rd_kafka_conf_set_log_cb(&conf, quiet_log_cb);
  rd_kafka_conf_set_error_cb(&conf, quiet_error_cb);
}

}  // namespace sagapool::broker
