#include "sagapool/account_cache.hpp"

namespace sagapool {

AccountCache::Probe AccountCache::probe(std::string_view id, std::size_t hash) const {
  const std::size_t mask = table_.size() - 1;
  for (std::size_t k = 0; k < kProbes; ++k) {
    const std::size_t slot = (hash + k) & mask;
    const std::string& there = table_[slot].account.id;
    if (there.empty()) return {slot, false};
    if (there == id) return {slot, true};
  }
  return {hash & mask, false};
}

const Account* AccountCache::find(std::string_view id, std::size_t hash) const {
  if (table_.empty()) return nullptr;
  const Probe p = probe(id, hash);
  return p.found && table_[p.slot].valid ? &table_[p.slot].account : nullptr;
}

Account& AccountCache::put(std::string_view id, std::size_t hash) {
  if (table_.empty()) table_.resize(slots_);
  const Probe p = probe(id, hash);
  Entry& e = table_[p.slot];
  if (!p.found) e.account.id.assign(id);  // assign: reuses the slot's buffer
  e.valid = true;
  return e.account;
}

void AccountCache::forget(std::string_view id, std::size_t hash) {
  if (table_.empty()) return;
  const Probe p = probe(id, hash);
  if (p.found) table_[p.slot].valid = false;
}

}  // namespace sagapool
