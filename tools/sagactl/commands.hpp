#pragma once
// sagactl: the operator's tool (DESIGN.md, "Programs and their flags").
// Each command is registered on the CLI by its own file and, once parsed,
// leaves an Action behind that main() runs against the opened ledger.
//
// Exit codes (also in --help):
//   0 done; 1 failed (store error, audit found a violation, input rejected);
//   2 usage or configuration (bad flag or argument, unusable or mismatched
//   stores); 3 refused in the transfer's state (migrate: while older
//   workers run); 4 no such transfer/account.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "sagapool/ledger.hpp"
#include "sagapool/status.hpp"

namespace CLI {
class App;
}

namespace sagapool::ctl {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitRefused = 3;
inline constexpr int kExitNotFound = 4;
inline constexpr int kExitPreempted = 5;  // cancel: someone else canceled it, for their reason

// What the parsed command line asks for.
struct Action {
  bool verify_topology = true;  // every command but `init`
  std::function<int(Ledger&)> run;
};

void add_init_and_audit_commands(CLI::App& app, Action& action);
void add_account_commands(CLI::App& app, Action& action);
void add_transfer_commands(CLI::App& app, Action& action);
void add_migrate_commands(CLI::App& app, Action& action);

// The import itself lives apart from the other account commands.
int import_accounts(Ledger& ledger, const std::string& file);

// ---- helpers shared by the commands (common.cpp) ---------------------------

// Prints "sagactl: <message>" on stderr and returns `code`.
int fail(int code, std::string_view message);
// A store error: its message, exit 1.
int fail(const Status& s);

// Base-10 integer, optional '-', no '+', no leading zeros, no spaces.
bool parse_int64(std::string_view text, std::int64_t& out);
// Empty (any currency) or exactly three upper-case ASCII letters.
bool is_valid_currency(std::string_view text) noexcept;

// "2024-05-01T12:00:00.123Z"; "-" for 0.
std::string format_time_ms(std::int64_t ms);
// "850ms", "42s", "3m05s", "2h01m", "3d04h".
std::string format_duration_ms(std::int64_t ms);
// "store 1 of 2 (sqlite:a.db)".
std::string describe_shard(Ledger& ledger, std::size_t index);

// `PARENT show ID [--json]`: what the account and transfer commands share.
// `show(ledger, id, json)` runs once the line is parsed.
void add_show_command(CLI::App& parent, Action& action, const std::string& description,
                      const std::string& what, std::function<int(Ledger&, const std::string&, bool)> show);

// "sagactl@<hostname>": the owner recorded on transfers an operator takes over.
std::string operator_id();

}  // namespace sagapool::ctl
