// sagactl: set up, inspect and repair a sagapool ledger.
//
//   sagactl --store URL [--store URL ...] <command>
//
// Every command opens the stores, checks that they are the ledger `init`
// recorded (same number, same order), and then does one thing. Errors are
// one line on stderr and a non-zero exit code (see commands.hpp).
#include <CLI/CLI.hpp>
#include <exception>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "sagapool/config.hpp"
#include "sagapool/log.hpp"

namespace {

using namespace sagapool;

constexpr const char* kExitCodes =
    "Exit codes: 0 done; 1 failed (store error, audit violation, input rejected);\n"
    "2 usage or configuration (bad flag or argument, stores unusable or not the\n"
    "ledger `init` recorded); 3 refused in the transfer's state (migrate: while\n"
    "older workers run); 4 not found;\n"
    "5 (cancel) canceled by someone else, for their reason, not by this command.";

int run(int argc, char** argv) {
  CLI::App app("sagactl: set up, inspect and repair a sagapool ledger", "sagactl");
  app.fallthrough();  // `--store` may also follow the command
  app.require_subcommand(1);

  std::vector<std::string> stores;
  app.add_option("--store", stores,
                 "a store URL: sqlite:PATH or postgresql://...; repeat to shard, in the order "
                 "given at `init` (the first holds the transfer documents); SAGA_STORE takes "
                 "several, one a line")
      ->required()
      ->allow_extra_args(false)
      ->delimiter('\n')
      ->type_name("URL");

  ctl::Action action;
  ctl::add_init_and_audit_commands(app, action);
  ctl::add_account_commands(app, action);
  ctl::add_transfer_commands(app, action);
  ctl::add_migrate_commands(app, action);

  init_tool_logging("sagactl");
  finish_cli(app);
  app.footer(app.get_footer() + "\n" + kExitCodes);
  if (std::optional<int> code = parse_cli(app, argc, argv)) return *code;
  if (!action.run) return ctl::fail(ctl::kExitUsage, "no command given (see --help)");

  std::unique_ptr<Ledger> ledger;
  if (Status s = Ledger::open(stores, ledger); !s) return ctl::fail(ctl::kExitUsage, s.message());
  if (action.verify_topology) {
    if (Status s = ledger->verify_topology(); !s) return ctl::fail(ctl::kExitUsage, s.message());
  }
  return action.run(*ledger);
}

}  // namespace

int main(int argc, char** argv) {
  // Commands report expected failures as Status values; an exception here
  // is a start-up failure or a bug, reported as one line, never a trace.
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    return sagapool::ctl::fail(sagapool::ctl::kExitFailed, std::string("unexpected error: ") + e.what());
  }
}
