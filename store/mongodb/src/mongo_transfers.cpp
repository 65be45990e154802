// Transfer changes on the MongoDB store: transitions, claims and take-overs
// are versioned changes logged under (transfer, version) before the transfer
// document is moved to them (mongo_store.hpp). The log's unique key decides
// between concurrent writers; the fencing fields decide whether a change is
// allowed at all, checked against the version it is logged on top of.
#include <algorithm>
#include <set>
#include <unordered_map>

#include "mongo_store.hpp"

namespace sagapool::mongo {

namespace {

// Reads and writes again before a call gives up for now (retry_call): only
// reached when other writers keep changing the same transfers.
constexpr int kMaxRounds = 100;

std::string log_key(std::string_view id, std::int64_t v) { return change_key(id, v); }

// The fields a change may set, from the transfer's new values.
void mutable_fields(Builder& b, const TransferDoc& d) {
  b.str("state", to_string(d.state)).str("reason", to_string(d.reason)).str("owner", d.owner);
  b.i64("epoch", d.epoch).i64("lease", d.lease_until_ms).i64("modified", d.last_modified_ms);
  b.i64("finished", d.finished_at_ms).boolean("notified", d.notified).i64("attempts", d.attempts);
}

// The update that moves a transfer document to a logged change.
void apply_update(Doc& update, const View& change) {
  const bool open = !is_terminal(parse_transfer_state(change.str("state")).value_or(TransferState::initial)) ||
                    !change.boolean("notified");
  update.sub("$set", [&](Builder& b) {
    for (const char* k : {"state", "reason", "owner"}) b.str(k, change.str(k));
    for (const char* k : {"epoch", "lease", "modified", "finished", "attempts", "v"}) b.i64(k, change.i64(k));
    b.boolean("notified", change.boolean("notified"));
    if (open) b.i64("due", change.i64("lease"));
  });
  if (!open) update.sub("$unset", [](Builder& b) { b.str("due", ""); });
}

}  // namespace

Status MongoStore::read_versioned(std::span<const std::string> ids, std::map<std::string, Versioned, std::less<>>& out) {
  Status bad;
  if (Status s = find_ids(*client_, kTransfers, ids, nullptr,
                          [&](const View& v) {
                            Versioned t;
                            if (Status e = read_transfer(display_name(), v, t.doc); !e) bad = e;
                            t.v = v.i64("v");
                            out[t.doc.id] = std::move(t);
                          },
                          "reading transfers");
      !s) {
    return s;
  }
  return bad;
}

Status MongoStore::commit_transfer_changes(std::span<const Versioned* const> changes, std::vector<std::uint8_t>& won) {
  won.assign(changes.size(), 0);
  std::vector<Doc> logged(changes.size());
  for (std::size_t i = 0; i < changes.size(); ++i) {
    const Versioned& c = *changes[i];
    logged[i].str("_id", log_key(c.doc.id, c.v)).str("t", c.doc.id).i64("v", c.v);
    mutable_fields(logged[i], c.doc);
  }
  for (std::size_t from = 0; from < changes.size(); from += kChunk) {
    const std::size_t end = std::min(changes.size(), from + kChunk);
    BulkResult r;
    if (Status s = client_->bulk(
            kTransferLog, false,
            [&](Client::Bulk& bulk) {
              for (std::size_t i = from; i < end; ++i) bulk.insert(logged[i].bson());
            },
            r, "logging transfer changes");
        !s) {
      return s;
    }
    std::fill(won.begin() + static_cast<std::ptrdiff_t>(from), won.begin() + static_cast<std::ptrdiff_t>(end), 1);
    for (const WriteError& e : r.errors) {
      if (e.code != kDuplicateKey) return Status::fatal(display_name() + ": logging transfer changes: " + e.message);
      won[from + e.index] = 0;
    }
    r = {};
    if (Status s = client_->bulk(
            kTransfers, false,
            [&](Client::Bulk& bulk) {
              for (std::size_t i = from; i < end; ++i) {
                if (won[i] == 0) continue;
                Doc filter;  // by _id alone: the change holds every field that changes
                filter.str("_id", changes[i]->doc.id);
                Doc update;
                apply_update(update, View(logged[i].bson()));
                bulk.update_one(filter.bson(), update.bson());
              }
            },
            r, "applying transfer changes");
        !s) {
      return s;
    }
    if (!r.errors.empty()) return Status::fatal(display_name() + ": applying transfer changes: " + r.errors[0].message);
  }
  return Status::ok();
}

Status MongoStore::settle_transfer(std::string_view id, std::int64_t v) {
  Doc filter;
  filter.str("t", id).sub("v", [&](Builder& c) { c.i64("$gt", v); });
  Doc opts;
  opts.sub("sort", [](Builder& s) { s.i64("t", 1).i64("v", -1); });
  Doc last;
  bool found = false;
  if (Status s = client_->find(kTransferLog, filter.bson(), opts.bson(),
                               [&](const View& c) {
                                 if (found) return;  // the newest only; no "limit": see Client::find
                                 bson_concat(last.bson(), c.get());
                                 found = true;
                               },
                               "reading a transfer's last change");
      !s) {
    return s;
  }
  if (!found) return Status::ok();
  Doc by_id;
  by_id.str("_id", id);
  Doc update;
  apply_update(update, View(last.bson()));  // every changing field: the last change is enough
  return client_->update_many(kTransfers, by_id.bson(), update.bson(), nullptr, "applying a transfer's change");
}

Status MongoStore::settle_all_transfers() {
  std::unordered_map<std::string, std::int64_t> versions;
  Doc all;
  Doc opts;
  opts.sub("projection", [](Builder& p) { p.i64("v", 1); });
  if (Status s = client_->find(kTransfers, all.bson(), opts.bson(),
                               [&](const View& v) { versions.emplace(std::string(v.str("_id")), v.i64("v")); },
                               "reading transfer versions");
      !s) {
    return s;
  }
  Doc projection;
  projection.sub("projection", [](Builder& p) { p.i64("t", 1).i64("v", 1); });
  std::set<std::string> behind;
  if (Status s = client_->find(kTransferLog, all.bson(), projection.bson(),
                               [&](const View& v) {
                                 const auto it = versions.find(std::string(v.str("t")));
                                 if (it != versions.end() && v.i64("v") > it->second) behind.insert(it->first);
                               },
                               "finding unapplied transfer changes");
      !s) {
    return s;
  }
  for (const std::string& id : behind) {
    if (Status s = settle_transfer(id, versions[id]); !s) return s;
  }
  return Status::ok();
}

// One round per repetition of an id in the batch, so that a batch gives what
// its records give one by one: within a round the ids are distinct and their
// order does not matter.
Status MongoStore::transition(std::span<const Transition> batch, std::int64_t lease_ms,
                              std::span<std::uint8_t> applied, std::int64_t* at_ms) {
  std::int64_t now = 0;
  if (Status s = client_->server_now(now); !s) return s;
  if (at_ms != nullptr) *at_ms = now;
  std::fill(applied.begin(), applied.end(), 0);
  std::unordered_map<std::string_view, int> seen;
  std::vector<std::vector<std::size_t>> rounds;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const int round = seen[batch[i].id]++;
    if (rounds.size() <= static_cast<std::size_t>(round)) rounds.emplace_back();
    rounds[static_cast<std::size_t>(round)].push_back(i);
  }
  for (std::vector<std::size_t> open : rounds) {
    for (int attempt = 0; !open.empty(); ++attempt) {
      if (attempt == kMaxRounds) {
        return Status::retry_call(display_name() + ": transitions kept meeting other writers' changes");
      }
      std::vector<std::string> ids;
      for (std::size_t i : open) ids.emplace_back(batch[i].id);
      std::map<std::string, Versioned, std::less<>> docs;
      if (Status s = read_versioned(ids, docs); !s) return s;
      std::vector<Versioned> next;
      next.reserve(open.size());
      std::vector<std::size_t> next_record;
      std::vector<std::size_t> refused;  // the filter failed on what was read
      for (std::size_t i : open) {
        const Transition& t = batch[i];
        const auto it = docs.find(t.id);
        if (it == docs.end()) continue;  // no such transfer
        const TransferDoc& d = it->second.doc;
        if (d.state != t.from || d.owner != t.owner || d.epoch != t.epoch) {
          refused.push_back(i);
          continue;
        }
        Versioned n{d, it->second.v + 1};
        n.doc.state = t.to;
        n.doc.reason = t.reason;
        n.doc.last_modified_ms = now;
        n.doc.lease_until_ms = now + lease_ms;
        if (is_terminal(t.to)) {
          n.doc.finished_at_ms = now;
          n.doc.notified = false;
        }
        next.push_back(std::move(n));
        next_record.push_back(i);
      }
      std::vector<std::size_t> again;
      // A refusal stands unless the document was behind its log (a stale
      // writer's copy): then it is settled and the record looked at again.
      if (!refused.empty()) {
        std::unordered_map<std::string, std::size_t> by_key;
        for (std::size_t i : refused) by_key.emplace(log_key(batch[i].id, docs.find(batch[i].id)->second.v + 1), i);
        std::vector<std::string_view> keys;
        for (const auto& entry : by_key) keys.push_back(entry.first);
        Doc opts;
        opts.sub("projection", [](Builder& p) { p.i64("_id", 1); });
        std::vector<std::size_t> behind;
        if (Status s = find_ids(*client_, kTransferLog, std::span<const std::string_view>(keys), opts.bson(),
                                [&](const View& v) { behind.push_back(by_key.at(std::string(v.str("_id")))); },
                                "checking transfers for unapplied changes");
            !s) {
          return s;
        }
        for (std::size_t i : behind) {
          if (Status s = settle_transfer(batch[i].id, docs.find(batch[i].id)->second.v); !s) return s;
          again.push_back(i);
        }
      }
      std::vector<const Versioned*> changes;
      for (const Versioned& n : next) changes.push_back(&n);
      std::vector<std::uint8_t> won;
      if (Status s = commit_transfer_changes(changes, won); !s) return s;
      for (std::size_t j = 0; j < next.size(); ++j) {
        if (won[j] != 0) {
          applied[next_record[j]] = 1;
          continue;
        }
        if (Status s = settle_transfer(next[j].doc.id, next[j].v - 1); !s) return s;
        again.push_back(next_record[j]);
      }
      open = std::move(again);
    }
  }
  return Status::ok();
}

