#include "sagapool/account_cache.hpp"

namespace sagapool {

const Account* AccountCache::find(std::string_view id, std::size_t hash) const {
  if (table_.empty()) return nullptr;
  const std::size_t mask = table_.size() - 1;
  for (std::size_t k = 0; k < kProbes; ++k) {
    const Entry& e = table_[(hash + k) & mask];
    if (!e.used) return nullptr;
    if (e.account.id == id) return e.valid ? &e.account : nullptr;
  }
  return nullptr;
}

// The slot holding id, else the first free one, else the first probed.
AccountCache::Entry* AccountCache::slot_of(std::string_view id, std::size_t hash) {
  if (table_.empty()) table_.resize(slots_);
  const std::size_t mask = table_.size() - 1;
  for (std::size_t k = 0; k < kProbes; ++k) {
    Entry& e = table_[(hash + k) & mask];
    if (!e.used || e.account.id == id) return &e;
  }
  return &table_[hash & mask];
}

Account& AccountCache::put(std::string_view id, std::size_t hash) {
  Entry* e = slot_of(id, hash);
  if (e->account.id != id) e->account.id.assign(id);  // assign: reuses the slot's buffer
  e->used = true;
  e->valid = true;
  return e->account;
}

void AccountCache::forget(std::string_view id, std::size_t hash) {
  if (table_.empty()) return;
  const std::size_t mask = table_.size() - 1;
  for (std::size_t k = 0; k < kProbes; ++k) {
    Entry& e = table_[(hash + k) & mask];
    if (!e.used) return;
    if (e.account.id == id) {
      e.valid = false;
      return;
    }
  }
}

}  // namespace sagapool
