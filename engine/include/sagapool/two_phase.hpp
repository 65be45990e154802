#pragma once
// A batch across several stores as one transaction on each, made atomic by
// two-phase commit (docs/design-additions.md, "A batch across stores").
//
// The first store records the batch's decision inside its scope, before any
// other store prepares; its COMMIT is the commit point. A prepared
// transaction that its worker left (a crash or a pause between prepare and
// finish) is finished by resolve_prepared, as the first store's decision
// says: Store::decide waits for a scope still open that recorded it, and
// records an abort where none committed, so that it never can.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sagapool/ledger.hpp"
#include "sagapool/status.hpp"

namespace sagapool {

// Every prepared transaction of a batch is named with this prefix.
inline constexpr std::string_view kBatchGidPrefix = "saga:";

class TwoPhaseBatch {
 public:
  // `owner` names the worker in the batches' names; a random number drawn
  // here keeps a restarted worker's names apart from its earlier ones.
  TwoPhaseBatch(Ledger& ledger, std::string_view owner);

  // Whether the ledger's batches can run this way: several stores, each
  // with scopes that can be prepared.
  static bool possible(Ledger& ledger);

  // Opens a scope on every store, the first recording the decision of a
  // new batch name (riding with its next statement). A batch whose commit
  // point was left in doubt is first resolved, or this fails.
  Status begin();
  // Prepares every other store's scope, then commits the first. Before the
  // commit point any failure rolls every store back (an error); after it,
  // a store not finished is left to resolve_prepared (ok). When the first
  // store's COMMIT fails, its decision says whether it happened.
  Status commit();
  // Rolls back every store's scope (before commit).
  void rollback();

 private:
  Status resolve_in_doubt();
  Status finish_others(bool commit);

  Ledger& ledger_;
  std::string prefix_;  // kBatchGidPrefix, the owner and the random number
  std::uint64_t next_ = 0;
  std::string gid_;
  bool in_doubt_ = false;  // gid_'s commit point has an unknown outcome
  std::vector<std::string> forget_;  // decided and finished: forgotten with the next batch
};

struct ResolveCounts {
  std::size_t committed = 0;
  std::size_t rolled_back = 0;
  std::size_t forgotten = 0;
};

// Finishes the batches' prepared transactions on the stores after the
// first that were prepared at least `min_age_ms` ago, each as the first
// store's decision says; then forgets decisions older than `min_age_ms`
// that no store holds prepared any more (a prepare always comes before its
// decision's commit, so none can follow).
Status resolve_prepared(Ledger& ledger, std::int64_t min_age_ms, ResolveCounts& out);

}  // namespace sagapool
