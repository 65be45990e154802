#include "sagapool/audit.hpp"

#include <unordered_map>

#include "sagapool/json_text.hpp"

namespace sagapool {
namespace {

struct TransferFacts {
  TransferState state = TransferState::initial;
  bool known = false;  // present in the transfer store
  std::uint8_t kinds = 0;
  std::uint8_t duplicate_kinds = 0;
  Wide net = 0;
  std::string debit_account;  // where its debit posted, if it did
  std::int64_t debit_amount = 0;
};

constexpr std::uint8_t bit(PostingKind k) { return static_cast<std::uint8_t>(1u << static_cast<unsigned>(k)); }
constexpr std::uint8_t kDebit = bit(PostingKind::debit);
constexpr std::uint8_t kCredit = bit(PostingKind::credit);
constexpr std::uint8_t kReverse = bit(PostingKind::reverse_debit);

// Invariant 4 for one transfer: which posting sets each state allows.
bool postings_allowed(TransferState s, std::uint8_t kinds) {
  switch (s) {
    case TransferState::done:
    case TransferState::applied: return kinds == (kDebit | kCredit);
    case TransferState::canceled: return kinds == 0 || kinds == (kDebit | kReverse);
    case TransferState::initial:
    case TransferState::pending:
      return kinds == 0 || kinds == kDebit || kinds == (kDebit | kCredit);
    case TransferState::canceling:
      return kinds == 0 || kinds == kDebit || kinds == (kDebit | kReverse) ||
             kinds == (kDebit | kCredit);
  }
  return false;
}

std::string kinds_text(std::uint8_t kinds) {
  std::string out;
  for (PostingKind k : {PostingKind::debit, PostingKind::credit, PostingKind::reverse_debit}) {
    if (kinds & bit(k)) out += (out.empty() ? "" : "+") + std::string(to_string(k));
  }
  return out.empty() ? "none" : out;
}

class CheckBuilder {
 public:
  CheckBuilder(int invariant, std::string name, std::size_t max_examples)
      : max_(max_examples) {
    check_.invariant = invariant;
    check_.name = std::move(name);
  }
  void fail(const std::string& where) {
    check_.ok = false;
    ++failures_;
    if (check_.examples.size() < max_) check_.examples.push_back(where);
  }
  AuditCheck done(std::string detail) {
    check_.detail = std::move(detail);
    if (failures_ > check_.examples.size()) {
      check_.detail += " (" + std::to_string(failures_) + " failures, first " +
                       std::to_string(check_.examples.size()) + " shown)";
    }
    return std::move(check_);
  }

