#pragma once
// JSON text for the messages and reports sagapool writes by hand (outcomes,
// requests, logs, sagactl's output): they are flat, so no JSON library.
#include <string>
#include <string_view>

namespace sagapool {

// Appends `s` to `out` as the inside of a JSON string literal.
void append_json_escaped(std::string& out, std::string_view s);

}  // namespace sagapool
