#pragma once
// The PostgreSQL schema (versioned migrations), its functions and the text of
// every statement the backend prepares: the files of store/postgres/sql/,
// embedded at build time. Private to the PostgreSQL backend.
#include <cstdint>
#include <span>
#include <string_view>

namespace sagapool::pg {

// Serialises concurrent `init_schema` calls on one database
// (pg_advisory_xact_lock key; "sagapool" in ASCII, truncated).
inline constexpr std::int64_t kSchemaLockKey = 0x73616761706f6f6c;

// Runs before the version is read: the table that records it.
extern const std::string_view kCreateMeta;

// migrations()[v - 1] takes a schema from version v - 1 to version v, in
// two steps run inside the init (or contract) transaction, after the
// advisory lock: `expand` by `sagactl init` (may be empty), `contract` (may be empty) by
// `sagactl migrate --contract`. A version whose expand step older builds
// cannot run beside (`one_step`) raises the floor at once.
struct Migration {
  std::string_view expand;
  std::string_view contract;
  bool one_step = false;
};
std::span<const Migration> migrations();

// The functions (CREATE OR REPLACE, same signatures across versions), run by
// every `init_schema` after the migrations, inside the same transaction.
std::string_view functions();

// Prepared statements: `-- name: saga_<enum name>` in sql/statements.sql.
// One list: the enum, its count and the statement names (pg_schema.cpp).
#define SAGA_PG_STATEMENTS(X)                                                               \
  X(now) X(read_meta) X(write_topology) X(insert_transfers) X(check_transfers)           \
  X(insert_fresh) X(transition) X(claim_expired)                                             \
  X(take_over) X(mark_notified) X(load_transfer) X(list_stale) X(state_stats)              \
  X(scan_transfer_states) X(apply_legs) X(settle) X(settle_apply) X(create_accounts)      \
  X(load_account) X(load_accounts) X(load_accounts_locked) X(set_locked)                   \
  X(postings_for_transfer) X(postings_for_account)                                           \
  X(pending_for_account) X(scan_accounts) X(scan_postings) X(scan_pending) X(register_worker)    \
  X(deregister_worker) X(list_workers) X(recent_owners) X(write_walk) X(walk_move) X(record_decision)   \
  X(decide) X(list_decisions) X(forget_decisions) X(list_prepared) X(prepared_stats)
#define SAGA_PG_ENUM(name) name,
enum class Sql : std::uint8_t { SAGA_PG_STATEMENTS(SAGA_PG_ENUM) };
#undef SAGA_PG_ENUM
#define SAGA_PG_ONE(name) +1
inline constexpr std::size_t kSqlCount = 0 SAGA_PG_STATEMENTS(SAGA_PG_ONE);
#undef SAGA_PG_ONE

struct Statement {
  const char* name;  // prepared statement name
  const char* text;
};
const Statement& statement(Sql s);

}  // namespace sagapool::pg
