#pragma once
#include <memory>
#include <string_view>

#include "sagapool/store.hpp"

namespace sagapool {
// `path` is a file name (created if missing). WAL mode, synchronous=FULL.
Status open_sqlite_store(std::string_view path, std::unique_ptr<Store>& out);
}  // namespace sagapool
