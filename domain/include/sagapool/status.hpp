#pragma once
// The one error taxonomy used everywhere (see STYLE.md, "Errors").
// Backend-specific codes (SQLite result codes, SQLSTATEs, Kafka errors) are
// mapped onto it in one place per backend.
#include <string>
#include <string_view>
#include <utility>

namespace sagapool {

enum class ErrorKind : unsigned char {
  ok,
  retry_call,   // transient I/O: repeat the same call after a short backoff
  retry_stage,  // lease lost or store unavailable: leave the work to recovery
  compensate,   // a business rule failed: reverse what was done
  fatal,        // configuration or corrupted state: stop with a clear message
};

std::string_view to_string(ErrorKind kind) noexcept;

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status ok() { return {}; }
  static Status error(ErrorKind kind, std::string message) {
    return Status(kind, std::move(message));
  }
  static Status retry_call(std::string m) { return error(ErrorKind::retry_call, std::move(m)); }
  static Status retry_stage(std::string m) { return error(ErrorKind::retry_stage, std::move(m)); }
  static Status fatal(std::string m) { return error(ErrorKind::fatal, std::move(m)); }

  bool is_ok() const noexcept { return kind_ == ErrorKind::ok; }
  explicit operator bool() const noexcept { return is_ok(); }
  ErrorKind kind() const noexcept { return kind_; }
  const std::string& message() const noexcept { return message_; }
  // True for errors that go away by themselves (retry the call or the stage).
  bool is_transient() const noexcept {
    return kind_ == ErrorKind::retry_call || kind_ == ErrorKind::retry_stage;
  }
  void ignore() const noexcept {}

 private:
  Status(ErrorKind kind, std::string message) : kind_(kind), message_(std::move(message)) {}
  ErrorKind kind_ = ErrorKind::ok;
  std::string message_;
};

}  // namespace sagapool
