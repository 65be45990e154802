#pragma once
// What a worker last knew of the accounts its walks across stores moved
// (SagaEngine::walk_across): their balances as its own walk left them, and
// the rest of the row as last read. A guess, never trusted: the walk's
// moves stand only where the rows as locked still give its verdicts
// (BalanceMove), so a balance moved since by another worker costs nothing
// unless a verdict changes, and then the batch runs again, read locked.
// It saves each batch reading back the accounts it moved a batch ago.
//
// Bounded: a fixed table of slots, allocated at the first put; an id probes
// a few slots from its hash and, with none free, takes its first, so a
// ledger larger than the table keeps the accounts walked most recently.
#include <cstddef>
#include <string_view>
#include <vector>

#include "sagapool/domain.hpp"

namespace sagapool {

class AccountCache {
 public:
  // `slots`: a power of two.
  explicit AccountCache(std::size_t slots) : slots_(slots) {}

  // The account as last put, or null. `hash`: std::hash of the id.
  const Account* find(std::string_view id, std::size_t hash) const;
  // id's slot, valid from here, for the caller to fill in.
  Account& put(std::string_view id, std::size_t hash);
  void forget(std::string_view id, std::size_t hash);

 private:
  static constexpr std::size_t kProbes = 8;
  struct Entry {
    Account account;     // an empty id: a slot never used (no account has one)
    bool valid = false;  // false once forgotten; the id stays, so a put finds its slot again
  };
  struct Probe {
    std::size_t slot;
    bool found;  // id is there
  };
  // Where id is, else where it would go: the first free slot probed, or
  // with none free the first probed.
  Probe probe(std::string_view id, std::size_t hash) const;
  std::size_t slots_;
  std::vector<Entry> table_;
};

}  // namespace sagapool
