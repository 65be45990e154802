#include "sagapool/failpoints.hpp"

#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "sagapool/config.hpp"

namespace sagapool::failpoints {

namespace detail {
bool g_armed = false;
}

namespace {

// The saga engine's points name its stages (the `stage` label of
// saga_stage_duration_seconds); the worker's name its ingest boundaries.
constexpr std::array<std::string_view, 28> kNames = {
    "after_insert",                           // worker: the batch's transfers inserted
    "before_claim",      "after_claim",       // initial -> pending
    "before_plan",       "after_plan",        // the batch's account snapshot
    "before_settle",     "after_settle",      // whole sagas of fresh transfers (one store)
    "before_walk",       "after_walk",        // ... across stores: one store's share written
    "after_prepare",                          // every other store prepared, the first not committed
    "after_commit_point",                     // the first store committed, the others still prepared
    "before_debit",      "after_debit",       // debit legs
    "before_credit",     "after_credit",      // credit legs
    "before_apply",      "after_apply",       // pending -> applied | canceling
    "before_cleanup",    "after_cleanup",     // pending entries released, credits voided
    "before_compensate", "after_compensate",  // debits reversed or voided
    "before_finish",     "after_finish",      // -> done | canceled (| applied: roll-forward)
    "before_publish",                         // worker: a batch's outcomes about to be produced
    "before_store_offsets",                   // worker: a durable batch's offsets about to be stored
    "before_dead_letter",                     // worker: a dead letter about to be queued
    "after_recovery_claim",                   // worker: expired transfers claimed, not yet driven
    "producer_in_flight",                     // worker: once a loop while its producer holds messages
};
// Points that are not next to a store call: `error` means nothing there.
constexpr std::array<std::string_view, 2> kNoError = {"before_publish", "before_store_offsets"};

enum class Action : std::uint8_t { none, crash, pause, error };

struct Slot {
  Action action = Action::none;
  std::int64_t pause_ms = 0;
  std::atomic<long> remaining{-1};  // hits left that fire; -1: every hit
};

std::array<Slot, kNames.size()> g_slots;

std::string known_names() {
  std::string out;
  for (std::string_view n : kNames) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

Status bad(std::string_view entry, const std::string& why) {
  return Status::fatal("SAGA_FAILPOINTS: '" + std::string(entry) + "': " + why +
                       " (expected name=[N*]crash|pause:DURATION|error, comma-separated; points: " +
                       known_names() + ")");
}

struct Parsed {
  Action action = Action::none;
  std::int64_t pause_ms = 0;
  long count = -1;
};

Status parse(std::string_view spec, std::array<Parsed, kNames.size()>& out) {
  while (!spec.empty()) {
    const std::size_t comma = spec.find(',');
    const std::string_view entry = trim(spec.substr(0, comma));
    spec = comma == std::string_view::npos ? std::string_view{} : spec.substr(comma + 1);
    if (entry.empty()) continue;
    const std::size_t eq = entry.find('=');
    if (eq == std::string_view::npos) return bad(entry, "no '='");
    const std::string_view name = trim(entry.substr(0, eq));
    std::string_view action = trim(entry.substr(eq + 1));
    std::size_t index = kNames.size();
    for (std::size_t i = 0; i < kNames.size(); ++i) {
      if (kNames[i] == name) index = i;
    }
    if (index == kNames.size()) return bad(entry, "unknown fail point '" + std::string(name) + "'");
    Parsed& p = out[index];
    if (p.action != Action::none) return bad(entry, "fail point '" + std::string(name) + "' given twice");
    if (const std::size_t star = action.find('*'); star != std::string_view::npos) {
      const std::string_view digits = action.substr(0, star);
      long n = 0;
      const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
      if (ec != std::errc() || end != digits.data() + digits.size() || digits.empty() || n <= 0) {
        return bad(entry, "the count before '*' must be a positive integer");
      }
      p.count = n;
      action.remove_prefix(star + 1);
    }
    if (action == "crash") {
      p.action = Action::crash;
    } else if (action == "error") {
      for (std::string_view n : kNoError) {
        if (n == name) return bad(entry, "'" + std::string(name) + "' is not next to a store call; use crash or pause");
      }
      p.action = Action::error;
    } else if (action.starts_with("pause:")) {
      const std::optional<std::int64_t> ms = parse_duration_ms(action.substr(6));
      if (!ms) return bad(entry, "pause needs a duration such as 500ms, 5s or 2m");
      p.action = Action::pause;
      p.pause_ms = *ms;
    } else {
      return bad(entry, "unknown action '" + std::string(action) + "'");
    }
  }
  return Status::ok();
}

[[noreturn]] void crash_now(std::string_view point) {
  // Straight to the descriptor: no buffered logger may run after this.
  const std::string line = "fail point " + std::string(point) + ": crash (SIGKILL)\n";
  ssize_t written = ::write(STDERR_FILENO, line.data(), line.size());
  (void)written;  // nothing to do if stderr is gone
  ::kill(::getpid(), SIGKILL);
  std::_Exit(128 + SIGKILL);
}

}  // namespace

std::span<const std::string_view> names() noexcept { return kNames; }

Status configure(std::string_view spec) {
  std::array<Parsed, kNames.size()> parsed{};
  if (Status s = parse(spec, parsed); !s) return s;
  bool any = false;
  for (std::size_t i = 0; i < kNames.size(); ++i) {
    g_slots[i].action = parsed[i].action;
    g_slots[i].pause_ms = parsed[i].pause_ms;
    g_slots[i].remaining.store(parsed[i].count);
    any |= parsed[i].action != Action::none;
  }
  detail::g_armed = any;
  return Status::ok();
}

Status init_from_env() {
  static std::once_flag once;
  static Status result;
  std::call_once(once, [] {
    const char* spec = std::getenv("SAGA_FAILPOINTS");
    if (spec == nullptr || *spec == '\0') return;
    result = configure(spec);
    if (result) spdlog::warn("fail points armed (SAGA_FAILPOINTS): {}", spec);
  });
  return result;
}

Status trigger(std::string_view prefix, std::string_view name) {
  std::array<char, 64> buf{};
  if (prefix.size() + name.size() > buf.size()) return Status::ok();
  std::copy(prefix.begin(), prefix.end(), buf.begin());
  std::copy(name.begin(), name.end(), buf.begin() + static_cast<std::ptrdiff_t>(prefix.size()));
  const std::string_view point(buf.data(), prefix.size() + name.size());
  std::size_t index = kNames.size();
  for (std::size_t i = 0; i < kNames.size(); ++i) {
    if (kNames[i] == point) index = i;
  }
  if (index == kNames.size()) return Status::ok();
  Slot& slot = g_slots[index];
  if (slot.action == Action::none) return Status::ok();
  long left = slot.remaining.load();
  do {
    if (left == 0) return Status::ok();
  } while (left > 0 && !slot.remaining.compare_exchange_weak(left, left - 1));
  switch (slot.action) {
    case Action::crash:
      crash_now(point);
    case Action::pause:
      spdlog::warn("fail point {}: pausing for {}ms", point, slot.pause_ms);
      std::this_thread::sleep_for(std::chrono::milliseconds(slot.pause_ms));
      spdlog::warn("fail point {}: resuming", point);
      return Status::ok();
    case Action::error:
      spdlog::warn("fail point {}: injected error", point);
      return Status::retry_stage("fail point " + std::string(point) + ": injected error");
    case Action::none:
      break;
  }
  return Status::ok();
}

}  // namespace sagapool::failpoints
