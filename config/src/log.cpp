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

// The fields of the log_event call being formatted. The loggers are
// synchronous, so the formatter runs on the calling thread, inside the call.
thread_local const std::initializer_list<LogField>* t_fields = nullptr;

class FieldsFlag final : public spdlog::custom_flag_formatter {
 public:
  explicit FieldsFlag(bool json) : json_(json) {}
  void format(const spdlog::details::log_msg&, const std::tm&, spdlog::memory_buf_t& dest) override {
    if (t_fields == nullptr) return;
    std::string out;
    for (const LogField& f : *t_fields) {
      if (json_) {
        out += ",\"";
        append_json_escaped(out, f.key);
        out += "\":";
      } else {
        out += ' ';
        out += f.key;
        out += '=';
      }
      if (f.is_number) {
        out += std::to_string(f.number);
      } else if (json_ || f.text.empty() || f.text.find_first_of(" \"=") != std::string_view::npos) {
        out += '"';
        append_json_escaped(out, f.text);
        out += '"';
      } else {
        out += f.text;
      }
    }
    dest.append(out.data(), out.data() + out.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override { return std::make_unique<FieldsFlag>(json_); }

 private:
  bool json_;
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
  logger->set_formatter(make_log_formatter(format));
  logger->set_level(g_level);
  logger->flush_on(spdlog::level::warn);
  spdlog::set_default_logger(std::move(logger));
  spdlog::flush_every(std::chrono::seconds(1));
}

}  // namespace

std::unique_ptr<spdlog::formatter> make_log_formatter(LogFormat format) {
  auto formatter = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
  const bool json = format == LogFormat::json;
  formatter->add_flag<JsonMessageFlag>('*');
  formatter->add_flag<FieldsFlag>('&', json);
  formatter->set_pattern(json ? R"({"ts":"%Y-%m-%dT%H:%M:%S.%eZ","level":"%l","logger":"%n","msg":"%*"%&})"
                              : "%Y-%m-%dT%H:%M:%S.%eZ %^%-5l%$ %n: %v%&");
  return formatter;
}

void log_event(spdlog::level::level_enum level, std::string_view message,
               std::initializer_list<LogField> fields) {
  t_fields = &fields;
  spdlog::log(level, "{}", message);
  t_fields = nullptr;
}

void init_logging(std::string_view program, LogFormat format) {
  install(spdlog::stdout_logger_mt(std::string(program)), format);
}

void init_tool_logging(std::string_view program) {
  install(spdlog::stderr_logger_mt(std::string(program)), LogFormat::text);
}

}  // namespace sagapool