Status MongoStore::claim_expired(std::string_view owner, std::int64_t lease_ms, std::size_t limit,
                                 std::vector<TransferDoc>& out) {
  out.clear();
  if (limit == 0) return Status::ok();
  for (int attempt = 0; attempt < kMaxRounds; ++attempt) {
    std::int64_t now = 0;
    if (Status s = client_->server_now(now); !s) return s;
    std::vector<Versioned> due;
    Doc filter;
    filter.sub("due", [&](Builder& c) { c.i64("$lt", now); });
    Doc opts;
    opts.sub("sort", [](Builder& s) { s.i64("due", 1).i64("_id", 1); });
    Status bad;
    if (Status s = client_->find(kTransfers, filter.bson(), opts.bson(),
                                 [&](const View& v) {
                                   if (due.size() == limit) return;  // no "limit": see Client::find
                                   Versioned t;
                                   if (Status e = read_transfer(display_name(), v, t.doc); !e) bad = e;
                                   t.v = v.i64("v") + 1;
                                   due.push_back(std::move(t));
                                 },
                                 "finding expired leases");
        !s) {
      return s;
    }
    if (!bad) return bad;
    if (due.empty()) return Status::ok();
    std::vector<const Versioned*> changes;
    for (Versioned& t : due) {
      t.doc.owner.assign(owner);
      ++t.doc.epoch;
      ++t.doc.attempts;
      t.doc.lease_until_ms = now + lease_ms;
      changes.push_back(&t);
    }
    std::vector<std::uint8_t> won;
    if (Status s = commit_transfer_changes(changes, won); !s) return s;
    for (std::size_t i = 0; i < due.size(); ++i) {
      if (won[i] != 0) {
        out.push_back(std::move(due[i].doc));
      } else if (Status s = settle_transfer(due[i].doc.id, due[i].v - 1); !s) {
        return s;
      }
    }
    if (!out.empty()) return Status::ok();
    // Every one was claimed by others first, or was a stale copy: look again.
  }
  return Status::ok();
}

