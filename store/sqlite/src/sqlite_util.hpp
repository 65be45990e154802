#pragma once
// RAII and small helpers for the SQLite C API, and the one place SQLite
// result codes map onto the error taxonomy.
#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>

#include "sagapool/named_sql.hpp"
#include "sagapool/status.hpp"

namespace sagapool {

struct SqliteCloser {
  void operator()(sqlite3* db) const noexcept { sqlite3_close_v2(db); }
};
using SqlitePtr = std::unique_ptr<sqlite3, SqliteCloser>;

struct StmtFinalizer {
  void operator()(sqlite3_stmt* st) const noexcept { sqlite3_finalize(st); }
};
using Stmt = std::unique_ptr<sqlite3_stmt, StmtFinalizer>;

inline Status map_sqlite_error(int rc, std::string message) {
  switch (rc & 0xFF) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return Status::retry_call(std::move(message));
    case SQLITE_IOERR:
    case SQLITE_FULL:
    case SQLITE_CANTOPEN:
    case SQLITE_PROTOCOL:
      return Status::retry_stage(std::move(message));
    default:
      return Status::fatal(std::move(message));
  }
}

// Not named bind(): ADL on Stmt* (a std::unique_ptr) would find std::bind.
inline void bind_arg(Stmt* st, int i, std::string_view v) {
  // An empty view may have a null data(): bind "" rather than NULL.
  sqlite3_bind_text(st->get(), i, v.data() ? v.data() : "", static_cast<int>(v.size()), SQLITE_STATIC);
}
inline void bind_arg(Stmt* st, int i, std::int64_t v) { sqlite3_bind_int64(st->get(), i, v); }

inline std::string_view column_view(sqlite3_stmt* st, int i) {
  const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(st, i));
  return p ? std::string_view(p, static_cast<std::size_t>(sqlite3_column_bytes(st, i)))
           : std::string_view();
}
inline std::string column_text(sqlite3_stmt* st, int i) { return std::string(column_view(st, i)); }

// Prepared statements by name (the store's statements file), each prepared
// once per connection. Looked up by the name, a short key, on every call.
class StatementCache {
 public:
  Status get(sqlite3* db, std::string_view name, const NamedSql& file, Stmt*& out) {
    auto it = cache_.find(name);
    if (it == cache_.end()) {
      const std::string& sql = file[name];
      sqlite3_stmt* raw = nullptr;
      const int rc = sqlite3_prepare_v3(db, sql.c_str(), static_cast<int>(sql.size()),
                                        SQLITE_PREPARE_PERSISTENT, &raw, nullptr);
      if (rc != SQLITE_OK) {
        return map_sqlite_error(rc, std::string("prepare: ") + sqlite3_errmsg(db));
      }
      it = cache_.emplace(std::string(name), Stmt(raw)).first;
    }
    out = &it->second;
    return Status::ok();
  }

 private:
  struct NameHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view v) const noexcept { return std::hash<std::string_view>{}(v); }
  };
  std::unordered_map<std::string, Stmt, NameHash, std::equal_to<>> cache_;
};

}  // namespace sagapool
