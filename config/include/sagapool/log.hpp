#pragma once
// spdlog to stdout (stderr for tools), as text or as one JSON object per
// line. The JSON formatter escapes the message (spdlog's %v does not).
#include <optional>
#include <string>
#include <string_view>

namespace sagapool {

enum class LogFormat { text, json };
std::optional<LogFormat> parse_log_format(std::string_view s) noexcept;

// Installs the default logger for `program`. Level from SAGA_LOG_LEVEL
// (trace|debug|info|warn|error), info by default.
void init_logging(std::string_view program, LogFormat format);

// The same in text on stderr, for command-line tools whose stdout is their
// result (sagactl): store reconnects and warnings must not mix into it.
void init_tool_logging(std::string_view program);

}  // namespace sagapool
