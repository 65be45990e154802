#pragma once
// One chaos run (Jepsen's "bank" workload against real processes): a
// broker (real Kafka or saga-broker), a store, a pool of saga-worker processes, a seeded nemesis
// and the checks described in docs/RELIABILITY.md ("Process chaos").
#include <cstdint>
#include <filesystem>
#include <string>

namespace sagapool::chaos {

struct ChaosOptions {
  std::string store = "sqlite";  // sqlite | postgresql
  // kafka: a real three-node Apache Kafka (replication 3,
  // min.insync.replicas 2), its nodes killed, paused and restarted.
  // mock: saga-broker, its brokers taken down and Kafka errors injected.
  std::string broker = "kafka";
  int accounts = 8;
  int duration_s = 60;  // how long the nemesis runs
  std::uint64_t seed = 1;
  int workers = 4;
  double rate = 100;  // requests per second while the nemesis runs
  int lease_s = 2;
  std::filesystem::path log_dir;  // where to keep the logs; empty: nowhere
  // The command line that replays this run (same workload, same fault
  // schedule; the interleaving is the machine's).
  std::string replay_command() const;
};

// Prints the figures; returns 0 when every check passed, 1 otherwise, 77
// when PostgreSQL is asked for and not installed.
int run_chaos(const ChaosOptions& options);

}  // namespace sagapool::chaos
