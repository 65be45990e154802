#pragma once
#include <memory>
#include <string_view>

#include "sagapool/store.hpp"

namespace sagapool {
// `url` is a mongodb:// URI naming the database (mongodb://HOST[:PORT]/DB,
// with the driver's options: w=majority&journal=true for production).
Status open_mongo_store(std::string_view url, std::unique_ptr<Store>& out);
}  // namespace sagapool
