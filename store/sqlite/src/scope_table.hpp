// What a batch scope keeps in memory by string id (accounts, fresh
// transfers): entries in order of insertion, found through an
// open-addressing index. Cleared per batch but never freed, so a warm scope
// reuses its entries' strings and allocates nothing per transfer; the
// memory stays at the largest batch's. Entries stay where they are (a
// deque), so a reference survives later inserts, but never a clear(): the
// entry then belongs to the next id inserted.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace sagapool {

template <typename T>
class ScopeTable {
 public:
  struct Entry {
    std::string id;  // the index's key: written only by insert()
    T value;
  };

  T* find(std::string_view id) {
    if (size_ == 0) return nullptr;
    for (std::size_t h = hash(id) & mask();; h = (h + 1) & mask()) {
      const std::uint32_t e = index_[h];
      if (e == 0) return nullptr;
      if (entries_[e - 1].id == id) return &entries_[e - 1].value;
    }
  }

  // A new entry for an id not in the table; its value is reset by the
  // caller (it may hold the last batch's contents, kept for their capacity).
  T& insert(std::string_view id) {
    assert(find(id) == nullptr);
    if ((size_ + 1) * 2 > index_.size()) grow();
    if (size_ == entries_.size()) entries_.emplace_back();
    Entry& entry = entries_[size_];
    entry.id.assign(id);
    place(hash(entry.id), static_cast<std::uint32_t>(++size_));
    return entry.value;
  }

  void clear() {
    if (size_ == 0) return;
    std::fill(index_.begin(), index_.end(), 0);
    size_ = 0;
  }

  bool empty() const noexcept { return size_ == 0; }

  // The entries of this batch, in order of insertion.
  auto begin() { return entries_.begin(); }
  auto end() { return entries_.begin() + static_cast<std::ptrdiff_t>(size_); }

 private:
  static std::size_t hash(std::string_view id) { return std::hash<std::string_view>{}(id); }
  std::size_t mask() const noexcept { return index_.size() - 1; }

  void place(std::size_t h, std::uint32_t slot) {
    for (h &= mask(); index_[h] != 0; h = (h + 1) & mask()) {
    }
    index_[h] = slot;
  }

  void grow() {
    index_.assign(index_.empty() ? 1024 : index_.size() * 2, 0);
    for (std::size_t i = 0; i < size_; ++i) place(hash(entries_[i].id), static_cast<std::uint32_t>(i + 1));
  }

  std::deque<Entry> entries_;
  std::vector<std::uint32_t> index_;  // entry + 1; 0 = free; a power of two
  std::size_t size_ = 0;
};

}  // namespace sagapool
