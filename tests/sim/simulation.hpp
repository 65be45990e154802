#pragma once
// Deterministic simulation of saga workers (DESIGN.md, "States and stages",
// "Invariants"; STYLE.md, "Tests"): the real SagaEngine, the real request
// validator and the real audit, run against in-memory stores on a manual
// clock, with a simulated Kafka (partitions, a consumer group, committed
// offsets, an outcomes topic and a dead-letter topic), all driven by one
// seed. Everything a run does follows from its seed, so a failing seed
// replays exactly.
#include <cstdint>
#include <map>
#include <string>

namespace sagapool::sim {

// What one or many runs did; the figures docs/RELIABILITY.md reports.
struct SimStats {
  std::map<std::string, std::int64_t> counters;
  void add(const SimStats& other);
  std::int64_t& operator[](const std::string& name) { return counters[name]; }
  std::string to_text() const;
};

struct SimOptions {
  bool trace = false;  // print every event of the run on stdout
};

struct SimResult {
  bool ok = true;
  std::string config;   // the run's drawn configuration, one line
  std::string failure;  // what broke, and where
  SimStats stats;
};

SimResult run_simulation(std::uint64_t seed, const SimOptions& options);

}  // namespace sagapool::sim
