#pragma once
// Domain vocabulary shared by every component: transfer states, reason codes,
// posting kinds, and the documents of DESIGN.md ("Documents").
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace sagapool {

enum class TransferState : std::uint8_t { initial, pending, applied, canceling, done, canceled };
inline constexpr int kTransferStateCount = 6;

enum class Reason : std::uint8_t {
  none,
  invalid,
  conflict,
  unknown_account,
  account_locked,
  insufficient_funds,
  currency_mismatch,
  canceled_by_operator,
  overflow,
};
inline constexpr int kReasonCount = 9;

enum class PostingKind : std::uint8_t { debit, credit, reverse_debit };

std::string_view to_string(TransferState s) noexcept;
std::string_view to_string(Reason r) noexcept;
std::string_view to_string(PostingKind k) noexcept;
std::optional<TransferState> parse_transfer_state(std::string_view s) noexcept;
std::optional<Reason> parse_reason(std::string_view s) noexcept;
std::optional<PostingKind> parse_posting_kind(std::string_view s) noexcept;

constexpr bool is_terminal(TransferState s) noexcept {
  return s == TransferState::done || s == TransferState::canceled;
}

// The legal edges of the saga (DESIGN.md, "States and stages"). canceling ->
// applied is the roll-forward taken when compensation finds both legs posted
// (a zombie finished the credit): a transfer with both legs posted never
// cancels.
constexpr bool is_legal_transition(TransferState from, TransferState to) noexcept {
  using S = TransferState;
  switch (from) {
    case S::initial: return to == S::pending || to == S::canceling;
    case S::pending: return to == S::applied || to == S::canceling;
    case S::applied: return to == S::done;
    case S::canceling: return to == S::canceled || to == S::applied;
    case S::done:
    case S::canceled: return false;
  }
  return false;
}

// Where a request came from, kept on the transfer for tracing.
struct Origin {
  std::string topic;
  std::int32_t partition = -1;
  std::int64_t offset = -1;
};

// A transfer document as stored (DESIGN.md "Documents"). Times are
// milliseconds since the Unix epoch on the store's clock; requested_at is the
// request's Kafka timestamp, finished_at is set on reaching a terminal state.
struct TransferDoc {
  std::string id;
  std::string source;
  std::string destination;
  std::int64_t amount = 0;
  std::string currency;  // empty: the request named none
  std::string metadata;  // the request's metadata object, verbatim; empty if none
  std::uint64_t payload_hash = 0;
  TransferState state = TransferState::initial;
  std::string owner;
  std::int64_t epoch = 0;
  std::int64_t lease_until_ms = 0;
  Reason reason = Reason::none;
  std::int64_t created_at_ms = 0;
  std::int64_t last_modified_ms = 0;
  std::int64_t requested_at_ms = 0;
  std::int64_t finished_at_ms = 0;
  std::int32_t attempts = 0;
  bool notified = false;
  Origin origin;
};

struct Account {
  std::string id;
  std::int64_t balance = 0;
  std::int64_t opening_balance = 0;
  std::int64_t min_balance = 0;  // 0 = no credit; negative = an overdraft line
  std::string currency;          // empty: any currency
  bool locked = false;
  // Sum of the amounts of this account's posted debits that may still be
  // reversed (their pending entry is still here). Credits are refused with
  // `overflow` unless balance + reserved + amount <= INT64_MAX, so every
  // such reversal always fits.
  std::int64_t reserved = 0;
};

struct Posting {
  std::string transfer_id;
  std::string account_id;
  PostingKind kind = PostingKind::debit;
  std::int64_t amount = 0;  // always positive; the kind gives the sign
  std::int64_t at_ms = 0;
};

// Signed effect of a posting on its account's balance.
constexpr std::int64_t signed_amount(PostingKind kind, std::int64_t amount) noexcept {
  return kind == PostingKind::debit ? -amount : amount;
}

}  // namespace sagapool
