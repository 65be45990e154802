// saga-sim: runs the deterministic simulation for a range of seeds.
//
//   saga-sim --seeds N [--first-seed S] [--jobs J]   seeds S .. S+N-1 (S = 1)
//   saga-sim --seed N [--trace]                       one seed, optionally every event
//   --int64-edges: accepted for old replay commands; accounts near INT64_MAX
//   are now always debited too (the reservation made that safe)
//
// A failing seed prints what broke and the command that replays it; the
// exit code is 1 if any seed failed, 2 for a usage error.
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "simulation.hpp"

namespace {

bool parse_u64(const char* text, std::uint64_t& out) {
  const char* end = text + std::strlen(text);
  const auto [ptr, ec] = std::from_chars(text, end, out);
  return ec == std::errc() && ptr == end && ptr != text;
}

int usage(const char* argv0, const std::string& error) {
  if (!error.empty()) std::cerr << "saga-sim: " << error << "\n";
  std::cerr << "usage: " << argv0 << " --seeds N [--first-seed S] [--jobs J]\n"
            << "       " << argv0 << " --seed N [--trace]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t seeds = 0;
  std::uint64_t first = 1;
  std::uint64_t jobs = 1;
  bool single = false;
  bool trace = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&](std::uint64_t& out) {
      return i + 1 < argc && parse_u64(argv[++i], out);
    };
    if (arg == "--seeds") {
      if (!value(seeds) || seeds == 0) return usage(argv[0], "--seeds needs a positive number");
    } else if (arg == "--first-seed") {
      if (!value(first)) return usage(argv[0], "--first-seed needs a number");
    } else if (arg == "--seed") {
      if (!value(first)) return usage(argv[0], "--seed needs a number");
      single = true;
      seeds = 1;
    } else if (arg == "--jobs") {
      if (!value(jobs) || jobs == 0 || jobs > 256) return usage(argv[0], "--jobs needs 1..256");
    } else if (arg == "--trace") {
      trace = true;
    } else if (arg == "--int64-edges") {
      // Once needed to debit accounts near INT64_MAX; every run does now.
    } else if (arg == "--help" || arg == "-h") {
      return usage(argv[0], "");
    } else {
      return usage(argv[0], "unknown argument " + std::string(arg));
    }
  }
  if (seeds == 0) return usage(argv[0], "say --seeds N or --seed N");

  // The workers' own log lines join the trace; otherwise they are noise.
  spdlog::set_level(trace ? spdlog::level::info : spdlog::level::off);
  const auto started = std::chrono::steady_clock::now();
  sagapool::sim::SimOptions options;
  options.trace = trace;
  std::mutex mu;
  sagapool::sim::SimStats total;
  std::uint64_t failed = 0;
  std::atomic<std::uint64_t> next{0};
  auto work = [&] {
    for (std::uint64_t k = next++; k < seeds; k = next++) {
      const std::uint64_t seed = first + k;
      sagapool::sim::SimResult r = sagapool::sim::run_simulation(seed, options);
      std::lock_guard lock(mu);
      total.add(r.stats);
      if (single) std::cout << "seed " << seed << ": " << r.config << "\n";
      if (!r.ok) {
        ++failed;
        std::cout << "FAIL seed " << seed << ": " << r.config << "\n  " << r.failure << "\n  replay: "
                  << argv[0] << " --seed " << seed << "\n"
                  << std::flush;
      }
    }
  };
  std::vector<std::thread> threads;
  for (std::uint64_t j = 1; j < jobs; ++j) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();

  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::cout << "saga-sim: " << seeds << " seed(s) from " << first << ", " << failed << " failed, "
            << std::fixed << std::setprecision(1) << secs << " s\n"
            << total.to_text();
  return failed == 0 ? 0 : 1;
}
