// The outbox rows (sql/schema.sql, schema version 7) this connection wrote
// and that still list ids: which row lists a delivered id, found without
// reading the table, and what the row lists once delivered ids leave it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sagapool/status.hpp"

namespace sagapool {

class OwnOutbox {
 public:
  struct Row {
    struct Entry {
      std::uint32_t at = 0, size = 0;  // in ids
      bool canceled = false;
      bool delivered = false;
    };
    std::int64_t seq = 0;
    std::string ids;              // back to back
    std::vector<Entry> entries;   // sorted by id
    std::size_t left = 0;         // not delivered; 0 once the table no longer lists any
    bool touched = false;
    bool committed = false;

    std::string_view id(const Entry& e) const { return std::string_view(ids).substr(e.at, e.size); }
  };

  // Rows past this are forgotten, oldest first. Their ids then take the
  // per-row path, which finds them flagged and leaves them listed until the
  // row's lease ends and recovery publishes them again: at least once, as
  // after a failed mark.
  static constexpr std::size_t kMaxRows = 64;

  // A row the current transaction wrote; kept if it commits.
  void add_uncommitted(std::int64_t seq, std::span<const std::string_view> done,
                       std::span<const std::string_view> canceled) {
    Row& row = rows_.emplace_back();
    row.seq = seq;
    row.entries.reserve(done.size() + canceled.size());
    for (const bool is_canceled : {false, true}) {
      for (std::string_view id : is_canceled ? canceled : done) {
        row.entries.push_back({static_cast<std::uint32_t>(row.ids.size()),
                               static_cast<std::uint32_t>(id.size()), is_canceled, false});
        row.ids.append(id);
      }
    }
    std::sort(row.entries.begin(), row.entries.end(),
              [&row](const Row::Entry& a, const Row::Entry& b) { return row.id(a) < row.id(b); });
    row.left = row.entries.size();
  }
  void commit() {
    for (Row& row : rows_) row.committed = true;
    while (rows_.size() > kMaxRows) rows_.pop_front();
  }
  void rollback() {
    std::erase_if(rows_, [](const Row& r) { return !r.committed; });
  }

  // Marks `id` delivered in the row that lists it; false if none does.
  bool deliver(std::string_view id) {
    for (auto row = rows_.rbegin(); row != rows_.rend(); ++row) {
      const auto it = std::lower_bound(
          row->entries.begin(), row->entries.end(), id,
          [&row](const Row::Entry& e, std::string_view v) { return row->id(e) < v; });
      if (it == row->entries.end() || row->id(*it) != id) continue;
      if (!it->delivered) {
        it->delivered = true;
        --row->left;
        row->touched = true;
      }
      return true;
    }
    return false;
  }

  // `write(row)` for each row deliver() touched since the last call: it
  // writes what the row lists now, or deletes it, and sets `left` to 0 if
  // the table no longer has it. Rows left with nothing are then forgotten.
  template <typename Write>
  Status write_touched(Write&& write) {
    for (Row& row : rows_) {
      if (!row.touched) continue;
      row.touched = false;
      if (Status s = write(row); !s) return s;
    }
    std::erase_if(rows_, [](const Row& r) { return r.left == 0; });
    return Status::ok();
  }

 private:
  std::deque<Row> rows_;  // oldest first; the current transaction's last
};

}  // namespace sagapool
