#include "sagapool/generator.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "sagapool/request.hpp"

namespace sagapool {
namespace {

// Amounts: normal traffic stays far below the demo's 1,000,000 opening
// balances; overdraws exceed any of them.
constexpr std::uint64_t kAmountMax = 10'000;
constexpr std::uint64_t kOverdrawMin = 1'000'000'001;
constexpr std::uint64_t kOverdrawMax = 1'000'000'000'000;
// Accounts above this get no Zipf table entry of their own: the tail past it
// is vanishingly rare at s ~ 1.1, and the bound keeps the table at 8 MiB.
constexpr std::uint64_t kZipfTableMax = 1'000'000;

void append_number(std::string& out, std::uint64_t v) {
  char digits[24];
  const auto [end, ec] = std::to_chars(std::begin(digits), std::end(digits), v);
  (void)ec;  // 24 chars always hold a uint64
  out.append(digits, end);
}

void append_account(std::string& out, std::uint64_t index) {
  out += "acct-";
  append_number(out, index);
}

}  // namespace

std::string_view to_string(GeneratedKind k) noexcept {
  switch (k) {
    case GeneratedKind::valid: return "valid";
    case GeneratedKind::overdraw: return "overdraw";
    case GeneratedKind::unknown_account: return "unknown_account";
    case GeneratedKind::invalid: return "invalid";
  }
  return "?";
}

std::string_view to_string(InvalidKind k) noexcept {
  switch (k) {
    case InvalidKind::malformed_json: return "malformed_json";
    case InvalidKind::negative_amount: return "negative_amount";
    case InvalidKind::float_amount: return "float_amount";
    case InvalidKind::unknown_key: return "unknown_key";
    case InvalidKind::same_account: return "same_account";
    case InvalidKind::missing_field: return "missing_field";
    case InvalidKind::leading_zero: return "leading_zero";
    case InvalidKind::bad_currency: return "bad_currency";
    case InvalidKind::not_utf8: return "not_utf8";
  }
  return "?";
}

Status Generator::validate(const GeneratorOptions& o) {
  auto bad_ratio = [](double r) { return !(r >= 0.0 && r <= 1.0); };  // also rejects NaN
  if (bad_ratio(o.invalid_ratio) || bad_ratio(o.overdraw_ratio) || bad_ratio(o.unknown_ratio)) {
    return Status::fatal("ratios must be between 0 and 1");
  }
  if (o.invalid_ratio + o.overdraw_ratio + o.unknown_ratio > 1.0 + 1e-9) {
    return Status::fatal("--invalid-ratio + --overdraw-ratio + --unknown-ratio must not exceed 1");
  }
  if (o.accounts < 2) return Status::fatal("--accounts must be at least 2");
  if (!(o.zipf_s > 0.0 && o.zipf_s < 10.0)) return Status::fatal("zipf exponent out of range");
  // The longest id: prefix + "-" + 20 digits + "-" + 20 digits.
  if (!is_valid_identifier(o.id_prefix, kMaxIdLength - 42)) {
    return Status::fatal("--id-prefix must be 1.." + std::to_string(kMaxIdLength - 42) +
                         " characters of [A-Za-z0-9._:-]");
  }
  return Status::ok();
}

Generator::Generator(GeneratorOptions options) : options_(std::move(options)), rng_(options_.seed) {
  const std::uint64_t n = std::min(options_.accounts, kZipfTableMax);
  cdf_.resize(n);
  double sum = 0.0;
  for (std::uint64_t i = 0; i < n; ++i) {
    sum += 1.0 / std::pow(static_cast<double>(i + 1), options_.zipf_s);
    cdf_[i] = sum;
  }
  for (double& c : cdf_) c /= sum;
  cdf_.back() = 1.0;
  key_.reserve(64);
  value_.reserve(256);
}

double Generator::uniform01() noexcept {
  // The top 53 bits as a double in [0, 1): exact and platform-independent.
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

std::uint64_t Generator::uniform(std::uint64_t lo, std::uint64_t hi) noexcept {
  const std::uint64_t span = hi - lo + 1;  // callers keep hi - lo < 2^64 - 1
  // Rejection sampling removes the modulo bias; expected < 2 draws.
  const std::uint64_t limit = UINT64_MAX - UINT64_MAX % span;
  std::uint64_t x = rng_();
  while (x >= limit) x = rng_();
  return lo + x % span;
}

std::uint64_t Generator::zipf_index(double u) const noexcept {
  const auto it = std::upper_bound(cdf_.begin(), cdf_.end(), u);
  const auto i = static_cast<std::uint64_t>(it - cdf_.begin());
  return std::min<std::uint64_t>(i, cdf_.size() - 1);
}

std::uint64_t Generator::pick_account() noexcept {
  const std::uint64_t i = zipf_index(uniform01());
  // The table covers at most kZipfTableMax accounts; its last slot stands for
  // the whole tail, spread uniformly over it.
  if (i + 1 == cdf_.size() && options_.accounts > cdf_.size()) {
    return uniform(i, options_.accounts - 1);
  }
  return i;
}

bool Generator::next(GeneratedMessage& out) {
  if (sequence_ >= options_.count) return false;
  const double u = uniform01();
  GeneratedKind kind = GeneratedKind::valid;
  if (u < options_.invalid_ratio) {
    kind = GeneratedKind::invalid;
  } else if (u < options_.invalid_ratio + options_.overdraw_ratio) {
    kind = GeneratedKind::overdraw;
  } else if (u < options_.invalid_ratio + options_.overdraw_ratio + options_.unknown_ratio) {
    kind = GeneratedKind::unknown_account;
  }
  InvalidKind invalid = InvalidKind::malformed_json;
  if (kind == GeneratedKind::invalid) {
    invalid = static_cast<InvalidKind>(invalid_rotation_++ % kInvalidKindCount);
    ++invalid_counts_[static_cast<std::size_t>(invalid)];
  }
  ++kind_counts_[static_cast<std::size_t>(kind)];
  build(kind, invalid);
  out.kind = kind;
  out.invalid = invalid;
  out.sequence = sequence_;
  out.key = key_;
  out.value = value_;
  ++sequence_;
  return true;
}

void Generator::build(GeneratedKind kind, InvalidKind invalid) {
  // Every draw depends only on the seed and the options, so a run can be
  // replayed from its seed alone.
  const std::uint64_t from = pick_account();
  std::uint64_t to = pick_account();
  for (int tries = 0; to == from && tries < 16; ++tries) to = pick_account();
  if (to == from) to = (from + 1 + uniform(0, options_.accounts - 2)) % options_.accounts;
  const bool unknown_is_source = (rng_() & 1U) != 0;
  std::uint64_t amount = uniform(1, kAmountMax);
  if (kind == GeneratedKind::overdraw) amount = uniform(kOverdrawMin, kOverdrawMax);

  key_.clear();
  std::string& to_account = to_;
  to_account.clear();
  if (kind == GeneratedKind::unknown_account && unknown_is_source) {
    key_ = "acct-unknown-";
    append_number(key_, sequence_);
  } else {
    append_account(key_, from);
  }
  if (kind == GeneratedKind::unknown_account && !unknown_is_source) {
    to_account = "acct-unknown-";
    append_number(to_account, sequence_);
  } else if (kind == GeneratedKind::invalid && invalid == InvalidKind::same_account) {
    to_account = key_;
  } else {
    append_account(to_account, to);
  }

  std::string& v = value_;
  v.clear();
  v += R"({"id": ")";
  v += options_.id_prefix;
  v += '-';
  append_number(v, options_.seed);
  v += '-';
  append_number(v, sequence_);
  v += R"(", "from": ")";
  v += key_;
  if (kind == GeneratedKind::invalid && invalid == InvalidKind::malformed_json) {
    v += R"(", "to": )";  // cut off mid-object, as a crashed writer would leave it
    return;
  }
  if (!(kind == GeneratedKind::invalid && invalid == InvalidKind::missing_field)) {
    v += R"(", "to": ")";
    v += to_account;
  }
  v += R"(", "amount": )";
  if (kind != GeneratedKind::invalid) {
    append_number(v, amount);
    v += '}';
    return;
  }
  switch (invalid) {
    case InvalidKind::negative_amount:
      v += '-';
      append_number(v, amount);
      break;
    case InvalidKind::float_amount:
      append_number(v, amount);
      v += ".5";
      break;
    case InvalidKind::unknown_key:
      append_number(v, amount);
      v += R"(, "memo": "not a known key")";
      break;
    case InvalidKind::leading_zero:
      v += '0';
      append_number(v, amount);
      break;
    case InvalidKind::bad_currency:
      append_number(v, amount);
      v += R"(, "currency": "eur")";
      break;
    case InvalidKind::not_utf8:
      append_number(v, amount);
      v += R"(, "metadata": {"note": "caf)";
      v += '\xE9';  // Latin-1 e-acute: a lone byte that is not UTF-8
      v += R"("})";
      break;
    case InvalidKind::malformed_json:  // handled above
    case InvalidKind::same_account:
    case InvalidKind::missing_field:
      append_number(v, amount);
      break;
  }
  v += '}';
}

}  // namespace sagapool
