#pragma once
// The MongoDB store (docs/mongodb.md). No multi-document transactions, and
// batches are bulk writes.
//
// Every decision is an insert under a unique key, never a conditional
// update: FerretDB, the server this store is tested on, evaluates an
// update's filter on an earlier read and writes the whole document back, so
// two concurrent conditional updates can both apply (docs/mongodb.md). Only
// unique indexes are atomic there, as on MongoDB. Documents that change are
// therefore versioned, and each change is first inserted into a log under
// the key (document, version): of two writers only one can produce version
// n+1 of a document. The document is then moved to the logged values; a
// document left behind or written back over by a stale writer is brought up
// to date from its log by whoever meets it next ("settling").
//
// - transfers: one document per transfer, version `v`. Transitions, claims
//   and take-overs are logged changes (transfer_log) checked against the
//   version read: (state, owner, epoch) fence them as on the SQL stores.
//   `due` (the lease) is set only while the transfer is open (unfinished,
//   or finished and not yet published), so recovery scans open work alone.
// - accounts: balance, reserved, locked, the pending entries (transfer ->
//   what it reserves) and `seq`, the number of the change it shows.
// - journal: every change to an account and every leg's decision. A change
//   is inserted before it is applied: it carries the account's values after
//   it and the unique key k = (account, seq), so two writers can never both
//   produce change n of an account; a posting's _id is its leg, (transfer,
//   account, kind), shared with the void that fences that leg, so a leg is
//   either posted or voided, never both (whichever insert comes second fails
//   on the key). The account document is then set, by _id, to the state
//   its last change determines; anyone who finds it behind its journal (a
//   crashed or stale writer's doing) settles it first. The journal is the
//   posting journal the audit reads.
//   (Locks are journal changes too.)
// - meta: the schema version and the topology; workers: the registry.
#include <cstdint>
#include <algorithm>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "mongo_client.hpp"
#include "sagapool/store.hpp"

namespace sagapool::mongo {

inline constexpr const char* kTransfers = "transfers";
inline constexpr const char* kTransferLog = "transfer_log";
inline constexpr const char* kAccounts = "accounts";
inline constexpr const char* kJournal = "journal";
inline constexpr const char* kMeta = "meta";
inline constexpr const char* kWorkers = "workers";

// A transfer and the version it was read at.
struct Versioned {
  TransferDoc doc;
  std::int64_t v = 0;
};

// An account as a leg batch sees and changes it.
struct AccountState {
  Account account;
  std::int64_t seq = 0;
  std::map<std::string, std::int64_t, std::less<>> pending;  // transfer -> reserve
};

class MongoStore final : public Store {
 public:
  explicit MongoStore(std::unique_ptr<Client> client);

  const std::string& display_name() const noexcept override { return client_->display_name(); }
  Status init_schema() override;
  Status contract_schema() override;
  Status read_topology(std::optional<Topology>& out) override;
  Status write_topology(const Topology& t) override;
  Status now_ms(std::int64_t& out) override { return client_->server_now(out); }

  Status transition(std::span<const Transition> batch, std::int64_t lease_ms,
                    std::span<std::uint8_t> applied, std::int64_t* at_ms) override;
  Status apply_legs(std::span<const LegRequest> batch, std::span<LegResult> results) override;
  Status load_accounts(std::span<const std::string_view> ids,
                       std::span<std::optional<Account>> out) override;

  Status insert_transfers(std::span<const NewTransfer> batch, std::string_view owner,
                          std::int64_t lease_ms, std::span<InsertResult> results) override;
  Status mark_notified(std::span<const std::string_view> ids) override;

  Status claim_expired(std::string_view owner, std::int64_t lease_ms, std::size_t limit,
                       std::vector<TransferDoc>& out) override;
  Status take_over(std::string_view id, std::string_view owner, std::int64_t lease_ms,
                   std::optional<TransferDoc>& out) override;

