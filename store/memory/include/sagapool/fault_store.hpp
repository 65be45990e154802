#pragma once
// A Store that forwards to another and lets the simulation act around every
// call: report a transient error instead of the call (before: the call is
// not made) or after it (the call was made, its result lost, as when a
// connection drops after COMMIT), "crash" the simulated process (throw
// SimCrash, which unwinds the engine to the simulation's loop), or run other
// actors before going on (a pause: other workers and the operator act, the
// clock may pass the lease).
#include <memory>
#include <string>
#include <string_view>

#include "sagapool/store.hpp"

namespace sagapool::sim {

// Thrown by hooks: the simulated process dies at this point. Nothing after it
// runs; its connections are dropped (an open scope rolls back).
struct SimCrash {
  std::string where;
};

enum class Phase : std::uint8_t { before, after };

class FaultHooks {
 public:
  virtual ~FaultHooks() = default;
  // Around every call: `op` names it (the Store method; end_scope is
  // "commit" or "rollback"); `in_scope` says whether this connection holds a
  // scope at this point. Returns ok to go on, or the error the call reports.
  // May throw SimCrash. `after` is called only when the call succeeded.
  virtual Status on_call(std::string_view op, Phase phase, bool in_scope) = 0;
};

class FaultStore final : public Store {
 public:
  FaultStore(std::unique_ptr<Store> inner, FaultHooks& hooks)
      : inner_(std::move(inner)), hooks_(hooks) {}

  const std::string& display_name() const noexcept override { return inner_->display_name(); }
  // Whether this connection holds a scope (as far as the calls made show).
  bool in_scope() const noexcept { return in_scope_; }
  bool supports_scope() const noexcept override { return inner_->supports_scope(); }
  bool concurrent_scopes() const noexcept override { return inner_->concurrent_scopes(); }

  Status init_schema() override {
    return call("init_schema", [&] { return inner_->init_schema(); });
  }
  Status contract_schema() override {
    return call("contract_schema", [&] { return inner_->contract_schema(); });
  }
  Status read_topology(std::optional<Topology>& out) override {
    return call("read_topology", [&] { return inner_->read_topology(out); });
  }
  Status write_topology(const Topology& t) override {
    return call("write_topology", [&] { return inner_->write_topology(t); });
  }
  Status now_ms(std::int64_t& out) override { return inner_->now_ms(out); }

  Status begin_scope() override {
    if (Status s = hooks_.on_call("begin_scope", Phase::before, false); !s) return s;
    Status r = inner_->begin_scope();
    if (!r) return r;
    in_scope_ = true;
    return hooks_.on_call("begin_scope", Phase::after, true);
  }
  Status end_scope(bool commit) override {
    const char* op = commit ? "commit" : "rollback";
    if (Status s = hooks_.on_call(op, Phase::before, in_scope_); !s) return s;
    Status r = inner_->end_scope(commit);
    in_scope_ = false;
    if (!r) return r;
    return hooks_.on_call(op, Phase::after, false);
  }

