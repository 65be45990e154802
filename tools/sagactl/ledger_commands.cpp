// Whole-ledger commands: `init` (schema and topology) and `audit`.
#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <optional>
#include <vector>

#include "commands.hpp"
#include "sagapool/audit.hpp"
#include "sagapool/config.hpp"

namespace sagapool::ctl {
namespace {

std::string topology_text(const Topology& t) {
  return "shard " + std::to_string(t.shard_index + 1) + " of " + std::to_string(t.shard_count) +
         " of ledger " + t.ledger_id + ", schema version " + std::to_string(t.schema_expanded) +
         (t.schema_version < t.schema_expanded
              ? " (builds of version " + std::to_string(t.schema_version) +
                    " may still run on it: `sagactl migrate --contract` once they are gone)"
              : std::string());
}

int run_init(Ledger& ledger) {
  std::vector<std::optional<Topology>> before(ledger.shard_count());
  for (std::size_t i = 0; i < ledger.shard_count(); ++i) {
    if (Status s = ledger.shard(i).read_topology(before[i]); !s) return fail(s);
  }
  if (Status s = ledger.init(); !s) return fail(s);
  for (std::size_t i = 0; i < ledger.shard_count(); ++i) {
    Store& store = ledger.shard(i);
    std::optional<Topology> after;
    if (Status s = store.read_topology(after); !s) return fail(s);
    if (!after) return fail(kExitFailed, store.display_name() + ": no topology recorded after init");
    std::cout << store.display_name() << ": ";
    if (!before[i]) {
      std::cout << "created schema; recorded as " << topology_text(*after) << '\n';
    } else if (before[i]->schema_expanded != after->schema_expanded) {
      std::cout << "upgraded schema from version " << before[i]->schema_expanded << "; "
                << topology_text(*after) << '\n';
    } else {
      std::cout << "already initialised (" << topology_text(*after) << "); schema checked\n";
    }
  }
  std::cout << "ledger ready on " << ledger.shard_count() << " store(s)\n";
  return kExitOk;
}

struct AuditArgs {
  bool json = false;
  std::string stuck_after = "5m";
};

int run_audit_command(Ledger& ledger, const AuditArgs& args) {
  const std::optional<std::int64_t> stuck_ms = parse_duration_ms(args.stuck_after);
  if (!stuck_ms) {
    return fail(kExitUsage, "--stuck-after: expected a duration like 30s, 5m or 1h, got '" +
                                args.stuck_after + "'");
  }
  AuditOptions options;
  options.stuck_after_ms = *stuck_ms;
  AuditReport report;
  if (Status s = run_audit(ledger, options, report); !s) return fail(s);
  if (args.json) {
    std::cout << report.to_json() << '\n';
  } else {
    std::cout << report.to_text();
  }
  return report.ok() ? kExitOk : kExitFailed;
}

}  // namespace

void add_init_and_audit_commands(CLI::App& app, Action& action) {
  CLI::App* init = app.add_subcommand(
      "init", "create or upgrade the schema on every store and record the topology (idempotent)");
  init->callback([&action] { action = {false, run_init}; });

  auto args = std::make_shared<AuditArgs>();
  CLI::App* audit = app.add_subcommand(
      "audit", "check every ledger invariant (DESIGN.md); exit 0 only if all hold");
  audit->add_flag("--json", args->json, "print the report as one JSON object");
  audit->add_option("--stuck-after", args->stuck_after,
                    "a non-terminal transfer untouched for longer fails invariant 6")
      ->type_name("DURATION")
      ->capture_default_str();
  audit->callback([&action, args] {
    action = {true, [args](Ledger& ledger) { return run_audit_command(ledger, *args); }};
  });
}

}  // namespace sagapool::ctl
