// saga-chaos: process chaos, Jepsen "bank" style. A broker (three real
// Apache Kafka nodes, or saga-broker), a store (SQLite or PostgreSQL) and a
// pool of saga-worker processes move money while a seeded nemesis kills and
// pauses workers, kills, pauses and restarts Kafka nodes (or, on
// saga-broker, takes the brokers down and injects Kafka request errors) and
// kills store connections; reads during the run check conservation, and
// after it the pool must settle with every request answered exactly once
// and the audit passing.
//
//   saga-chaos --broker kafka|mock --store sqlite|postgresql --accounts 8|1000 --duration S --seed N
//
// Exit code 0 when every check passed, 1 otherwise (with the seed and the
// command that replays the run), 77 when PostgreSQL is asked for and not
// installed.
#include <CLI/CLI.hpp>

#include "chaos_run.hpp"

int main(int argc, char** argv) {
  sagapool::chaos::ChaosOptions o;
  CLI::App app{"saga-chaos: process chaos against a real saga-worker pool"};
  app.add_option("--broker", o.broker,
                 "kafka (three real Apache Kafka nodes, killed, paused and restarted) or mock "
                 "(saga-broker: brokers down, injected request errors)")
      ->check(CLI::IsMember({"kafka", "mock"}))
      ->capture_default_str();
  app.add_option("--store", o.store, "sqlite or postgresql")
      ->check(CLI::IsMember({"sqlite", "postgresql"}))
      ->capture_default_str();
  app.add_option("--accounts", o.accounts, "accounts, each opening with 100")
      ->check(CLI::Range(2, 100'000))
      ->capture_default_str();
  app.add_option("--duration", o.duration_s, "seconds the nemesis runs")
      ->check(CLI::Range(1, 24 * 3600))
      ->capture_default_str();
  app.add_option("--seed", o.seed, "seeds the workload and the fault schedule")
      ->capture_default_str();
  app.add_option("--workers", o.workers, "saga-worker processes")
      ->check(CLI::Range(1, 32))
      ->capture_default_str();
  app.add_option("--rate", o.rate, "requests per second while the nemesis runs")
      ->check(CLI::Range(1.0, 10'000.0))
      ->capture_default_str();
  app.add_option("--lease", o.lease_s, "the workers' --lease, in seconds; pauses last longer")
      ->check(CLI::Range(1, 60))
      ->capture_default_str();
  app.add_option("--log-dir", o.log_dir,
                 "copy the processes' logs (and a SQLite ledger) here at the end");
  CLI11_PARSE(app, argc, argv);
  return sagapool::chaos::run_chaos(o);
}
