#pragma once
// The set of stores one process works with: the first holds the transfer
// documents, and accounts (with their postings) are placed by
// `shard_of(account_id, n)`.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sagapool/store.hpp"

namespace sagapool {

// The placement function. Changing it, or the number of stores, moves
// accounts and therefore needs a migration. FNV-1a 64 over the id's bytes,
// modulo the number of stores.
std::uint64_t fnv1a64(std::string_view bytes) noexcept;
inline std::size_t shard_of(std::string_view account_id, std::size_t shard_count) noexcept {
  return static_cast<std::size_t>(fnv1a64(account_id) % shard_count);
}

class Ledger {
 public:
  // Opens every URL. Does not check the topology (see verify_topology).
  static Status open(const std::vector<std::string>& urls, std::unique_ptr<Ledger>& out);
  // Wraps stores that are already open, in shard order (the first holds the
  // transfers): for tests that build their own Store objects, such as the
  // deterministic simulation. `stores` must not be empty. Does not check the
  // topology.
  static std::unique_ptr<Ledger> from_stores(std::vector<std::unique_ptr<Store>> stores);

  // Fails with a clear message unless every store was initialised by
  // `sagactl init` for exactly this list of stores in this order.
  Status verify_topology();
  // Creates every schema or applies its expand steps (which old builds run
  // beside), and records the topology; refuses to re-shard an initialised
  // ledger.
  Status init();
  // The live workers that need what the contract removes, one line each:
  // registered workers of an older schema version whose heartbeat is
  // recent (kWorkerGoneLeases of their lease), and owners of transfers
  // leased within `unregistered_gone_after_ms` that are not registered
  // (builds from before the registry). Empty: contract() may run.
  Status older_workers(std::int64_t unregistered_gone_after_ms, std::vector<std::string>& out);
  // Applies every store's contract steps and raises its floor to this
  // build's version: older builds refuse to start on it afterwards. Check
  // older_workers() first.
  Status contract();

  Store& transfers() noexcept { return *stores_.front(); }
  std::size_t shard_count() const noexcept { return stores_.size(); }
  std::size_t shard_index(std::string_view account_id) const noexcept {
    return shard_of(account_id, stores_.size());
  }
  Store& shard(std::size_t i) noexcept { return *stores_[i]; }
  Store& shard_for(std::string_view account_id) noexcept {
    return *stores_[shard_index(account_id)];
  }

 private:
  std::vector<std::unique_ptr<Store>> stores_;
};

}  // namespace sagapool
