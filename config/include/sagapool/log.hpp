#pragma once
// spdlog to stdout (stderr for tools), as text or as one JSON object per
// line. The JSON formatter escapes the message (spdlog's %v does not).
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

}  // namespace sagapool
