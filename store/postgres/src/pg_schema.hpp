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

// migrations()[v - 1] upgrades a schema at version v - 1 to version v. Each
// is run inside the init transaction, after the advisory lock.
std::span<const std::string_view> migrations();

// The functions (CREATE OR REPLACE, same signatures across versions), run by
// every `init_schema` after the migrations, inside the same transaction.
std::string_view functions();

// Prepared statements, by name. The SQL names tables unqualified so that a
// URL's search_path (options=-csearch_path=...) picks the schema.
enum class Sql : std::uint8_t {
  now,
  read_meta,
  write_topology,
  insert_transfers,
  transition,
  claim_expired,
  take_over,
  mark_notified,
  load_transfer,
  list_stale,
  state_stats,
  scan_transfer_states,
  apply_legs,
  create_accounts,
  load_account,
  load_accounts,
  load_accounts_locked,
  set_locked,
  postings_for_transfer,
  postings_for_account,
  pending_for_account,
  scan_accounts,
  scan_postings,
  scan_pending,
};
inline constexpr std::size_t kSqlCount = 24;

struct Statement {
  const char* name;  // prepared statement name
  const char* text;
};
const Statement& statement(Sql s);

}  // namespace sagapool::pg