 private:
  AuditCheck check_;
  std::size_t max_;
  std::size_t failures_ = 0;
};

}  // namespace

std::string to_decimal(Wide v) {
  if (v == 0) return "0";
  const bool neg = v < 0;
  UWide u = neg ? static_cast<UWide>(-(v + 1)) + 1 : static_cast<UWide>(v);
  std::string s;
  while (u != 0) {
    s.insert(s.begin(), static_cast<char>('0' + static_cast<int>(u % 10)));
    u /= 10;
  }
  return neg ? "-" + s : s;
}

bool AuditReport::ok() const {
  for (const AuditCheck& c : checks) {
    if (!c.ok) return false;
  }
  return true;
}

Status run_audit(Ledger& ledger, const AuditOptions& options, AuditReport& out) {
  out = AuditReport{};
  std::unordered_map<std::string, TransferFacts> transfers;
  Status s = ledger.transfers().scan_transfer_states(
      [&](std::string_view id, TransferState state, bool notified) {
        TransferFacts& f = transfers[std::string(id)];
        f.state = state;
        f.known = true;
        ++out.transfers;
        if (!is_terminal(state)) ++out.in_flight;
        else if (!notified) ++out.unpublished;
      });
  if (!s) return s;

  CheckBuilder minimum(2, "no balance below its account's min_balance", options.max_examples);
  CheckBuilder journal(3, "every balance == opening + sum of its postings", options.max_examples);
  CheckBuilder reservation(3, "every reserved == its pending debits, balance + reserved <= INT64_MAX",
                           options.max_examples);
  CheckBuilder legs(4, "postings per transfer match its state", options.max_examples);
  CheckBuilder pending(5, "no pending entry names a terminal transfer", options.max_examples);
  std::size_t misplaced = 0;

  for (std::size_t shard = 0; shard < ledger.shard_count(); ++shard) {
    Store& store = ledger.shard(shard);
    std::unordered_map<std::string, Wide> sums;
    s = store.scan_postings([&](const Posting& p) {
      ++out.postings;
      const Wide v = signed_amount(p.kind, p.amount);
      sums[p.account_id] += v;
      TransferFacts& f = transfers[p.transfer_id];
      if (f.kinds & bit(p.kind)) f.duplicate_kinds |= bit(p.kind);
      f.kinds |= bit(p.kind);
      f.net += v;
      if (p.kind == PostingKind::debit) {
        f.debit_account = p.account_id;
        f.debit_amount = p.amount;
      }
    });
    if (!s) return s;
    // A pending entry of a posted debit reserves its amount on its account.
    std::unordered_map<std::string, Wide> reserved;
    s = store.scan_pending([&](const PendingEntry& e) {
      const auto it = transfers.find(e.transfer_id);
      if (it == transfers.end()) return;
      if (it->second.known && is_terminal(it->second.state)) {
        pending.fail(e.account_id + " lists " + std::string(to_string(it->second.state)) +
                     " transfer " + e.transfer_id);
      }
      if (it->second.debit_account == e.account_id) reserved[e.account_id] += it->second.debit_amount;
    });
    if (!s) return s;
    s = store.scan_accounts([&](const Account& a) {
      ++out.accounts;
      out.total_balance += a.balance;
      out.total_opening += a.opening_balance;
      if (ledger.shard_index(a.id) != shard) ++misplaced;
      if (a.balance < a.min_balance) {
        minimum.fail(a.id + ": balance " + std::to_string(a.balance) + " < min_balance " +
                     std::to_string(a.min_balance));
      }
      const auto it = sums.find(a.id);
      const Wide posted = it == sums.end() ? 0 : it->second;
      if (static_cast<Wide>(a.opening_balance) + posted != a.balance) {
        journal.fail(a.id + ": balance " + std::to_string(a.balance) + " != opening " +
                     std::to_string(a.opening_balance) + " + postings " + to_decimal(posted));
      }
      if (it != sums.end()) sums.erase(it);
      const auto r = reserved.find(a.id);
      const Wide want = r == reserved.end() ? 0 : r->second;
      if (a.reserved != want) {
        reservation.fail(a.id + ": reserved " + std::to_string(a.reserved) + " != pending debits " +
                         to_decimal(want));
      }
      if (static_cast<Wide>(a.balance) + a.reserved > INT64_MAX) {
        reservation.fail(a.id + ": balance " + std::to_string(a.balance) + " + reserved " +
                         std::to_string(a.reserved) + " > INT64_MAX: a reversal could overflow");
      }
    });
    if (!s) return s;
    for (const auto& [account, sum] : sums) {
      journal.fail(account + ": postings of " + to_decimal(sum) + " on an account that does not exist on " +
                   store.display_name());
    }
  }

  for (const auto& [id, f] : transfers) {
    if (!f.known) {
      legs.fail(id + ": postings (" + kinds_text(f.kinds) + ") for a transfer that does not exist");
      continue;
    }
    if (f.duplicate_kinds != 0) {
      legs.fail(id + ": more than one " + kinds_text(f.duplicate_kinds) + " posting");
    }
    if (!postings_allowed(f.state, f.kinds)) {
      legs.fail(id + ": state " + std::string(to_string(f.state)) + " with postings " +
                kinds_text(f.kinds));
    }
    if (is_terminal(f.state) && f.net != 0) {
      legs.fail(id + ": terminal transfer's postings net to " + to_decimal(f.net));
    }
    if (!is_terminal(f.state)) out.in_flight_net += f.net;
  }

  const Wide imbalance = out.total_balance - out.total_opening - out.in_flight_net;
  CheckBuilder conservation(1, "conservation: sum of balances == sum of opening balances + in-flight legs",
                            options.max_examples);
  if (imbalance != 0) conservation.fail("imbalance of " + to_decimal(imbalance) + " minor units");
  if (misplaced != 0) {
    conservation.fail(std::to_string(misplaced) + " accounts on the wrong shard for the placement hash");
  }
  out.checks.push_back(conservation.done(
      "balances " + to_decimal(out.total_balance) + " = opening " + to_decimal(out.total_opening) +
      " + in-flight " + to_decimal(out.in_flight_net) + " over " + std::to_string(out.accounts) +
      " accounts on " + std::to_string(ledger.shard_count()) + " store(s)"));
  out.checks.push_back(minimum.done(std::to_string(out.accounts) + " accounts checked"));
  out.checks.push_back(journal.done(std::to_string(out.postings) + " postings summed per account"));
  out.checks.push_back(reservation.done(std::to_string(out.accounts) +
                                        " accounts' reservations checked against their pending debits"));
  out.checks.push_back(legs.done(std::to_string(out.transfers) + " transfers checked"));
  out.checks.push_back(pending.done("pending entries checked against transfer states; " +
                                    std::to_string(out.unpublished) +
                                    " terminal outcomes not yet published"));

  CheckBuilder stuck(6, "nothing non-terminal longer than the stuck threshold", options.max_examples);
  std::int64_t now = 0;
  if (s = ledger.transfers().now_ms(now); !s) return s;
  std::vector<TransferDoc> stale;
  if (s = ledger.transfers().list_stale(now - options.stuck_after_ms, options.max_examples, stale); !s) {
    return s;
  }
  for (const TransferDoc& d : stale) {
    stuck.fail(d.id + ": " + std::string(to_string(d.state)) + " since " +
               std::to_string((now - d.last_modified_ms) / 1000) + "s (owner " + d.owner + ")");
  }
  out.checks.push_back(stuck.done(std::to_string(out.in_flight) + " in flight; threshold " +
                                  std::to_string(options.stuck_after_ms / 1000) + "s"));
  return Status::ok();
}

std::string AuditReport::to_text() const {
  std::string out;
  for (const AuditCheck& c : checks) {
    out += c.ok ? "ok   " : "FAIL ";
    out += std::to_string(c.invariant) + ". " + c.name + ": " + c.detail + "\n";
    for (const std::string& e : c.examples) out += "       - " + e + "\n";
  }
  out += ok() ? "audit passed\n" : "audit FAILED\n";
  return out;
}

std::string AuditReport::to_json() const {
  std::string out = "{\"ok\":";
  out += ok() ? "true" : "false";
  out += ",\"accounts\":" + std::to_string(accounts) + ",\"transfers\":" + std::to_string(transfers) +
         ",\"postings\":" + std::to_string(postings) + ",\"in_flight\":" + std::to_string(in_flight) +
         ",\"unpublished\":" + std::to_string(unpublished) + ",\"total_balance\":" +
         to_decimal(total_balance) + ",\"total_opening\":" + to_decimal(total_opening) +
         ",\"in_flight_net\":" + to_decimal(in_flight_net) + ",\"checks\":[";
  for (std::size_t i = 0; i < checks.size(); ++i) {
    const AuditCheck& c = checks[i];
    out += i ? "," : "";
    out += "{\"invariant\":" + std::to_string(c.invariant) + ",\"name\":\"";
    append_json_escaped(out, c.name);
    out += "\",\"ok\":" + std::string(c.ok ? "true" : "false") + ",\"detail\":\"";
    append_json_escaped(out, c.detail);
    out += "\",\"examples\":[";
    for (std::size_t k = 0; k < c.examples.size(); ++k) {
      out += k ? ",\"" : "\"";
      append_json_escaped(out, c.examples[k]);
      out += "\"";
    }
    out += "]}";
  }
  out += "]}";
  return out;
}

}  // namespace sagapool
