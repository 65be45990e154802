// The MongoDB store's transfers, schema, registry and reads; the legs and
// the account journal are in mongo_legs.cpp.
#include "mongo_store.hpp"

#include <algorithm>
#include <cstdio>
#include <set>
#include <unordered_map>

#include "sagapool/mongo_store.hpp"

namespace sagapool {
namespace mongo {

namespace {


constexpr TransferState kTerminal[] = {TransferState::done, TransferState::canceled};

void terminal_states(Builder& b) {
  for (const TransferState s : kTerminal) b.push_str(to_string(s));
}

Status bad_document(const std::string& store, std::string_view what, std::string_view id) {
  return Status::fatal(store + ": transfer " + std::string(id) + " holds an unknown " + std::string(what));
}

}  // namespace

Status read_transfer(const std::string& store, const View& v, TransferDoc& d) {
  d.id.assign(v.str("_id"));
  d.source.assign(v.str("from"));
  d.destination.assign(v.str("to"));
  d.amount = v.i64("amount");
  d.currency.assign(v.str("currency"));
  d.metadata.assign(v.str("metadata"));
  d.payload_hash = static_cast<std::uint64_t>(v.i64("hash"));
  const std::optional<TransferState> state = parse_transfer_state(v.str("state"));
  if (!state) return bad_document(store, "state", d.id);
  d.state = *state;
  const std::optional<Reason> reason = parse_reason(v.str("reason"));
  if (!reason) return bad_document(store, "reason", d.id);
  d.reason = *reason;
  d.owner.assign(v.str("owner"));
  d.epoch = v.i64("epoch");
  d.lease_until_ms = v.i64("lease");
  d.created_at_ms = v.i64("created");
  d.last_modified_ms = v.i64("modified");
  d.requested_at_ms = v.i64("requested");
  d.finished_at_ms = v.i64("finished");
  d.attempts = static_cast<std::int32_t>(v.i64("attempts"));
  d.notified = v.boolean("notified");
  d.origin.topic.assign(v.str("topic"));
  d.origin.partition = static_cast<std::int32_t>(v.i64("partition"));
  d.origin.offset = v.i64("offset");
  return Status::ok();
}

namespace {


}  // namespace

void read_account(const View& v, Account& a) {
  a.id.assign(v.str("_id"));
  a.balance = v.i64("balance");
  a.opening_balance = v.i64("opening");
  a.min_balance = v.i64("min");
  a.currency.assign(v.str("currency"));
  a.locked = v.boolean("locked");
  a.reserved = v.i64("reserved");
}

std::string pending_key(std::string_view transfer_id) {
  std::string out;
  out.reserve(transfer_id.size());
  for (const char c : transfer_id) {
    if (c == '%' || c == '.' || c == '$' || c == '\0') {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", static_cast<unsigned char>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out;
}

std::string pending_id(std::string_view key) {
  std::string out;
  out.reserve(key.size());
  for (std::size_t i = 0; i < key.size(); ++i) {
    if (key[i] == '%' && i + 2 < key.size()) {
      out += static_cast<char>(std::stoi(std::string(key.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += key[i];
    }
  }
  return out;
}

std::string leg_id(std::string_view transfer_id, std::string_view account_id, std::string_view kind) {
  std::string out = std::to_string(transfer_id.size());
  out += ':';
  out += transfer_id;
  out += '|';
  out += account_id;
  out += '|';
  out += kind;
  return out;
}

std::string change_key(std::string_view account_id, std::int64_t seq) {
  char digits[24];
  std::snprintf(digits, sizeof digits, "%020lld", static_cast<long long>(seq));
  std::string out = std::to_string(account_id.size());
  out += ':';
  out += account_id;
  out += '#';
  out += digits;
  return out;
}

MongoStore::MongoStore(std::unique_ptr<Client> client) : client_(std::move(client)) {}

// ---- schema and topology ------------------------------------------------------

Status MongoStore::init_schema() {
  struct Index {
    const char* collection;
    const char* name;
    std::vector<const char*> fields;  // ascending
    bool unique;
  };
  const Index indexes[] = {
      {kTransfers, "due", {"due"}, false},
      {kTransfers, "state_modified", {"state", "modified"}, false},
      {kTransfers, "lease", {"lease"}, false},
      {kTransferLog, "transfer_version", {"t", "v"}, false},
      {kJournal, "change", {"k"}, true},
      {kJournal, "account_seq", {"a", "seq"}, false},
      {kJournal, "transfer", {"t"}, false},
  };
  // Only the missing ones, one per command: FerretDB 1.24 drops the
  // connection when one createIndexes repeats several existing indexes.
  for (const Index& ix : indexes) {
    bool exists = false;
    if (Status s = client_->index_exists(ix.collection, ix.name, exists); !s) return s;
    if (exists) continue;
    Doc c;
    c.str("createIndexes", ix.collection).array("indexes", [&](Builder& a) {
      a.push_doc([&](Builder& d) {
        d.sub("key", [&](Builder& k) {
          for (const char* f : ix.fields) k.i64(f, 1);
        });
        d.str("name", ix.name);
        if (ix.unique) d.boolean("unique", true);
      });
    });
    Doc reply;
    if (Status s = client_->command(c.bson(), reply, std::string("creating index ") + ix.collection + "." + ix.name); !s) {
      return s;
    }
  }
  int version = 0;
  int expanded = 0;
  bool exists = false;
  Doc filter;
  filter.str("_id", "schema");
  if (Status s = client_->find(kMeta, filter.bson(), nullptr,
                               [&](const View& v) {
                                 exists = true;
                                 version = static_cast<int>(v.i64("version"));
                                 expanded = static_cast<int>(v.i64("expanded"));
                               },
                               "reading the schema version");
      !s) {
    return s;
  }
  if (std::max(version, expanded) > kSchemaVersion) {
    return Status::fatal(display_name() + " has schema version " + std::to_string(version) +
                         ", newer than this program knows (" + std::to_string(kSchemaVersion) + ")");
  }
  // A store made here from nothing is contracted: no older program ran on it.
  // MongoDB's first schema is 3, and 4 changes nothing here: there is no
  // expand step to apply.
  if (!exists) version = kSchemaVersion;
  Doc update;
  update.sub("$set", [&](Builder& b) { b.i64("version", version).i64("expanded", kSchemaVersion); });
  BulkResult r;
  if (Status s = client_->bulk(kMeta, true, [&](Client::Bulk& bulk) { bulk.update_one(filter.bson(), update.bson(), true); },
                               r, "recording the schema version");
      !s) {
    return s;
  }
  if (!r.errors.empty()) return Status::fatal(display_name() + ": recording the schema version: " + r.errors[0].message);
  return Status::ok();
}

Status MongoStore::contract_schema() {
  bool exists = false;
  int expanded = 0;
  Doc filter;
  filter.str("_id", "schema");
  if (Status s = client_->find(kMeta, filter.bson(), nullptr,
                               [&](const View& v) {
                                 exists = true;
                                 expanded = static_cast<int>(v.i64("expanded"));
                               },
                               "reading the schema version");
      !s) {
    return s;
  }
  if (!exists || expanded < kSchemaVersion) {
    return Status::fatal(display_name() + " is not at schema version " + std::to_string(kSchemaVersion) +
                         " yet; run `sagactl init` first");
  }
  Doc update;
  update.sub("$set", [&](Builder& b) { b.i64("version", kSchemaVersion); });
  return client_->update_many(kMeta, filter.bson(), update.bson(), nullptr, "raising the schema floor");
}

Status MongoStore::read_topology(std::optional<Topology>& out) {
  out.reset();
  Topology t;
  bool schema = false;
  bool topology = false;
  Doc all;
  if (Status s = client_->find(kMeta, all.bson(), nullptr,
                               [&](const View& v) {
                                 if (v.str("_id") == "schema") {
                                   schema = true;
                                   t.schema_version = static_cast<int>(v.i64("version"));
                                   t.schema_expanded = static_cast<int>(v.i64("expanded"));
                                 } else if (v.str("_id") == "topology") {
                                   topology = true;
                                   t.ledger_id.assign(v.str("ledger"));
                                   t.shard_index = static_cast<int>(v.i64("shard_index"));
                                   t.shard_count = static_cast<int>(v.i64("shard_count"));
                                 }
                               },
                               "reading the topology");
      !s) {
    return s;
  }
  if (schema && topology) out = std::move(t);
  return Status::ok();
}

Status MongoStore::write_topology(const Topology& t) {
  Doc filter;
  filter.str("_id", "topology");
  Doc update;
  update.sub("$set", [&](Builder& b) {
    b.str("ledger", t.ledger_id).i64("shard_index", t.shard_index).i64("shard_count", t.shard_count);
  });
  BulkResult r;
  if (Status s = client_->bulk(kMeta, true, [&](Client::Bulk& bulk) { bulk.update_one(filter.bson(), update.bson(), true); },
                               r, "writing the topology");
      !s) {
    return s;
  }
  if (!r.errors.empty()) return Status::fatal(display_name() + ": writing the topology: " + r.errors[0].message);
  return Status::ok();
}

// ---- transfers ------------------------------------------------------------------

Status MongoStore::insert_transfers(std::span<const NewTransfer> batch, std::string_view owner,
                                    std::int64_t lease_ms, std::span<InsertResult> results) {
  if (batch.empty()) return Status::ok();
  std::int64_t now = 0;
  if (Status s = client_->server_now(now); !s) return s;
  // The first record of each id is inserted; a later one in the batch is
  // compared with whatever then holds the id.
  std::unordered_map<std::string_view, std::size_t> first;
  std::vector<std::size_t> to_insert;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    if (first.emplace(batch[i].request.id, i).second) to_insert.push_back(i);
  }
  std::vector<std::string_view> existing;  // ids already stored before this call
  for (std::size_t from = 0; from < to_insert.size(); from += kChunk) {
    const std::size_t end = std::min(to_insert.size(), from + kChunk);
    BulkResult r;
    const Status s = client_->bulk(
        kTransfers, false,
        [&](Client::Bulk& bulk) {
          for (std::size_t j = from; j < end; ++j) {
            const NewTransfer& t = batch[to_insert[j]];
            const RequestView& q = t.request;
            Doc d;
            d.str("_id", q.id).str("from", q.from).str("to", q.to).i64("amount", q.amount);
            d.str("currency", q.currency).str("metadata", q.metadata);
            d.i64("hash", static_cast<std::int64_t>(t.payload_hash));
            d.str("state", to_string(TransferState::initial)).str("reason", to_string(Reason::none));
            d.i64("v", 1).str("owner", owner).i64("epoch", 1).i64("lease", now + lease_ms).i64("due", now + lease_ms);
            d.i64("created", now).i64("modified", now).i64("requested", t.requested_at_ms).i64("finished", 0);
            d.i64("attempts", 0).boolean("notified", false);
            d.str("topic", t.origin_topic).i64("partition", t.origin_partition).i64("offset", t.origin_offset);
            bulk.insert(d.bson());
          }
        },
        r, "inserting transfers");
    if (!s) return s;
    for (const WriteError& e : r.errors) {
      if (e.code != kDuplicateKey) {
        return Status::fatal(display_name() + ": inserting transfers: " + e.message);
      }
      existing.push_back(batch[to_insert[from + e.index]].request.id);
    }
  }
  std::unordered_map<std::string, TransferDoc> stored;
  Status bad;
  if (Status s = find_ids(*client_, kTransfers, std::span<const std::string_view>(existing), nullptr,
                          [&](const View& v) {
                            TransferDoc d;
                            if (Status r = read_transfer(display_name(), v, d); !r) bad = r;
                            stored.emplace(d.id, std::move(d));
                          },
                          "reading existing transfers");
      !s) {
    return s;
  }
  if (!bad) return bad;
  std::set<std::string_view> held(existing.begin(), existing.end());
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const RequestView& q = batch[i].request;
    const std::size_t f = first.at(q.id);
    if (f == i && held.count(q.id) == 0) {
      results[i] = InsertResult::inserted;
      continue;
    }
    bool same = false;
    if (held.count(q.id) != 0) {
      const auto it = stored.find(std::string(q.id));
      if (it == stored.end()) return Status::retry_call(display_name() + ": transfer " + std::string(q.id) + " vanished");
      const TransferDoc& d = it->second;
      same = d.payload_hash == batch[i].payload_hash && d.source == q.from && d.destination == q.to &&
             d.amount == q.amount && d.currency == q.currency && d.metadata == q.metadata;
    } else {  // inserted by this call from record f
      const NewTransfer& t = batch[f];
      same = t.payload_hash == batch[i].payload_hash && t.request.from == q.from && t.request.to == q.to &&
             t.request.amount == q.amount && t.request.currency == q.currency &&
             t.request.metadata == q.metadata;
    }
    results[i] = same ? InsertResult::duplicate : InsertResult::conflict;
  }
  return Status::ok();
}

Status MongoStore::mark_notified(std::span<const std::string_view> ids) {
  Doc update;
  update.sub("$set", [](Builder& b) { b.boolean("notified", true); });
  update.sub("$unset", [](Builder& b) { b.str("due", ""); });
  bool one_by_one = false;
  if (Status s = client_->lookups_one_by_one(one_by_one); !s) return s;
  if (one_by_one) {
    // A conditional update would parse the whole collection there; the
    // condition is read by _id and the update is by _id, which is how that
    // server applies a conditional update anyway (docs/mongodb.md).
    std::vector<std::string> unmarked;
    if (Status s = find_ids(*client_, kTransfers, ids, nullptr,
                            [&](const View& v) {
                              const auto state = parse_transfer_state(v.str("state"));
                              if (state && is_terminal(*state) && !v.boolean("notified")) {
                                unmarked.emplace_back(v.str("_id"));
                              }
                            },
                            "reading outcomes to mark published");
        !s) {
      return s;
    }
    BulkResult r;
    if (Status s = client_->bulk(
            kTransfers, false,
            [&](Client::Bulk& bulk) {
              for (const std::string& id : unmarked) {
                Doc filter;
                filter.str("_id", id);
                bulk.update_one(filter.bson(), update.bson());
              }
            },
            r, "marking outcomes published");
        !s) {
      return s;
    }
    if (!r.errors.empty()) return Status::fatal(display_name() + ": marking outcomes published: " + r.errors.front().message);
    return Status::ok();
  }
  for (std::size_t from = 0; from < ids.size(); from += kChunk) {
    Doc filter;
    id_in(filter, chunk(ids, from));
    filter.sub("state", [](Builder& c) { c.array("$in", terminal_states); });
    filter.boolean("notified", false);
    if (Status s = client_->update_many(kTransfers, filter.bson(), update.bson(), nullptr, "marking outcomes published");
        !s) {
      return s;
    }
  }
  return Status::ok();
}

Status MongoStore::load_transfer(std::string_view id, std::optional<TransferDoc>& out) {
  out.reset();
  Doc filter;
  filter.str("_id", id);
  Status bad;
  if (Status s = client_->find(kTransfers, filter.bson(), nullptr,
                               [&](const View& v) {
                                 TransferDoc d;
                                 bad = read_transfer(display_name(), v, d);
                                 out = std::move(d);
                               },
                               "reading a transfer");
      !s) {
    return s;
  }
  return bad;
}

Status MongoStore::list_stale(std::int64_t before_ms, std::size_t limit, std::vector<TransferDoc>& out) {
  out.clear();
  if (limit == 0) return Status::ok();
  Doc filter;
  filter.sub("state", [](Builder& c) { c.array("$nin", terminal_states); });
  filter.sub("modified", [&](Builder& c) { c.i64("$lt", before_ms); });
  Doc opts;
  opts.sub("sort", [](Builder& s) { s.i64("modified", 1).i64("_id", 1); });
  Status bad;
  if (Status s = client_->find(kTransfers, filter.bson(), opts.bson(),
                               [&](const View& v) {
                                 if (out.size() == limit) return;  // no "limit": see Client::find
                                 TransferDoc d;
                                 if (Status e = read_transfer(display_name(), v, d); !e) bad = e;
                                 out.push_back(std::move(d));
                               },
                               "listing stale transfers");
      !s) {
    return s;
  }
  return bad;
}

Status MongoStore::state_stats(StateStatsTable& out) {
  out = {};
  std::int64_t now = 0;
  if (Status s = client_->server_now(now); !s) return s;
  Doc filter;
  filter.sub("due", [](Builder& c) { c.boolean("$exists", true); });
  Doc opts;
  opts.sub("projection", [](Builder& p) { p.i64("state", 1).i64("created", 1).i64("finished", 1).i64("lease", 1); });
  return client_->find(
      kTransfers, filter.bson(), opts.bson(),
      [&](const View& v) {
        const std::optional<TransferState> state = parse_transfer_state(v.str("state"));
        if (!state) return;
        StateStats& s = out[static_cast<std::size_t>(*state)];
        const std::int64_t since = is_terminal(*state) ? v.i64("finished") : v.i64("created");
        s.oldest_ms = s.count == 0 ? since : std::min(s.oldest_ms, since);
        ++s.count;
        if (v.i64("lease") < now) ++s.stuck;
      },
      "counting transfers by state");
}

Status MongoStore::scan_transfer_states(const std::function<void(std::string_view, TransferState, bool)>& fn) {
  if (Status s = settle_all_transfers(); !s) return s;
  Doc all;
  Doc opts;
  opts.sub("projection", [](Builder& p) { p.i64("state", 1).i64("notified", 1); });
  Status bad;
  if (Status s = client_->find(kTransfers, all.bson(), opts.bson(),
                               [&](const View& v) {
                                 const std::optional<TransferState> state = parse_transfer_state(v.str("state"));
                                 if (!state) {
                                   bad = bad_document(display_name(), "state", v.str("_id"));
                                   return;
                                 }
                                 fn(v.str("_id"), *state, v.boolean("notified"));
                               },
                               "scanning transfers");
      !s) {
    return s;
  }
  return bad;
}

// ---- accounts -------------------------------------------------------------------

Status MongoStore::create_accounts(std::span<const Account> accounts) {
  std::set<std::string_view> ids;
  for (const Account& a : accounts) {
    if (!ids.insert(a.id).second) {
      return Status::fatal("account " + a.id + " is given twice; nothing was created");
    }
  }
  // All or none without a transaction: inserted in order, and on a clash the
  // ones this call inserted are removed again.
  std::vector<std::string_view> inserted;
  for (std::size_t from = 0; from < accounts.size(); from += kChunk) {
    const std::size_t end = std::min(accounts.size(), from + kChunk);
    BulkResult r;
    Status s = client_->bulk(
        kAccounts, true,
        [&](Client::Bulk& bulk) {
          for (std::size_t i = from; i < end; ++i) {
            const Account& a = accounts[i];
            Doc d;
            d.str("_id", a.id).i64("balance", a.balance).i64("opening", a.balance).i64("min", a.min_balance);
            d.str("currency", a.currency).boolean("locked", a.locked).i64("reserved", 0).i64("seq", 0);
            d.sub("pending", [](Builder&) {});
            bulk.insert(d.bson());
          }
        },
        r, "creating accounts");
    const std::size_t done = r.errors.empty() ? end - from : r.errors.front().index;
    for (std::size_t i = from; i < from + done && s; ++i) inserted.push_back(accounts[i].id);
    if (s && r.errors.empty()) continue;
    std::string message = !s ? s.message()
                          : r.errors.front().code == kDuplicateKey
                              ? "account " + accounts[from + done].id + " already exists; nothing was created"
                              : display_name() + ": creating accounts: " + r.errors.front().message;
    for (std::size_t k = 0; k < inserted.size(); k += kChunk) {
      Doc filter;
      id_in(filter, chunk(std::span<const std::string_view>(inserted), k));
      if (Status undo = client_->delete_many(kAccounts, filter.bson(), "removing the accounts of a failed call"); !undo) {
        return Status::fatal(message + "; removing the " + std::to_string(inserted.size()) +
                             " accounts this call created failed too: " + undo.message());
      }
    }
    return s.is_transient() ? s : Status::fatal(std::move(message));
  }
  return Status::ok();
}

Status MongoStore::load_account(std::string_view id, std::optional<Account>& out) {
  return load_accounts(std::span(&id, 1), std::span(&out, 1));
}

Status MongoStore::load_accounts(std::span<const std::string_view> ids, std::span<std::optional<Account>> out) {
  std::unordered_map<std::string, Account> found;
  if (Status s = find_ids(*client_, kAccounts, ids, nullptr,
                          [&](const View& v) {
                            Account a;
                            read_account(v, a);
                            found.emplace(a.id, std::move(a));
                          },
                          "reading accounts");
      !s) {
    return s;
  }
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto it = found.find(std::string(ids[i]));
    if (it == found.end()) out[i].reset();
    else out[i] = it->second;
  }
  return Status::ok();
}

namespace {

void posting_kinds(Builder& a) {
  for (const PostingKind k : {PostingKind::debit, PostingKind::credit, PostingKind::reverse_debit}) {
    a.push_str(to_string(k));
  }
}

bool read_posting(const View& v, Posting& p) {
  const std::optional<PostingKind> kind = parse_posting_kind(v.str("kind"));
  if (!kind) return false;
  p.transfer_id.assign(v.str("t"));
  p.account_id.assign(v.str("a"));
  p.kind = *kind;
  p.amount = v.i64("amount");
  p.at_ms = v.i64("at");
  return true;
}

}  // namespace

Status MongoStore::postings_for_transfer(std::string_view transfer_id, std::vector<Posting>& out) {
  out.clear();
  const auto take = [&](const View& v) {
    Posting p;
    if (read_posting(v, p)) out.push_back(std::move(p));
  };
  std::optional<TransferDoc> t;
  if (Status s = load_transfer(transfer_id, t); !s) return s;
  if (t) {
    // A transfer's postings are its legs: the debit and its reversal on the
    // source, the credit on the destination, each under its leg's _id.
    const std::string legs[] = {
        leg_id(transfer_id, t->source, to_string(PostingKind::debit)),
        leg_id(transfer_id, t->source, to_string(PostingKind::reverse_debit)),
        leg_id(transfer_id, t->destination, to_string(PostingKind::credit)),
    };
    if (Status s = find_ids(*client_, kJournal, std::span<const std::string>(legs), nullptr, take,
                            "reading a transfer's postings");
        !s) {
      return s;
    }
  } else {  // the transfer is on another store of a sharded ledger
    Doc filter;
    filter.str("t", transfer_id);
    filter.sub("kind", [](Builder& c) { c.array("$in", posting_kinds); });
    if (Status s = client_->find(kJournal, filter.bson(), nullptr, take, "reading a transfer's postings"); !s) {
      return s;
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const Posting& a, const Posting& b) {
    return std::make_tuple(a.at_ms, to_string(a.kind)) < std::make_tuple(b.at_ms, to_string(b.kind));
  });
  return Status::ok();
}

Status MongoStore::postings_for_account(std::string_view account_id, std::size_t limit, std::vector<Posting>& out) {
  out.clear();
  if (limit == 0) return Status::ok();
  Doc filter;
  filter.str("a", account_id);
  filter.sub("kind", [](Builder& c) { c.array("$in", posting_kinds); });
  Doc opts;
  opts.sub("sort", [](Builder& s) { s.i64("a", 1).i64("seq", -1); });  // newest first
  return client_->find(
      kJournal, filter.bson(), opts.bson(),
      [&](const View& v) {
        if (out.size() == limit) return;  // no "limit": see Client::find
        Posting p;
        if (read_posting(v, p)) out.push_back(std::move(p));
      },
      "reading an account's postings");
}

Status MongoStore::pending_for_account(std::string_view account_id, std::vector<std::string>& transfer_ids) {
  transfer_ids.clear();
  Doc filter;
  filter.str("_id", account_id);
  if (Status s = client_->find(kAccounts, filter.bson(), nullptr,
                               [&](const View& v) {
                                 v.each_i64("pending", [&](std::string_view key, std::int64_t) {
                                   transfer_ids.push_back(pending_id(key));
                                 });
                               },
                               "reading an account's pending entries");
      !s) {
    return s;
  }
  std::sort(transfer_ids.begin(), transfer_ids.end());
  return Status::ok();
}

Status MongoStore::scan_accounts(const std::function<void(const Account&)>& fn) {
  if (Status s = settle_all(); !s) return s;
  Doc all;
  Doc opts;
  opts.sub("sort", [](Builder& s) { s.i64("_id", 1); });
  Account a;
  return client_->find(
      kAccounts, all.bson(), opts.bson(),
      [&](const View& v) {
        read_account(v, a);
        fn(a);
      },
      "scanning accounts");
}

Status MongoStore::scan_postings(const std::function<void(const Posting&)>& fn) {
  if (Status s = settle_all(); !s) return s;
  Doc filter;
  filter.sub("kind", [](Builder& c) { c.array("$in", posting_kinds); });
  Posting p;
  return client_->find(
      kJournal, filter.bson(), nullptr,
      [&](const View& v) {
        if (read_posting(v, p)) fn(p);
      },
      "scanning postings");
}

Status MongoStore::scan_pending(const std::function<void(const PendingEntry&)>& fn) {
  if (Status s = settle_all(); !s) return s;
  Doc all;
  Doc opts;
  opts.sub("sort", [](Builder& s) { s.i64("_id", 1); });
  opts.sub("projection", [](Builder& p) { p.i64("pending", 1); });
  PendingEntry e;
  return client_->find(
      kAccounts, all.bson(), opts.bson(),
      [&](const View& v) {
        e.account_id.assign(v.str("_id"));
        std::vector<std::string> ids;
        v.each_i64("pending", [&](std::string_view key, std::int64_t) { ids.push_back(pending_id(key)); });
        std::sort(ids.begin(), ids.end());
        for (std::string& id : ids) {
          e.transfer_id = std::move(id);
          fn(e);
        }
      },
      "scanning pending entries");
}

// ---- the worker registry ----------------------------------------------------------

Status MongoStore::register_worker(const WorkerRecord& w) {
  std::int64_t now = 0;
  if (Status s = client_->server_now(now); !s) return s;
  Doc filter;
  filter.str("_id", w.worker_id);
  Doc update;
  update.sub("$set", [&](Builder& b) {
    b.str("build", w.build_version).str("revision", w.git_revision).i64("schema", w.schema_version);
    b.i64("lease", w.lease_ms).i64("heartbeat", now);
  });
  BulkResult r;
  if (Status s = client_->bulk(kWorkers, true, [&](Client::Bulk& bulk) { bulk.update_one(filter.bson(), update.bson(), true); },
                               r, "registering the worker");
      !s) {
    return s;
  }
  if (!r.errors.empty()) return Status::fatal(display_name() + ": registering the worker: " + r.errors[0].message);
  return Status::ok();
}

Status MongoStore::deregister_worker(std::string_view worker_id) {
  Doc filter;
  filter.str("_id", worker_id);
  return client_->delete_many(kWorkers, filter.bson(), "deregistering the worker");
}

Status MongoStore::list_workers(std::vector<WorkerRecord>& out) {
  out.clear();
  Doc all;
  Doc opts;
  opts.sub("sort", [](Builder& s) { s.i64("_id", 1); });
  return client_->find(
      kWorkers, all.bson(), opts.bson(),
      [&](const View& v) {
        WorkerRecord w;
        w.worker_id.assign(v.str("_id"));
        w.build_version.assign(v.str("build"));
        w.git_revision.assign(v.str("revision"));
        w.schema_version = static_cast<int>(v.i64("schema"));
        w.lease_ms = v.i64("lease");
        w.heartbeat_ms = v.i64("heartbeat");
        out.push_back(std::move(w));
      },
      "listing workers");
}

Status MongoStore::recent_owners(std::int64_t since_ms, std::vector<std::string>& out) {
  Doc filter;
  filter.sub("lease", [&](Builder& c) { c.i64("$gte", since_ms); });
  if (Status s = client_->distinct(kTransfers, "owner", filter.bson(), out, "listing recent lease owners"); !s) {
    return s;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return Status::ok();
}

}  // namespace mongo

Status open_mongo_store(std::string_view url, std::unique_ptr<Store>& out) {
  std::unique_ptr<mongo::Client> client;
  if (Status s = mongo::Client::open(std::string(url), client); !s) return s;
  out = std::make_unique<mongo::MongoStore>(std::move(client));
  return Status::ok();
}

}  // namespace sagapool
