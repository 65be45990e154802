#pragma once
// The ledger audit: checks every invariant of DESIGN.md ("Invariants")
// across all stores and says which failed and where. Used by `sagactl
// audit`, the tests and the demo.
#include <cstdint>
#include <string>
#include <vector>

#include "sagapool/ledger.hpp"

namespace sagapool {

// 128-bit sums: totals of int64 balances must not overflow.
__extension__ typedef __int128 Wide;
__extension__ typedef unsigned __int128 UWide;

struct AuditCheck {
  int invariant = 0;  // 1..6 as numbered in DESIGN.md
  std::string name;
  bool ok = true;
  std::string detail;                 // what was checked, with figures
  std::vector<std::string> examples;  // where it failed (bounded)
};

struct AuditReport {
  std::vector<AuditCheck> checks;
  std::int64_t accounts = 0;
  std::int64_t postings = 0;
  std::int64_t transfers = 0;
  std::int64_t in_flight = 0;        // non-terminal transfers
  std::int64_t unpublished = 0;      // terminal, outcome not yet published
  Wide total_balance = 0;
  Wide total_opening = 0;
  Wide in_flight_net = 0;        // signed postings of non-terminal transfers
  bool ok() const;
  std::string to_text() const;
  std::string to_json() const;
};

struct AuditOptions {
  // Invariant 6: a non-terminal transfer untouched for longer than this is
  // a failure.
  std::int64_t stuck_after_ms = 5 * 60 * 1000;
  std::size_t max_examples = 10;
};

Status run_audit(Ledger& ledger, const AuditOptions& options, AuditReport& out);

std::string to_decimal(Wide v);

}  // namespace sagapool
