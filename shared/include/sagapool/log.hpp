#pragma once
// spdlog to stdout, as text or as one JSON object per line. The JSON
// formatter escapes the message (spdlog's %v does not).
#include <optional>
#include <string>
#include <string_view>

namespace sagapool {

enum class LogFormat { text, json };
std::optional<LogFormat> parse_log_format(std::string_view s) noexcept;

// Installs the default logger for `program`. Level from SAGA_LOG_LEVEL
// (trace|debug|info|warn|error), info by default.
void init_logging(std::string_view program, LogFormat format);

// Appends `s` to `out` as the inside of a JSON string literal.
void append_json_escaped(std::string& out, std::string_view s);

}  // namespace sagapool
