#include "sagapool/ledger.hpp"

#include <random>
#include <stdexcept>

namespace sagapool {
namespace {

std::string new_ledger_id() {
  std::random_device rd;
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id;
  for (int i = 0; i < 16; ++i) id += kHex[rd() % 16];
  return id;
}

std::string describe(const Topology& t) {
  return "shard " + std::to_string(t.shard_index + 1) + " of " + std::to_string(t.shard_count) +
         " of ledger " + t.ledger_id;
}

}  // namespace

std::uint64_t fnv1a64(std::string_view bytes) noexcept {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h;
}

Status Ledger::open(const std::vector<std::string>& urls, std::unique_ptr<Ledger>& out) {
  if (urls.empty()) return Status::fatal("no --store given");
  auto ledger = std::unique_ptr<Ledger>(new Ledger());
  for (const std::string& url : urls) {
    std::unique_ptr<Store> store;
    if (Status s = open_store(url, store); !s) return s;
    ledger->stores_.push_back(std::move(store));
  }
  out = std::move(ledger);
  return Status::ok();
}

std::unique_ptr<Ledger> Ledger::from_stores(std::vector<std::unique_ptr<Store>> stores) {
  if (stores.empty()) throw std::invalid_argument("Ledger::from_stores: no stores given");
  auto ledger = std::unique_ptr<Ledger>(new Ledger());
  ledger->stores_ = std::move(stores);
  return ledger;
}

Status Ledger::verify_topology() {
  std::string ledger_id;
  for (std::size_t i = 0; i < stores_.size(); ++i) {
    Store& store = *stores_[i];
    std::optional<Topology> t;
    if (Status s = store.read_topology(t); !s) return s;
    if (!t) {
      return Status::fatal(store.display_name() +
                           " is not initialised; run `sagactl init` with the same --store list");
    }
    if (t->schema_version < kSchemaVersion) {
      return Status::fatal(store.display_name() + " has schema version " +
                           std::to_string(t->schema_version) + ", this program needs " +
                           std::to_string(kSchemaVersion) + "; run `sagactl init` to upgrade");
    }
    if (t->schema_version > kSchemaVersion) {
      return Status::fatal(store.display_name() + " has schema version " +
                           std::to_string(t->schema_version) +
                           ", newer than this program knows (" + std::to_string(kSchemaVersion) +
                           "); upgrade the program");
    }
    if (i == 0) ledger_id = t->ledger_id;
    if (t->shard_count != static_cast<int>(stores_.size()) ||
        t->shard_index != static_cast<int>(i) || t->ledger_id != ledger_id) {
      return Status::fatal("store #" + std::to_string(i + 1) + " (" + store.display_name() +
                           ") is " + describe(*t) + ", but it was given as store " +
                           std::to_string(i + 1) + " of " + std::to_string(stores_.size()) +
                           "; pass the stores in the order and number used at `sagactl init`");
    }
  }
  return Status::ok();
}

Status Ledger::init() {
  std::string ledger_id;
  for (std::size_t i = 0; i < stores_.size(); ++i) {
    Store& store = *stores_[i];
    if (Status s = store.init_schema(); !s) return s;
    std::optional<Topology> t;
    if (Status s = store.read_topology(t); !s) return s;
    if (i == 0) ledger_id = t ? t->ledger_id : new_ledger_id();
    const Topology want{ledger_id, static_cast<int>(i), static_cast<int>(stores_.size()),
                        kSchemaVersion};
    if (t && (t->ledger_id != want.ledger_id || t->shard_index != want.shard_index ||
              t->shard_count != want.shard_count)) {
      return Status::fatal(store.display_name() + " is already " + describe(*t) +
                           "; refusing to make it " + describe(want) +
                           " (re-sharding needs a migration)");
    }
    if (!t) {
      if (Status s = store.write_topology(want); !s) return s;
    }
  }
  return verify_topology();
}

}  // namespace sagapool