  Status insert_transfers(std::span<const NewTransfer> batch, std::string_view owner,
                          std::int64_t lease_ms, std::span<InsertResult> results) override {
    return call("insert_transfers",
                [&] { return inner_->insert_transfers(batch, owner, lease_ms, results); });
  }
  Status transition(std::span<const Transition> batch, std::int64_t lease_ms,
                    std::span<std::uint8_t> applied, std::int64_t* at_ms) override {
    return call("transition", [&] { return inner_->transition(batch, lease_ms, applied, at_ms); });
  }
  Status claim_expired(std::string_view owner, std::int64_t lease_ms, std::size_t limit,
                       std::vector<TransferDoc>& out) override {
    return call("claim_expired", [&] { return inner_->claim_expired(owner, lease_ms, limit, out); });
  }
  Status take_over(std::string_view id, std::string_view owner, std::int64_t lease_ms,
                   std::optional<TransferDoc>& out) override {
    return call("take_over", [&] { return inner_->take_over(id, owner, lease_ms, out); });
  }
  Status mark_notified(std::span<const std::string_view> ids) override {
    return call("mark_notified", [&] { return inner_->mark_notified(ids); });
  }
  Status load_transfer(std::string_view id, std::optional<TransferDoc>& out) override {
    return call("load_transfer", [&] { return inner_->load_transfer(id, out); });
  }
  Status list_stale(std::int64_t before_ms, std::size_t limit,
                    std::vector<TransferDoc>& out) override {
    return call("list_stale", [&] { return inner_->list_stale(before_ms, limit, out); });
  }
  Status state_stats(StateStatsTable& out) override {
    return call("state_stats", [&] { return inner_->state_stats(out); });
  }
  Status scan_transfer_states(
      const std::function<void(std::string_view, TransferState, bool)>& fn) override {
    return call("scan_transfer_states", [&] { return inner_->scan_transfer_states(fn); });
  }
  Status apply_legs(std::span<const LegRequest> batch, std::span<LegResult> results) override {
    return call("apply_legs", [&] { return inner_->apply_legs(batch, results); });
  }
  Status create_accounts(std::span<const Account> accounts) override {
    return call("create_accounts", [&] { return inner_->create_accounts(accounts); });
  }
  Status load_account(std::string_view id, std::optional<Account>& out) override {
    return call("load_account", [&] { return inner_->load_account(id, out); });
  }
  Status load_accounts(std::span<const std::string_view> ids,
                       std::span<std::optional<Account>> out) override {
    return call("load_accounts", [&] { return inner_->load_accounts(ids, out); });
  }
  Status read_accounts(std::span<const std::string_view> ids,
                       std::span<std::optional<Account>> out) override {
    return call("read_accounts", [&] { return inner_->read_accounts(ids, out); });
  }
  Status set_locked(std::string_view id, bool locked, bool& found) override {
    return call("set_locked", [&] { return inner_->set_locked(id, locked, found); });
  }
  Status postings_for_transfer(std::string_view transfer_id, std::vector<Posting>& out) override {
    return call("postings_for_transfer", [&] { return inner_->postings_for_transfer(transfer_id, out); });
  }
  Status postings_for_account(std::string_view account_id, std::size_t limit,
                              std::vector<Posting>& out) override {
    return call("postings_for_account",
                [&] { return inner_->postings_for_account(account_id, limit, out); });
  }
  Status pending_for_account(std::string_view account_id,
                             std::vector<std::string>& transfer_ids) override {
    return call("pending_for_account",
                [&] { return inner_->pending_for_account(account_id, transfer_ids); });
  }
  Status scan_accounts(const std::function<void(const Account&)>& fn) override {
    return call("scan_accounts", [&] { return inner_->scan_accounts(fn); });
  }
  Status scan_postings(const std::function<void(const Posting&)>& fn) override {
    return call("scan_postings", [&] { return inner_->scan_postings(fn); });
  }
  Status scan_pending(const std::function<void(const PendingEntry&)>& fn) override {
    return call("scan_pending", [&] { return inner_->scan_pending(fn); });
  }
  Status register_worker(const WorkerRecord& w) override {
    return call("register_worker", [&] { return inner_->register_worker(w); });
  }
  Status deregister_worker(std::string_view worker_id) override {
    return call("deregister_worker", [&] { return inner_->deregister_worker(worker_id); });
  }
  Status list_workers(std::vector<WorkerRecord>& out) override {
    return call("list_workers", [&] { return inner_->list_workers(out); });
  }
  Status recent_owners(std::int64_t since_ms, std::vector<std::string>& out) override {
    return call("recent_owners", [&] { return inner_->recent_owners(since_ms, out); });
  }

  bool supports_prepare() const noexcept override { return inner_->supports_prepare(); }
  Status write_walk(std::span<const WalkPosting> postings, std::span<const WalkVoid> voids,
                    std::span<const BalanceMove> balances) override {
    return call("write_walk", [&] { return inner_->write_walk(postings, voids, balances); });
  }
  Status prepare_scope(std::string_view gid) override {
    if (Status s = hooks_.on_call("prepare", Phase::before, in_scope_); !s) return s;
    Status r = inner_->prepare_scope(gid);
    in_scope_ = false;
    if (!r) return r;
    return hooks_.on_call("prepare", Phase::after, false);
  }
  Status finish_prepared(std::string_view gid, bool commit) override {
    return call("finish_prepared", [&] { return inner_->finish_prepared(gid, commit); });
  }
  Status list_prepared(std::string_view prefix, std::int64_t min_age_ms, std::vector<std::string>& gids) override {
    return call("list_prepared", [&] { return inner_->list_prepared(prefix, min_age_ms, gids); });
  }
  Status prepared_stats(std::string_view prefix, PreparedStats& out) override {
    return call("prepared_stats", [&] { return inner_->prepared_stats(prefix, out); });
  }
  Status record_decision(std::string_view gid) override {
    return call("record_decision", [&] { return inner_->record_decision(gid); });
  }
  Status decide(std::string_view gid, bool& committed) override {
    return call("decide", [&] { return inner_->decide(gid, committed); });
  }
  Status list_decisions(std::int64_t min_age_ms, std::size_t limit, std::vector<std::string>& gids) override {
    return call("list_decisions", [&] { return inner_->list_decisions(min_age_ms, limit, gids); });
  }
  Status forget_decisions(std::span<const std::string> gids) override {
    return call("forget_decisions", [&] { return inner_->forget_decisions(gids); });
  }

 private:
  template <typename Call>
  Status call(std::string_view op, Call&& inner_call) {
    if (Status s = hooks_.on_call(op, Phase::before, in_scope_); !s) return s;
    Status r = inner_call();
    if (!r) return r;
    return hooks_.on_call(op, Phase::after, in_scope_);
  }

  std::unique_ptr<Store> inner_;
  FaultHooks& hooks_;
  bool in_scope_ = false;
};

}  // namespace sagapool::sim
