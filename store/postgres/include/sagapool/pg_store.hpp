#pragma once
#include <memory>
#include <string_view>

#include "sagapool/store.hpp"

namespace sagapool {
// `url` is a libpq URI (postgresql://...) or a conninfo string (host=...).
Status open_pg_store(std::string_view url, std::unique_ptr<Store>& out);
}  // namespace sagapool
