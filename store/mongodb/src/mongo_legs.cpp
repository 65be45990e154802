// Legs on the MongoDB store: every account change goes through the journal
// (mongo_store.hpp). A batch is planned on the accounts and leg decisions it
// read, its journal documents are inserted in one ordered bulk write, and the
// accounts are moved to their last change in a second. An insert that fails
// on a unique key means another writer got there first (a leg decided, or an
// account's next change taken): the batch is planned again from that record
// on fresh reads, so its results are those of its records applied one by one.
#include <algorithm>
#include <set>
#include <unordered_map>

#include "mongo_store.hpp"

namespace sagapool::mongo {

namespace {

// Re-plans before a batch gives up for now (retry_call): only reached when
// other writers keep taking the same accounts' next changes.
constexpr int kMaxPlans = 200;
constexpr std::string_view kVoid = "void";
constexpr std::string_view kRelease = "release";

struct Decision {
  bool posted = false;  // else voided
  std::string account;
  std::int64_t seq = 0;
};

// A journal document to insert, and what it means for the plan.
struct Write {
  std::size_t leg = 0;
  std::unique_ptr<Doc> doc;
  std::string account;  // set for an account change
  std::int64_t seq = 0;
};

std::string_view kind_name(PostingKind k) { return to_string(k); }

}  // namespace

Status MongoStore::read_account_states(std::span<const std::string> ids,
                                       std::map<std::string, AccountState, std::less<>>& out) {
  return find_ids(*client_, kAccounts, ids, nullptr,
                  [&](const View& v) {
                    AccountState st;
                    read_account(v, st.account);
                    st.seq = v.i64("seq");
                    v.each_i64("pending",
                               [&](std::string_view key, std::int64_t r) { st.pending.emplace(std::string(key), r); });
                    out[st.account.id] = std::move(st);
                  },
                  "reading accounts");
}

void apply_change(AccountState& a, const View& change) {
  a.account.balance = change.i64("balance");
  a.account.reserved = change.i64("reserved");
  a.account.locked = change.boolean("locked");
  a.seq = change.i64("seq");
  const std::string pk(change.str("pk"));
  if (pk.empty()) return;
  if (change.has("pv")) a.pending[pk] = change.i64("pv");
  else a.pending.erase(pk);
}

void account_update(Doc& update, const AccountState& a) {
  update.sub("$set", [&](Builder& b) {
    b.i64("balance", a.account.balance).i64("reserved", a.account.reserved).boolean("locked", a.account.locked);
    b.i64("seq", a.seq);
    b.sub("pending", [&](Builder& p) {
      for (const auto& [pk, reserve] : a.pending) p.i64(pk, reserve);
    });
  });
}

Status MongoStore::settle(std::string_view account_id) {
  const std::string id(account_id);
  std::map<std::string, AccountState, std::less<>> read;
  if (Status s = read_account_states(std::span(&id, 1), read); !s) return s;
  const auto it = read.find(id);
  if (it == read.end()) return Status::ok();
  AccountState& a = it->second;
  const std::int64_t from = a.seq;
  Doc filter;
  filter.str("a", account_id);
  filter.sub("seq", [&](Builder& c) { c.i64("$gt", from); });
  Doc opts;
  opts.sub("sort", [](Builder& s) { s.i64("a", 1).i64("seq", 1); });
  if (Status s = client_->find(kJournal, filter.bson(), opts.bson(), [&](const View& v) { apply_change(a, v); },
                               "reading an account's unapplied changes");
      !s) {
    return s;
  }
  if (a.seq == from) return Status::ok();
  Doc by_id;
  by_id.str("_id", account_id);
  Doc update;
  account_update(update, a);
  return client_->update_many(kAccounts, by_id.bson(), update.bson(), nullptr, "applying an account's changes");
}

Status MongoStore::settle_all() {
  std::unordered_map<std::string, std::int64_t> seqs;
  Doc all;
  Doc opts;
  opts.sub("projection", [](Builder& p) { p.i64("seq", 1); });
  if (Status s = client_->find(kAccounts, all.bson(), opts.bson(),
                               [&](const View& v) { seqs.emplace(std::string(v.str("_id")), v.i64("seq")); },
                               "reading account versions");
      !s) {
    return s;
  }
  Doc changes;
  changes.sub("seq", [](Builder& c) { c.boolean("$exists", true); });
  Doc projection;
  projection.sub("projection", [](Builder& p) { p.i64("a", 1).i64("seq", 1); });
  std::set<std::string> behind;
  if (Status s = client_->find(kJournal, changes.bson(), projection.bson(),
                               [&](const View& v) {
                                 const auto it = seqs.find(std::string(v.str("a")));
                                 if (it != seqs.end() && v.i64("seq") > it->second) behind.insert(it->first);
                               },
                               "finding unapplied account changes");
      !s) {
    return s;
  }
  for (const std::string& id : behind) {
    if (Status s = settle(id); !s) return s;
  }
  return Status::ok();
}

Status MongoStore::apply_legs(std::span<const LegRequest> batch, std::span<LegResult> results) {
  for (const LegRequest& req : batch) {
    if (req.amount <= 0 && (req.op == LegOp::debit || req.op == LegOp::credit)) {
      return Status::fatal("leg of transfer " + std::string(req.transfer_id) + " has a non-positive amount");
    }
  }
  if (batch.empty()) return Status::ok();
  std::int64_t now = 0;
  if (Status s = client_->server_now(now); !s) return s;

  std::size_t from = 0;
  std::set<std::string, std::less<>> contended;  // accounts whose next change someone else took
  for (int plan = 0; from < batch.size(); ++plan) {
    if (plan == kMaxPlans) {
      return Status::retry_call(display_name() + ": legs kept meeting other writers' changes on the same accounts");
    }
    // ---- read what the rest of the batch depends on
    std::vector<std::string> account_ids;
    std::vector<std::string> decision_ids;
    for (std::size_t i = from; i < batch.size(); ++i) {
      const LegRequest& r = batch[i];
      account_ids.emplace_back(r.account_id);
      switch (r.op) {
        case LegOp::debit:
        case LegOp::cancel_debit:
          decision_ids.push_back(leg_id(r.transfer_id, r.account_id, kind_name(PostingKind::debit)));
          if (r.op == LegOp::cancel_debit) {
            decision_ids.push_back(leg_id(r.transfer_id, r.account_id, kind_name(PostingKind::reverse_debit)));
          }
          break;
        case LegOp::credit:
        case LegOp::cancel_credit:
          decision_ids.push_back(leg_id(r.transfer_id, r.account_id, kind_name(PostingKind::credit)));
          break;
        case LegOp::release: break;
      }
    }
    std::sort(account_ids.begin(), account_ids.end());
    account_ids.erase(std::unique(account_ids.begin(), account_ids.end()), account_ids.end());
    std::sort(decision_ids.begin(), decision_ids.end());
    decision_ids.erase(std::unique(decision_ids.begin(), decision_ids.end()), decision_ids.end());

    std::unordered_map<std::string, Decision> decisions;
    if (Status s = find_ids(*client_, kJournal, std::span<const std::string>(decision_ids), nullptr,
                            [&](const View& v) {
                              decisions[std::string(v.str("_id"))] =
                                  Decision{v.str("kind") != kVoid, std::string(v.str("a")), v.i64("seq")};
                            },
                            "reading leg decisions");
        !s) {
      return s;
    }
    std::map<std::string, AccountState, std::less<>> accounts;
    if (Status s = read_account_states(account_ids, accounts); !s) return s;
    // Changes in the journal but not yet on their account (a crashed or
    // slower writer's) are applied before anything is planned on it.
    std::set<std::string, std::less<>> behind = std::move(contended);
    contended.clear();
    for (const auto& [id, d] : decisions) {
      const auto it = accounts.find(d.account);
      if (d.posted && it != accounts.end() && d.seq > it->second.seq) behind.insert(d.account);
    }
    if (!behind.empty()) {
      for (const std::string& id : behind) {
        if (Status s = settle(id); !s) return s;
      }
      std::vector<std::string> ids(behind.begin(), behind.end());
      if (Status s = read_account_states(ids, accounts); !s) return s;
    }

    const std::map<std::string, AccountState, std::less<>> base = accounts;

    // ---- plan
    std::vector<Write> writes;
    const auto change = [&](std::size_t leg, AccountState& a, std::string id, std::string_view kind,
                            std::int64_t amount, std::string_view pk, const std::int64_t* pv) {
      const LegRequest& r = batch[leg];
      auto doc = std::make_unique<Doc>();
      doc->str("_id", id).str("k", change_key(a.account.id, a.seq)).str("a", a.account.id).i64("seq", a.seq);
      doc->str("t", r.transfer_id).str("kind", kind).i64("amount", amount).i64("at", now);
      doc->i64("balance", a.account.balance).i64("reserved", a.account.reserved);
      doc->boolean("locked", a.account.locked).str("pk", pk);
      if (pv != nullptr) doc->i64("pv", *pv);
      writes.push_back({leg, std::move(doc), a.account.id, a.seq});
    };
    const auto void_leg = [&](std::size_t leg, const std::string& id) {
      const LegRequest& r = batch[leg];
      auto doc = std::make_unique<Doc>();
      doc->str("_id", id).str("k", "void|" + id).str("a", r.account_id).str("t", r.transfer_id).str("kind", kVoid);
      writes.push_back({leg, std::move(doc), {}, 0});
      decisions[id] = Decision{false, std::string(r.account_id), 0};
    };

    std::vector<std::size_t> unwritten;  // legs decided on an account without changing it
    Status failed;
    for (std::size_t i = from; i < batch.size() && failed; ++i) {
      const LegRequest& req = batch[i];
      LegResult& out = results[i];
      out.reason = Reason::none;
      out.account_currency.clear();
      const auto acct = accounts.find(req.account_id);
      AccountState* a = acct == accounts.end() ? nullptr : &acct->second;
      if (a != nullptr && req.op != LegOp::cancel_credit && req.op != LegOp::release) {
        out.account_currency = a->account.currency;
      }
      const std::string pk = pending_key(req.transfer_id);
      switch (req.op) {
        case LegOp::debit:
        case LegOp::credit: {
          const bool debit = req.op == LegOp::debit;
          const PostingKind kind = debit ? PostingKind::debit : PostingKind::credit;
          std::string id = leg_id(req.transfer_id, req.account_id, kind_name(kind));
          if (const auto d = decisions.find(id); d != decisions.end()) {
            out.status = d->second.posted ? LegStatus::already_posted : LegStatus::voided;
            break;
          }
          out.status = LegStatus::refused;
          if (a == nullptr) {
            out.reason = Reason::unknown_account;
            break;
          }
          const Account& acc = a->account;
          if (acc.locked) {
            out.reason = Reason::account_locked;
            break;
          }
          if (!req.currency.empty() && !acc.currency.empty() && req.currency != acc.currency) {
            out.reason = Reason::currency_mismatch;
            break;
          }
          std::int64_t next = 0;
          std::int64_t room = 0;
          if (debit) {
            if (__builtin_sub_overflow(acc.balance, req.amount, &next) || next < acc.min_balance) {
              out.reason = Reason::insufficient_funds;
              break;
            }
            if (__builtin_add_overflow(acc.reserved, req.amount, &room)) {
              out.reason = Reason::overflow;
              break;
            }
          } else if (__builtin_add_overflow(acc.balance, req.amount, &next) ||
                     __builtin_add_overflow(next, acc.reserved, &room)) {
            out.reason = Reason::overflow;
            break;
          }
          const std::int64_t reserve = debit ? req.amount : 0;
          a->account.balance = next;
          a->account.reserved += reserve;
          std::int64_t& entry = a->pending[pk];  // added to an entry already there
          entry += reserve;
          ++a->seq;
          decisions[id] = Decision{true, a->account.id, a->seq};
          change(i, *a, std::move(id), kind_name(kind), req.amount, pk, &entry);
          out.status = LegStatus::posted;
          break;
        }
        case LegOp::cancel_debit: {
          const std::string debit_id = leg_id(req.transfer_id, req.account_id, kind_name(PostingKind::debit));
          const auto d = decisions.find(debit_id);
          if (d == decisions.end() || !d->second.posted) {
            out.status = LegStatus::voided;
            if (d == decisions.end()) void_leg(i, debit_id);
            break;
          }
          out.status = LegStatus::reversed;
          std::string id = leg_id(req.transfer_id, req.account_id, kind_name(PostingKind::reverse_debit));
          if (decisions.count(id) != 0) break;
          if (a == nullptr) {
            failed = Status::fatal(display_name() + ": account " + std::string(req.account_id) +
                                   " of a posted debit is missing");
            break;
          }
          std::int64_t next = 0;
          if (__builtin_add_overflow(a->account.balance, req.amount, &next)) {
            failed = Status::fatal("reversing debit of transfer " + std::string(req.transfer_id) +
                                   " would overflow account " + std::string(req.account_id));
            break;
          }
          std::int64_t released = 0;
          if (const auto e = a->pending.find(pk); e != a->pending.end()) {
            released = e->second;
            a->pending.erase(e);
          }
          a->account.balance = next;
          a->account.reserved -= released;
          ++a->seq;
          decisions[id] = Decision{true, a->account.id, a->seq};
          change(i, *a, std::move(id), kind_name(PostingKind::reverse_debit), req.amount, pk, nullptr);
          break;
        }
        case LegOp::cancel_credit: {
          const std::string credit_id = leg_id(req.transfer_id, req.account_id, kind_name(PostingKind::credit));
          const auto d = decisions.find(credit_id);
          if (d != decisions.end() && d->second.posted) {
            out.status = LegStatus::credit_posted;
            break;
          }
          out.status = LegStatus::voided;
          if (d == decisions.end()) void_leg(i, credit_id);
          break;
        }
        case LegOp::release: {
          out.status = LegStatus::released;
          if (a == nullptr) break;
          const auto e = a->pending.find(pk);
          if (e == a->pending.end()) {
            unwritten.push_back(i);
            break;
          }
          const std::int64_t released = e->second;
          a->pending.erase(e);
          a->account.reserved -= released;
          ++a->seq;
          change(i, *a, std::string(kRelease) + "|" + change_key(a->account.id, a->seq), kRelease, released, pk,
                 nullptr);
          break;
        }
      }
    }
    if (!failed) return failed;

    // ---- a refusal, or a release that found nothing to release, writes
    // nothing, so no key tells whether it was planned on an account document
    // behind its journal (a slower writer's update can land after a later
    // one's): it stands only if the account had no change after the one read.
    for (std::size_t i = from; i < batch.size(); ++i) {
      if (results[i].status == LegStatus::refused && results[i].reason != Reason::unknown_account) {
        unwritten.push_back(i);
      }
    }
    std::set<std::string> next_keys;
    for (std::size_t i : unwritten) {
      next_keys.insert(change_key(batch[i].account_id, base.at(std::string(batch[i].account_id)).seq + 1));
    }
    if (!next_keys.empty()) {
      Doc filter;
      filter.sub("k", [&](Builder& c) {
        c.array("$in", [&](Builder& a) {
          for (const std::string& k : next_keys) a.push_str(k);
        });
      });
      Doc opts;
      opts.sub("projection", [](Builder& p) { p.i64("a", 1); });
      if (Status s = client_->find(kJournal, filter.bson(), opts.bson(),
                                   [&](const View& v) { contended.emplace(v.str("a")); },
                                   "checking refused legs' accounts for newer changes");
          !s) {
        return s;
      }
      if (!contended.empty()) continue;  // settled and planned again
    }

    // ---- the journal, in order: stops at the first record another writer beat
    BulkResult inserted;
    if (Status s = client_->bulk(
            kJournal, true, [&](Client::Bulk& bulk) { for (const Write& w : writes) bulk.insert(w.doc->bson()); },
            inserted, "writing leg journal entries");
        !s) {
      return s;
    }
    std::size_t done = writes.size();
    if (!inserted.errors.empty()) {
      const WriteError& e = inserted.errors.front();
      if (e.code != kDuplicateKey) return Status::fatal(display_name() + ": writing leg journal entries: " + e.message);
      done = e.index;
      if (!writes[done].account.empty()) contended.insert(writes[done].account);
    }

    // ---- the accounts, each moved to its last change written: by _id
    // alone, as the state is the whole of the journal up to that change
    std::map<std::string, AccountState, std::less<>> after;
    for (std::size_t w = 0; w < done; ++w) {
      if (writes[w].account.empty()) continue;
      auto it = after.find(writes[w].account);
      if (it == after.end()) it = after.emplace(writes[w].account, base.at(writes[w].account)).first;
      apply_change(it->second, View(writes[w].doc->bson()));
    }
    if (!after.empty()) {
      BulkResult updated;
      if (Status s = client_->bulk(
              kAccounts, false,
              [&](Client::Bulk& bulk) {
                for (const auto& [id, a] : after) {
                  Doc filter;
                  filter.str("_id", id);
                  Doc update;
                  account_update(update, a);
                  bulk.update_one(filter.bson(), update.bson());
                }
              },
              updated, "applying leg changes to accounts");
          !s) {
        return s;
      }
      if (!updated.errors.empty()) {
        return Status::fatal(display_name() + ": applying leg changes to accounts: " + updated.errors[0].message);
      }
    }
    from = done == writes.size() ? batch.size() : writes[done].leg;
  }
  return Status::ok();
}

// A lock is a change like any other, so that no document written back from
// an older version can undo it.
Status MongoStore::set_locked(std::string_view id, bool locked, bool& found) {
  const std::string key(id);
  for (int plan = 0; plan < kMaxPlans; ++plan) {
    // Settled first: a document behind its journal could show the lock
    // already as asked, and nothing written would tell.
    if (Status s = settle(key); !s) return s;
    std::map<std::string, AccountState, std::less<>> read;
    if (Status s = read_account_states(std::span(&key, 1), read); !s) return s;
    found = read.count(key) != 0;
    if (!found) return Status::ok();
    AccountState a = read.at(key);
    if (a.account.locked == locked) return Status::ok();
    a.account.locked = locked;
    ++a.seq;
    Doc change;
    const std::string k = change_key(key, a.seq);
    change.str("_id", "lock|" + k).str("k", k).str("a", key).i64("seq", a.seq).str("kind", "lock");
    change.i64("at", 0).i64("balance", a.account.balance).i64("reserved", a.account.reserved);
    change.boolean("locked", locked).str("pk", "");
    BulkResult r;
    if (Status s = client_->bulk(kJournal, true, [&](Client::Bulk& bulk) { bulk.insert(change.bson()); }, r,
                                 "logging an account lock");
        !s) {
      return s;
    }
    if (!r.errors.empty()) {
      if (r.errors[0].code != kDuplicateKey) return Status::fatal(display_name() + ": locking an account: " + r.errors[0].message);
      continue;
    }
    Doc filter;
    filter.str("_id", key);
    Doc update;
    account_update(update, a);
    return client_->update_many(kAccounts, filter.bson(), update.bson(), nullptr, "locking an account");
  }
  return Status::retry_call(display_name() + ": account " + key + " kept changing while being locked");
}

}  // namespace sagapool::mongo