Status MongoStore::take_over(std::string_view id, std::string_view owner, std::int64_t lease_ms,
                             std::optional<TransferDoc>& out) {
  out.reset();
  const std::string key(id);
  for (int attempt = 0; attempt < kMaxRounds; ++attempt) {
    std::int64_t now = 0;
    if (Status s = client_->server_now(now); !s) return s;
    std::map<std::string, Versioned, std::less<>> docs;
    if (Status s = read_versioned(std::span(&key, 1), docs); !s) return s;
    const auto it = docs.find(key);
    if (it == docs.end()) return Status::ok();
    Versioned t = std::move(it->second);
    if (is_terminal(t.doc.state)) {
      // Finished: returned as it is, unless the copy read was stale.
      if (Status s = settle_transfer(key, t.v); !s) return s;
      docs.clear();
      if (Status s = read_versioned(std::span(&key, 1), docs); !s) return s;
      if (docs.count(key) != 0 && is_terminal(docs.at(key).doc.state)) {
        out = std::move(docs.at(key).doc);
        return Status::ok();
      }
      continue;
    }
    ++t.v;
    t.doc.owner.assign(owner);
    ++t.doc.epoch;
    ++t.doc.attempts;
    t.doc.lease_until_ms = now + lease_ms;
    const Versioned* change = &t;
    std::vector<std::uint8_t> won;
    if (Status s = commit_transfer_changes(std::span(&change, 1), won); !s) return s;
    if (won[0] != 0) {
      out = std::move(t.doc);
      return Status::ok();
    }
    if (Status s = settle_transfer(key, t.v - 1); !s) return s;
  }
  return Status::retry_call(display_name() + ": transfer " + key + " kept changing while being taken over");
}

}  // namespace sagapool::mongo
