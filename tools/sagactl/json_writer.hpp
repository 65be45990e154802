#pragma once
// sagactl's --json output, written field by field: the objects are small and
// flat, so no JSON library (as for every message sagapool writes).
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "commands.hpp"
#include "sagapool/json_text.hpp"

namespace sagapool::ctl {

class JsonWriter {
 public:
  // Opens an object or array, as a value of `key` inside an object, or as
  // an element (no key) inside an array or at the top.
  JsonWriter& object(std::string_view key = {}) { return open(key, '{'); }
  JsonWriter& array(std::string_view key = {}) { return open(key, '['); }
  JsonWriter& end() {
    out_ += closers_.back();
    closers_.pop_back();
    first_ = false;
    return *this;
  }
  JsonWriter& string(std::string_view key, std::string_view value) {
    name(key) += '"';
    append_json_escaped(out_, value);
    out_ += '"';
    return *this;
  }
  // null for an empty value.
  JsonWriter& string_or_null(std::string_view key, std::string_view value) {
    return value.empty() ? raw(key, "null") : string(key, value);
  }
  JsonWriter& number(std::string_view key, std::int64_t value) { return raw(key, std::to_string(value)); }
  JsonWriter& boolean(std::string_view key, bool value) { return raw(key, value ? "true" : "false"); }
  // As format_time_ms writes it; null for 0 (never).
  JsonWriter& time(std::string_view key, std::int64_t ms) {
    return ms == 0 ? raw(key, "null") : string(key, format_time_ms(ms));
  }
  // Text that is JSON already (metadata kept verbatim, null, true...).
  JsonWriter& raw(std::string_view key, std::string_view json) {
    name(key) += json;
    return *this;
  }
  const std::string& text() const { return out_; }

 private:
  JsonWriter& open(std::string_view key, char bracket) {
    name(key) += bracket;
    closers_.push_back(bracket == '{' ? '}' : ']');
    first_ = true;
    return *this;
  }
  std::string& name(std::string_view key) {
    if (!first_) out_ += ',';
    first_ = false;
    if (!key.empty()) {
      out_ += '"';
      append_json_escaped(out_, key);
      out_ += "\":";
    }
    return out_;
  }

  std::string out_;
  std::vector<char> closers_;
  bool first_ = true;
};

}  // namespace sagapool::ctl
