#include "sagapool/pg_store.hpp"

namespace sagapool {
// Placeholder until the PostgreSQL backend lands (issue 3).
Status open_pg_store(std::string_view, std::unique_ptr<Store>&) {
  return Status::fatal("the PostgreSQL backend is not built yet");
}
}  // namespace sagapool
