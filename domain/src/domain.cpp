#include "sagapool/domain.hpp"

namespace sagapool {
namespace {
constexpr std::string_view kStates[] = {"initial", "pending", "applied",
                                        "canceling", "done", "canceled"};
constexpr std::string_view kReasons[] = {"none", "invalid", "conflict", "unknown_account",
                                         "account_locked", "insufficient_funds",
                                         "currency_mismatch", "canceled_by_operator",
                                         "overflow"};
constexpr std::string_view kKinds[] = {"debit", "credit", "reverse_debit"};

template <typename E, std::size_t N>
std::optional<E> parse_from(const std::string_view (&names)[N], std::string_view s) noexcept {
  for (std::size_t i = 0; i < N; ++i) {
    if (names[i] == s) return static_cast<E>(i);
  }
  return std::nullopt;
}
}  // namespace

std::string_view to_string(TransferState s) noexcept { return kStates[static_cast<int>(s)]; }
std::string_view to_string(Reason r) noexcept { return kReasons[static_cast<int>(r)]; }
std::string_view to_string(PostingKind k) noexcept { return kKinds[static_cast<int>(k)]; }
std::optional<TransferState> parse_transfer_state(std::string_view s) noexcept {
  return parse_from<TransferState>(kStates, s);
}
std::optional<Reason> parse_reason(std::string_view s) noexcept {
  return parse_from<Reason>(kReasons, s);
}
std::optional<PostingKind> parse_posting_kind(std::string_view s) noexcept {
  return parse_from<PostingKind>(kKinds, s);
}

}  // namespace sagapool
