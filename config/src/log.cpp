#include "sagapool/log.hpp"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <utility>

#include "sagapool/json_text.hpp"

namespace sagapool {
namespace {

class JsonMessageFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    std::string escaped;
    append_json_escaped(escaped, std::string_view(msg.payload.data(), msg.payload.size()));
    dest.append(escaped.data(), escaped.data() + escaped.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonMessageFlag>();
  }
};

spdlog::level::level_enum g_level = spdlog::level::info;

std::optional<spdlog::level::level_enum> parse_level(std::string_view name) noexcept {
  static constexpr std::pair<std::string_view, spdlog::level::level_enum> kLevels[] = {
      {"trace", spdlog::level::trace}, {"debug", spdlog::level::debug},
      {"info", spdlog::level::info},   {"warn", spdlog::level::warn},
      {"error", spdlog::level::err},   {"critical", spdlog::level::critical},
      {"off", spdlog::level::off}};
  for (const auto& [known, level] : kLevels) {
    if (known.size() == name.size() &&
        std::equal(known.begin(), known.end(), name.begin(), [](char a, char b) {
          return a == std::tolower(static_cast<unsigned char>(b));
        })) {
      return level;
    }
  }
  return std::nullopt;
}

}  // namespace

bool is_log_level(std::string_view name) noexcept { return parse_level(name).has_value(); }

bool set_log_level(std::string_view name) {
  const auto level = parse_level(name);
  if (!level) return false;
  g_level = *level;
  spdlog::set_level(g_level);
  return true;
}

std::optional<LogFormat> parse_log_format(std::string_view s) noexcept {
  if (s == "text") return LogFormat::text;
  if (s == "json") return LogFormat::json;
  return std::nullopt;
}

namespace {

void install(std::shared_ptr<spdlog::logger> logger, LogFormat format) {
  if (format == LogFormat::json) {
    auto formatter = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
    formatter->add_flag<JsonMessageFlag>('*').set_pattern(
        R"({"ts":"%Y-%m-%dT%H:%M:%S.%eZ","level":"%l","logger":"%n","msg":"%*"})");
    logger->set_formatter(std::move(formatter));
  } else {
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%eZ %^%-5l%$ %n: %v", spdlog::pattern_time_type::utc);
  }
  logger->set_level(g_level);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(std::move(logger));
  spdlog::flush_every(std::chrono::seconds(1));
}

}  // namespace

void init_logging(std::string_view program, LogFormat format) {
  install(spdlog::stdout_logger_mt(std::string(program)), format);
}

void init_tool_logging(std::string_view program) {
  install(spdlog::stderr_logger_mt(std::string(program)), LogFormat::text);
}

}  // namespace sagapool
