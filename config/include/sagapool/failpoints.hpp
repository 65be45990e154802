#pragma once
// Named fail points (docs/RELIABILITY.md, "Fail points"): places in
// saga-worker where a process-level test or an operator's game day can
// crash, pause or fail a worker exactly there.
//
//   SAGA_FAILPOINTS=after_debit=crash,before_finish=pause:5s,after_claim=2*error
//
// Each entry is `name=[N*]action`: `crash` (the process kills itself with
// SIGKILL: no cleanup, no flush, exactly like `kill -9`), `pause:D` (sleep
// for D: 500ms, 5s, 2m), `error` (the store call at that point reports a
// transient error: the stage is left to recovery, as on a lost connection).
// `N*` fires the action on the first N hits only; without it, every hit.
// An engine point fires once per store call, so on several stores once per
// shard. `error` is allowed only at points that precede or follow a store
// call.
//
// Off unless a program calls init_from_env() and the variable is set: then a
// check costs one predictable branch on a global bool (SAGA_FAILPOINT).
#include <span>
#include <string_view>

#include "sagapool/status.hpp"

namespace sagapool::failpoints {

namespace detail {
extern bool g_armed;  // any fail point configured
}

// Every point's name, in the order of a batch's life.
std::span<const std::string_view> names() noexcept;

// Parses SAGA_FAILPOINTS once (later calls do nothing). Unset or empty:
// everything stays off. A bad spec is a fatal Status that names the
// problem and the known points.
Status init_from_env();

// Parses `spec` (same syntax) and arms it, replacing what was armed; an
// empty spec disarms everything. For tests.
Status configure(std::string_view spec);

// The slow path behind SAGA_FAILPOINT: runs the action armed at
// `prefix` + `name`, if any. Returns ok, or the injected transient error.
Status trigger(std::string_view prefix, std::string_view name = {});

}  // namespace sagapool::failpoints

// Evaluates to ok (a Status) when nothing is armed; otherwise triggers the
// point `prefix` + `name`. Use: `if (Status fp = SAGA_FAILPOINT("after_debit"); !fp) return fp;`
#define SAGA_FAILPOINT(...)                                               \
  (__builtin_expect(::sagapool::failpoints::detail::g_armed ? 1 : 0, 0) \
       ? ::sagapool::failpoints::trigger(__VA_ARGS__)                     \
       : ::sagapool::Status())
