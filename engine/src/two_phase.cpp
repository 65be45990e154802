#include "sagapool/two_phase.hpp"

#include <algorithm>
#include <random>

#include "sagapool/failpoints.hpp"
#include "sagapool/log.hpp"

namespace sagapool {

namespace {

// PostgreSQL limits a prepared transaction's name to 199 bytes.
constexpr std::size_t kOwnerInName = 120;

std::string name_prefix(std::string_view owner) {
  std::random_device rd;
  const std::uint64_t nonce = (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
  return std::string(kBatchGidPrefix) + std::string(owner.substr(0, kOwnerInName)) + ":" +
         std::to_string(nonce) + ":";
}

}  // namespace

TwoPhaseBatch::TwoPhaseBatch(Ledger& ledger, std::string_view owner)
    : ledger_(ledger), prefix_(name_prefix(owner)) {}

bool TwoPhaseBatch::possible(Ledger& ledger) {
  if (ledger.shard_count() < 2) return false;
  for (std::size_t s = 0; s < ledger.shard_count(); ++s) {
    if (!ledger.shard(s).supports_scope() || !ledger.shard(s).supports_prepare()) return false;
  }
  return true;
}

Status TwoPhaseBatch::begin() {
  if (in_doubt_) {
    if (Status s = resolve_in_doubt(); !s) return s;
  }
  gid_ = prefix_ + std::to_string(++next_);
  Store& first = ledger_.transfers();
  Status s = first.begin_scope();
  if (s) s = first.record_decision(gid_);
  if (s && !forget_.empty()) s = first.forget_decisions(forget_);
  forget_.clear();  // if this scope fails they stay, for resolve_prepared
  for (std::size_t i = 1; s && i < ledger_.shard_count(); ++i) s = ledger_.shard(i).begin_scope();
  if (!s) rollback();
  return s;
}

void TwoPhaseBatch::rollback() {
  // The first store first: once its scope is gone the decision can never
  // commit, so the others may roll back in any order.
  for (std::size_t i = 0; i < ledger_.shard_count(); ++i) ledger_.shard(i).end_scope(false).ignore();
}

Status TwoPhaseBatch::commit() {
  for (std::size_t i = 1; i < ledger_.shard_count(); ++i) {
    if (Status s = ledger_.shard(i).prepare_scope(gid_); !s) {
      rollback();  // the decision is gone with the first store's scope: an abort
      if (!finish_others(false)) in_doubt_ = true;
      return s;
    }
  }
  if (Status fp = SAGA_FAILPOINT("after_prepare"); !fp) {
    rollback();
    if (!finish_others(false)) in_doubt_ = true;
    return fp;
  }
  if (Status s = ledger_.transfers().end_scope(true); !s) {
    // Committed or not: the decision says, once the first store answers.
    ledger_.transfers().end_scope(false).ignore();
    in_doubt_ = true;
    if (resolve_in_doubt()) return s.kind() == ErrorKind::fatal ? s : Status::retry_stage(s.message());
    return s;
  }
  if (Status fp = SAGA_FAILPOINT("after_commit_point"); !fp) {
    in_doubt_ = true;  // committed; the others are finished by whoever resolves it
    return Status::ok();
  }
  if (!finish_others(true)) {
    in_doubt_ = true;
    return Status::ok();
  }
  forget_.push_back(gid_);
  return Status::ok();
}

// Finishes gid_ on every other store; false if one could not be reached.
Status TwoPhaseBatch::finish_others(bool commit) {
  Status result;
  for (std::size_t i = 1; i < ledger_.shard_count(); ++i) {
    if (Status s = ledger_.shard(i).finish_prepared(gid_, commit); !s && result) result = s;
  }
  return result;
}

Status TwoPhaseBatch::resolve_in_doubt() {
  bool committed = false;
  if (Status s = ledger_.transfers().decide(gid_, committed); !s) return s;
  if (Status s = finish_others(committed); !s) return s;
  in_doubt_ = false;
  forget_.push_back(gid_);
  return Status::ok();
}

Status resolve_prepared(Ledger& ledger, std::int64_t min_age_ms, ResolveCounts& out) {
  out = {};
  Store& first = ledger.transfers();
  std::vector<std::string> gids;
  for (std::size_t i = 1; i < ledger.shard_count(); ++i) {
    Store& store = ledger.shard(i);
    if (Status s = store.list_prepared(kBatchGidPrefix, min_age_ms, gids); !s) return s;
    for (const std::string& gid : gids) {
      bool committed = false;
      if (Status s = first.decide(gid, committed); !s) return s;
      if (Status s = store.finish_prepared(gid, committed); !s) return s;
      ++(committed ? out.committed : out.rolled_back);
      log_event(spdlog::level::warn, "finished a batch's transaction its worker left prepared",
                {{"gid", gid}, {"store", store.display_name()}, {"outcome", committed ? "committed" : "rolled back"}});
    }
  }
  // Decisions first, then what is prepared: a decision read here was
  // committed before any prepare that is not listed is missing for good.
  std::vector<std::string> decided;
  if (Status s = first.list_decisions(min_age_ms, 1000, decided); !s) return s;
  if (decided.empty()) return Status::ok();
  std::vector<std::string> prepared;
  for (std::size_t i = 1; i < ledger.shard_count(); ++i) {
    if (Status s = ledger.shard(i).list_prepared(kBatchGidPrefix, 0, gids); !s) return s;
    prepared.insert(prepared.end(), gids.begin(), gids.end());
  }
  std::sort(prepared.begin(), prepared.end());
  std::erase_if(decided, [&](const std::string& g) { return std::binary_search(prepared.begin(), prepared.end(), g); });
  if (decided.empty()) return Status::ok();
  if (Status s = first.forget_decisions(decided); !s) return s;
  out.forgotten = decided.size();
  return Status::ok();
}

}  // namespace sagapool
