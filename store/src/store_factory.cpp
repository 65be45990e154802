#include "sagapool/mongo_store.hpp"
#include "sagapool/pg_store.hpp"
#include "sagapool/sqlite_store.hpp"
#include "sagapool/store.hpp"

#include <algorithm>
#include <cctype>

namespace sagapool {

Status open_store(std::string_view url, std::unique_ptr<Store>& out) {
  if (url.starts_with("sqlite:")) {
    std::string_view path = url.substr(7);
    if (path.starts_with("//")) path.remove_prefix(2);  // also accept sqlite://PATH
    if (path.empty()) return Status::fatal("store URL 'sqlite:' names no file");
    return open_sqlite_store(path, out);
  }
  if (url.starts_with("mongodb://") || url.starts_with("mongodb+srv://")) return open_mongo_store(url, out);
  if (url.starts_with("postgresql://") || url.starts_with("postgres://") ||
      url.find('=') != std::string_view::npos) {
    return open_pg_store(url, out);
  }
  // Only the scheme is shown: the rest may carry a password ("mysql://u:pw@h").
  const std::string_view head = url.substr(0, url.find(':'));
  const bool is_scheme = head.size() < url.size() && !head.empty() && head.size() <= 16 &&
                         std::all_of(head.begin(), head.end(), [](unsigned char c) {
                           return std::isalnum(c) != 0 || c == '+' || c == '-' || c == '.';
                         });
  const std::string scheme = is_scheme ? "'" + std::string(head) + ":'" : "(none)";
  return Status::fatal("unsupported store URL scheme " + scheme +
                       " (expected sqlite:PATH, postgresql://... or mongodb://...; the URL is not repeated here "
                       "because it may hold a password)");
}

}  // namespace sagapool
