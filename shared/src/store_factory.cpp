#include "sagapool/pg_store.hpp"
#include "sagapool/sqlite_store.hpp"
#include "sagapool/store.hpp"

namespace sagapool {

Status open_store(std::string_view url, std::unique_ptr<Store>& out) {
  if (url.starts_with("sqlite:")) {
    std::string_view path = url.substr(7);
    if (path.starts_with("//")) path.remove_prefix(2);  // also accept sqlite://PATH
    if (path.empty()) return Status::fatal("store URL 'sqlite:' names no file");
    return open_sqlite_store(path, out);
  }
  if (url.starts_with("postgresql://") || url.starts_with("postgres://") ||
      url.find('=') != std::string_view::npos) {
    return open_pg_store(url, out);
  }
  return Status::fatal("unsupported store URL (expected sqlite:PATH or postgresql://...): " +
                       std::string(url.substr(0, url.find('@'))));
}

}  // namespace sagapool
