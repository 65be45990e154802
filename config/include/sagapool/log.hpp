#pragma once
// spdlog to stdout (stderr for tools), as text or as one JSON object per
// line. The JSON formatter escapes the message (spdlog's %v does not).
#include <spdlog/common.h>
#include <spdlog/formatter.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace sagapool {

enum class LogFormat { text, json };
std::optional<LogFormat> parse_log_format(std::string_view s) noexcept;

// The levels --log-level takes, any case: trace, debug, info, warn, error,
// critical, off. False for another name.
bool is_log_level(std::string_view name) noexcept;
// Sets the level of the default logger, and of those installed later (a
// program parses its flags before or after it installs its logger). Info
// until set. Returns false, changing nothing, for an unknown name.
bool set_log_level(std::string_view name);

// Installs the default logger for `program`, at the level set above.
void init_logging(std::string_view program, LogFormat format);

// The same in text on stderr, for command-line tools whose stdout is their
// result (sagactl): store reconnects and warnings must not mix into it.
void init_tool_logging(std::string_view program);

// The formatter the loggers above use (for a test's own sink).
std::unique_ptr<spdlog::formatter> make_log_formatter(LogFormat format);

// A field of an event operators search for (docs/runbooks.md): in JSON a
// key beside "msg", in text ` key=value` after the message.
struct LogField {
  LogField(std::string_view k, std::string_view v) noexcept : key(k), text(v) {}
  LogField(std::string_view k, std::int64_t n) noexcept : key(k), number(n), is_number(true) {}
  std::string_view key;
  std::string_view text;
  std::int64_t number = 0;
  bool is_number = false;
};

// One line with fields, for the events worth finding by transfer id or
// offset: dead letters, compensations, recoveries, take-overs, operator
// actions. Never for every message of the happy path.
void log_event(spdlog::level::level_enum level, std::string_view message,
               std::initializer_list<LogField> fields);

}  // namespace sagapool
