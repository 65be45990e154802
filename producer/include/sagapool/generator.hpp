#pragma once
// Seeded load generator for saga-producer --generate: the same options and
// seed always give the same messages, byte for byte, on every platform (the
// random draws use only std::mt19937_64's raw output, never the
// implementation-defined std:: distributions).
#include <array>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "sagapool/status.hpp"

namespace sagapool {

enum class GeneratedKind : std::uint8_t {
  valid,            // amount 1..10,000 between two known accounts
  overdraw,         // valid request, amount > 10^9 (more than any demo balance)
  unknown_account,  // valid request naming acct-unknown-<n> as source or destination
  invalid,          // breaks a rule of DESIGN.md "Messages" (see InvalidKind)
};
inline constexpr std::size_t kGeneratedKindCount = 4;

// The invalid share rotates through these, in this order.
enum class InvalidKind : std::uint8_t {
  malformed_json,
  negative_amount,
  float_amount,
  unknown_key,
  same_account,
  missing_field,
  leading_zero,
  bad_currency,
  not_utf8,
};
inline constexpr std::size_t kInvalidKindCount = 9;

std::string_view to_string(GeneratedKind k) noexcept;
std::string_view to_string(InvalidKind k) noexcept;

struct GeneratorOptions {
  std::uint64_t count = 0;       // messages to generate
  std::uint64_t accounts = 0;    // accounts acct-0 .. acct-<accounts-1>; >= 2
  std::uint64_t seed = 1;
  double invalid_ratio = 0.01;
  double overdraw_ratio = 0.02;
  double unknown_ratio = 0.01;
  double zipf_s = 1.1;           // skew of the account choice (acct-0 is hottest)
  std::string id_prefix = "g";   // ids are <prefix>-<seed>-<n>, n from 0
};

struct GeneratedMessage {
  GeneratedKind kind = GeneratedKind::valid;
  InvalidKind invalid = InvalidKind::malformed_json;  // meaningful for kind == invalid
  std::uint64_t sequence = 0;
  std::string_view key;    // the source account; views into the generator,
  std::string_view value;  // valid until the next call to next()
};

class Generator {
 public:
  // Checks the options (ratios in [0,1] summing to at most 1, accounts >= 2,
  // a prefix that keeps ids valid); fatal Status otherwise.
  static Status validate(const GeneratorOptions& options);
  // `options` must have passed validate().
  explicit Generator(GeneratorOptions options);

  // False once `count` messages were generated.
  bool next(GeneratedMessage& out);

  std::uint64_t generated() const noexcept { return sequence_; }
  std::uint64_t count(GeneratedKind k) const noexcept {
    return kind_counts_[static_cast<std::size_t>(k)];
  }
  std::uint64_t count(InvalidKind k) const noexcept {
    return invalid_counts_[static_cast<std::size_t>(k)];
  }
  const GeneratorOptions& options() const noexcept { return options_; }

  // Index of a Zipf-distributed account for a uniform draw u in [0,1).
  std::uint64_t zipf_index(double u) const noexcept;

 private:
  double uniform01() noexcept;
  std::uint64_t uniform(std::uint64_t lo, std::uint64_t hi) noexcept;  // inclusive
  std::uint64_t pick_account() noexcept;
  void build(GeneratedKind kind, InvalidKind invalid);

  GeneratorOptions options_;
  std::mt19937_64 rng_;
  std::vector<double> cdf_;  // cumulative Zipf weights, cdf_.back() == 1
  std::uint64_t sequence_ = 0;
  std::uint64_t invalid_rotation_ = 0;
  std::array<std::uint64_t, kGeneratedKindCount> kind_counts_{};
  std::array<std::uint64_t, kInvalidKindCount> invalid_counts_{};
  std::string key_;
  std::string to_;
  std::string value_;
};

}  // namespace sagapool
