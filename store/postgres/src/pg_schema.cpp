#include "pg_schema.hpp"

#include <array>
#include <stdexcept>

#include "embedded_sql.hpp"
#include "sagapool/named_sql.hpp"
#include "sagapool/store.hpp"

namespace sagapool::pg {

const std::string_view kCreateMeta = embedded::sql_meta;

namespace {

// One entry per schema version, in order (sql/migrations/).
constexpr std::array<Migration, 9> kMigrations = {
    Migration{embedded::sql_migrations_0001_tables, {}, true},
    Migration{embedded::sql_migrations_0002_reservation, {}, true},
    Migration{embedded::sql_migrations_0003_worker_registry, embedded::sql_migrations_0003_contract,
              false},
    Migration{{}, {}, false},  // 4 changes the SQLite store only
    Migration{embedded::sql_migrations_0005_lean_writes, {}, false},
    Migration{embedded::sql_migrations_0006_outbox, {}, false},
    Migration{{}, {}, false},  // 7 changes the SQLite store only
    Migration{embedded::sql_migrations_0008_decisions, {}, false},
    Migration{embedded::sql_migrations_0009_batch_links, embedded::sql_migrations_0009_contract, false},
};
static_assert(kMigrations.size() == kSchemaVersion, "one migration per schema version");

// Prepared statements' names, in the order of Sql.
#define SAGA_PG_NAME(name) "saga_" #name,
constexpr std::array<const char*, kSqlCount> kStatementNames = {SAGA_PG_STATEMENTS(SAGA_PG_NAME)};
#undef SAGA_PG_NAME

// sql/statements.sql, in the order of Sql. A name the enum has and the file
// lacks, or the reverse, is a build mistake, reported on first use.
struct Statements {
  NamedSql file{embedded::sql_statements};
  std::array<Statement, kSqlCount> by_sql{};

  Statements() {
    if (file.size() != kSqlCount) throw std::logic_error("statements.sql: wrong number of statements");
    for (std::size_t i = 0; i < kSqlCount; ++i) {
      by_sql[i] = Statement{kStatementNames[i], file[kStatementNames[i]].c_str()};
    }
  }
};

const Statements& statements() {
  static const Statements all;
  return all;
}

}  // namespace

std::span<const Migration> migrations() { return kMigrations; }

std::string_view functions() { return embedded::sql_functions; }

const Statement& statement(Sql s) { return statements().by_sql[static_cast<std::size_t>(s)]; }

}  // namespace sagapool::pg
