// Rolling upgrades: `migrate --contract` (the second step of a schema
// change, once no older build runs) and `workers` (the worker registry).
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <vector>

#include "commands.hpp"
#include "sagapool/config.hpp"

namespace sagapool::ctl {
namespace {

struct MigrateArgs {
  bool contract = false;
  std::string gone_after = "90s";
};

int run_contract(Ledger& ledger, const MigrateArgs& args) {
  const std::optional<std::int64_t> gone_ms = parse_duration_ms(args.gone_after);
  if (!gone_ms || *gone_ms <= 0) {
    return fail(kExitUsage, "--unregistered-gone-after: expected a duration like 90s, got '" +
                                args.gone_after + "'");
  }
  std::vector<std::string> older;
  if (Status s = ledger.older_workers(*gone_ms, older); !s) return fail(s);
  if (!older.empty()) {
    std::cerr << "sagactl: refusing to contract the schema to version " << kSchemaVersion
              << " while older builds run; they would fail on it:\n";
    for (const std::string& w : older) std::cerr << "  " << w << '\n';
    std::cerr << "replace them with this build (or wait until they are gone), then run again\n";
    return kExitRefused;
  }
  if (Status s = ledger.contract(); !s) return fail(s);
  for (std::size_t i = 0; i < ledger.shard_count(); ++i) {
    std::cout << ledger.shard(i).display_name() << ": contracted to schema version "
              << kSchemaVersion << '\n';
  }
  return kExitOk;
}

int run_workers(Ledger& ledger) {
  std::int64_t now = 0;
  std::vector<WorkerRecord> workers;
  if (Status s = ledger.transfers().now_ms(now); !s) return fail(s);
  if (Status s = ledger.transfers().list_workers(workers); !s) return fail(s);
  for (const WorkerRecord& w : workers) {
    const std::int64_t silent = now - w.heartbeat_ms;
    std::cout << w.worker_id << "  build " << w.build_version << "  revision " << w.git_revision
              << "  schema " << w.schema_version << "  heartbeat " << format_duration_ms(silent)
              << " ago" << (worker_live(w, now) ? "" : " (gone)") << '\n';
  }
  return kExitOk;
}

}  // namespace

void add_migrate_commands(CLI::App& app, Action& action) {
  auto args = std::make_shared<MigrateArgs>();
  CLI::App* migrate = app.add_subcommand(
      "migrate", "finish a schema change: --contract removes what only older builds need and "
                 "raises the schema version they refuse (run once every worker runs this build)");
  migrate->add_flag("--contract", args->contract, "apply the contract step (required)")->required();
  migrate->add_option("--unregistered-gone-after", args->gone_after,
                      "workers built before the registry are seen by the leases they hold: one "
                      "whose lease ended longer ago than this is gone")
      ->type_name("DURATION")
      ->capture_default_str();
  migrate->callback([&action, args] {
    action = {true, [args](Ledger& ledger) { return run_contract(ledger, *args); }};
  });

  CLI::App* workers = app.add_subcommand(
      "workers", "list the worker registry: each worker's build, revision, schema version and "
                 "last heartbeat");
  workers->callback([&action] { action = {true, run_workers}; });
}

}  // namespace sagapool::ctl
