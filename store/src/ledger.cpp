#include "sagapool/ledger.hpp"

#include <random>
#include <set>
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
    if (t->schema_expanded < kSchemaVersion) {
      return Status::fatal(store.display_name() + " has schema version " +
                           std::to_string(t->schema_expanded) + ", this program needs " +
                           std::to_string(kSchemaVersion) + "; run `sagactl init` to upgrade");
    }
    if (t->schema_version > kSchemaVersion) {
      return Status::fatal(store.display_name() + " was contracted to schema version " +
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
                        kSchemaVersion, kSchemaVersion};
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

Status Ledger::older_workers(std::int64_t unregistered_gone_after_ms,
                             std::vector<std::string>& out) {
  out.clear();
  Store& store = transfers();
  std::int64_t now = 0;
  if (Status s = store.now_ms(now); !s) return s;
  std::vector<WorkerRecord> workers;
  if (Status s = store.list_workers(workers); !s) return s;
  std::set<std::string, std::less<>> registered;
  for (const WorkerRecord& w : workers) {
    const std::int64_t silent_ms = now - w.heartbeat_ms;
    const bool live = worker_live(w, now);
    if (live) registered.insert(w.worker_id);
    if (!live || w.schema_version >= kSchemaVersion) continue;
    out.push_back("worker " + w.worker_id + " (build " + w.build_version + ", revision " +
                  w.git_revision + ", schema version " + std::to_string(w.schema_version) +
                  ", heartbeat " + std::to_string(silent_ms / 1000) + "s ago)");
  }
  // Builds from before the registry show only through recent_owners (the
  // leases they hold; on PostgreSQL, their recovery passes too). sagactl's
  // own claims are not a worker's.
  std::vector<std::string> owners;
  if (Status s = store.recent_owners(now - unregistered_gone_after_ms, owners); !s) return s;
  for (const std::string& owner : owners) {
    if (registered.contains(owner) || owner.starts_with("sagactl@")) continue;
    out.push_back("worker " + owner + " (not in the registry: a build of schema version 2 or "
                  "older; seen at work within the last " +
                  std::to_string(unregistered_gone_after_ms / 1000) + "s)");
  }
  return Status::ok();
}

Status Ledger::contract() {
  for (auto& store : stores_) {
    if (Status s = store->contract_schema(); !s) return s;
  }
  return verify_topology();
}

}  // namespace sagapool
