#include "sagapool/status.hpp"

namespace sagapool {

std::string_view to_string(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::ok: return "ok";
    case ErrorKind::retry_call: return "retry_call";
    case ErrorKind::retry_stage: return "retry_stage";
    case ErrorKind::compensate: return "compensate";
    case ErrorKind::fatal: return "fatal";
  }
  return "unknown";
}

}  // namespace sagapool