  Status load_transfer(std::string_view id, std::optional<TransferDoc>& out) override;
  Status list_stale(std::int64_t before_ms, std::size_t limit, std::vector<TransferDoc>& out) override;
  Status state_stats(StateStatsTable& out) override;
  Status create_accounts(std::span<const Account> accounts) override;
  Status load_account(std::string_view id, std::optional<Account>& out) override;
  Status set_locked(std::string_view id, bool locked, bool& found) override;
  Status postings_for_transfer(std::string_view transfer_id, std::vector<Posting>& out) override;
  Status postings_for_account(std::string_view account_id, std::size_t limit,
                              std::vector<Posting>& out) override;
  Status pending_for_account(std::string_view account_id, std::vector<std::string>& transfer_ids) override;

  Status register_worker(const WorkerRecord& w) override;
  Status deregister_worker(std::string_view worker_id) override;
  Status list_workers(std::vector<WorkerRecord>& out) override;
  Status recent_owners(std::int64_t since_ms, std::vector<std::string>& out) override;

  Status scan_transfer_states(
      const std::function<void(std::string_view, TransferState, bool)>& fn) override;
  Status scan_accounts(const std::function<void(const Account&)>& fn) override;
  Status scan_postings(const std::function<void(const Posting&)>& fn) override;
  Status scan_pending(const std::function<void(const PendingEntry&)>& fn) override;

 private:
  // mongo_transfers.cpp
  Status read_versioned(std::span<const std::string> ids, std::map<std::string, Versioned, std::less<>>& out);
  // Logs each change (a transfer's new fields, at version v + 1 of the one
  // read) and applies the ones written; won[i] says which were. A change
  // not written lost to another writer's: settle and read again.
  Status commit_transfer_changes(std::span<const Versioned* const> changes, std::vector<std::uint8_t>& won);
  Status settle_transfer(std::string_view id, std::int64_t v);
  Status settle_all_transfers();

  // mongo_legs.cpp
  Status read_account_states(std::span<const std::string> ids, std::map<std::string, AccountState, std::less<>>& out);
  // Brings the account document up to its last change in the journal
  // (after a crashed writer, or a stale one that wrote back an older
  // version).
  Status settle(std::string_view account_id);
  // Settles every account (before the audit's scans).
  Status settle_all();

  std::unique_ptr<Client> client_;
};

// ---- shared by the store's files ------------------------------------------

// Ids per $in query (FerretDB tests every document against every id).
inline constexpr std::size_t kChunk = 1000;

// {_id: {$in: ids}}
template <class Ids>
void id_in(Builder& filter, const Ids& ids) {
  filter.sub("_id", [&](Builder& c) {
    c.array("$in", [&](Builder& a) {
      for (const auto& id : ids) a.push_str(id);
    });
  });
}

// ids[from, from + kChunk)
template <class T>
std::span<const T> chunk(std::span<const T> ids, std::size_t from) {
  return ids.subspan(from, std::min(kChunk, ids.size() - from));
}

// fn(document) for every document of `collection` whose _id is in `ids`:
// one $in query per kChunk ids, or one {_id: id} query each where the
// server looks documents up no other way (Client::lookups_one_by_one).
template <class T>
Status find_ids(Client& client, const char* collection, std::span<const T> ids, const bson_t* opts,
                const std::function<void(const View&)>& fn, std::string_view what) {
  bool one_by_one = false;
  if (Status s = client.lookups_one_by_one(one_by_one); !s) return s;
  for (std::size_t from = 0; from < ids.size(); from += one_by_one ? 1 : kChunk) {
    Doc filter;
    if (one_by_one) filter.str("_id", ids[from]);
    else id_in(filter, chunk(ids, from));
    if (Status s = client.find(collection, filter.bson(), opts, fn, what); !s) return s;
  }
  return Status::ok();
}

// A pending entry's field name under `pending`: the transfer id with '%',
// '.', '$' and NUL escaped (field names may hold none of the last three).
std::string pending_key(std::string_view transfer_id);
std::string pending_id(std::string_view key);  // the inverse
// A leg's _id: unambiguous for any ids ("<length>:<transfer>|<account>|kind").
std::string leg_id(std::string_view transfer_id, std::string_view account_id, std::string_view kind);
// The journal's unique change key of change `seq` of an account.
std::string change_key(std::string_view account_id, std::int64_t seq);

void read_account(const View& v, Account& a);
Status read_transfer(const std::string& store, const View& v, TransferDoc& d);

}  // namespace sagapool::mongo
