// `transfer show`, `stuck`, `retry`, `cancel`.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>
#include <memory>
#include <optional>
#include <vector>

#include "commands.hpp"
#include "sagapool/config.hpp"
#include "json_writer.hpp"
#include "sagapool/operator_actions.hpp"

namespace sagapool::ctl {
namespace {

std::string pad(std::string s, std::size_t width) {
  if (s.size() < width) s.resize(width, ' ');
  return s;
}

std::string lease_text(std::int64_t lease_until_ms, std::int64_t now_ms) {
  if (lease_until_ms <= 0) return "-";
  const std::string at = format_time_ms(lease_until_ms);
  return lease_until_ms < now_ms ? at + " (expired " + format_duration_ms(now_ms - lease_until_ms) + " ago)"
                                 : at + " (in " + format_duration_ms(lease_until_ms - now_ms) + ")";
}

// The postings of a transfer live on the stores of its two accounts.
Status transfer_postings(Ledger& ledger, const TransferDoc& d, std::vector<Posting>& out) {
  out.clear();
  std::vector<std::size_t> shards{ledger.shard_index(d.source)};
  if (ledger.shard_index(d.destination) != shards.front()) {
    shards.push_back(ledger.shard_index(d.destination));
  }
  std::vector<Posting> part;
  for (std::size_t s : shards) {
    if (Status st = ledger.shard(s).postings_for_transfer(d.id, part); !st) return st;
    out.insert(out.end(), part.begin(), part.end());
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Posting& a, const Posting& b) { return a.at_ms < b.at_ms; });
  return Status::ok();
}

struct Event {
  std::int64_t at_ms;
  std::string what;
};

// A short history derived from the document's times and the postings.
std::vector<Event> history(const TransferDoc& d, const std::vector<Posting>& postings) {
  std::vector<Event> ev;
  if (d.requested_at_ms > 0) ev.push_back({d.requested_at_ms, "requested (Kafka timestamp)"});
  ev.push_back({d.created_at_ms, "created (state initial, epoch 1)"});
  for (const Posting& p : postings) {
    const std::int64_t v = signed_amount(p.kind, p.amount);
    ev.push_back({p.at_ms, std::string(to_string(p.kind)) + " posted on " + p.account_id + ": " +
                               (v > 0 ? "+" : "") + std::to_string(v)});
  }
  if (is_terminal(d.state) && d.finished_at_ms > 0) {
    std::string what = "finished: " + std::string(to_string(d.state));
    if (d.reason != Reason::none) what += " (" + std::string(to_string(d.reason)) + ")";
    what += d.notified ? "; outcome published" : "; outcome not yet published";
    ev.push_back({d.finished_at_ms, what});
  } else {
    ev.push_back({d.last_modified_ms, "last modified: now " + std::string(to_string(d.state)) +
                                          (d.reason != Reason::none
                                               ? " (" + std::string(to_string(d.reason)) + ")"
                                               : "")});
  }
  std::stable_sort(ev.begin(), ev.end(), [](const Event& a, const Event& b) { return a.at_ms < b.at_ms; });
  return ev;
}

void print_transfer_json(const TransferDoc& d, const std::vector<Posting>& postings) {
  JsonWriter j;
  j.object()
      .string("id", d.id)
      .string("state", to_string(d.state))
      .string_or_null("reason", d.reason == Reason::none ? std::string_view() : to_string(d.reason))
      .string("from", d.source)
      .string("to", d.destination)
      .number("amount", d.amount)
      .string_or_null("currency", d.currency)
      .raw("metadata", d.metadata.empty() ? std::string_view("null") : std::string_view(d.metadata))
      .string("owner", d.owner)
      .number("epoch", d.epoch)
      .time("lease_until", d.lease_until_ms)
      .number("attempts", d.attempts)
      .time("created_at", d.created_at_ms)
      .time("requested_at", d.requested_at_ms)
      .time("last_modified_at", d.last_modified_ms)
      .time("finished_at", d.finished_at_ms)
      .raw("published", is_terminal(d.state) ? (d.notified ? "true" : "false") : "null");
  if (d.origin.topic.empty()) {
    j.raw("origin", "null");
  } else {
    j.object("origin")
        .string("topic", d.origin.topic)
        .number("partition", d.origin.partition)
        .number("offset", d.origin.offset)
        .end();
  }
  j.array("postings");
  for (const Posting& p : postings) {
    j.object()
        .time("at", p.at_ms)
        .string("kind", to_string(p.kind))
        .string("account", p.account_id)
        .number("amount", signed_amount(p.kind, p.amount))
        .end();
  }
  std::cout << j.end().end().text() << '\n';
}

int show_transfer(Ledger& ledger, const std::string& id, bool json) {
  std::optional<TransferDoc> doc;
  if (Status s = ledger.transfers().load_transfer(id, doc); !s) return fail(s);
  if (!doc) return fail(kExitNotFound, "no transfer " + id + " on " + ledger.transfers().display_name());
  std::int64_t now = 0;
  if (Status s = ledger.transfers().now_ms(now); !s) return fail(s);
  std::vector<Posting> postings;
  if (Status s = transfer_postings(ledger, *doc, postings); !s) return fail(s);
  if (json) {
    print_transfer_json(*doc, postings);
    return kExitOk;
  }

  const TransferDoc& d = *doc;
  std::cout << "transfer      " << d.id << '\n'
            << "state         " << to_string(d.state)
            << (d.reason != Reason::none ? " (" + std::string(to_string(d.reason)) + ")" : "") << '\n'
            << "from          " << d.source << "  [" << describe_shard(ledger, ledger.shard_index(d.source))
            << "]\n"
            << "to            " << d.destination << "  ["
            << describe_shard(ledger, ledger.shard_index(d.destination)) << "]\n"
            << "amount        " << d.amount << '\n'
            << "currency      " << (d.currency.empty() ? "(none requested)" : d.currency) << '\n'
            << "metadata      " << (d.metadata.empty() ? "-" : d.metadata) << '\n'
            << "owner         " << d.owner << " (epoch " << d.epoch << ")\n"
            << "lease until   " << lease_text(d.lease_until_ms, now) << '\n'
            << "attempts      " << d.attempts << '\n'
            << "created       " << format_time_ms(d.created_at_ms) << '\n'
            << "requested     " << format_time_ms(d.requested_at_ms) << '\n'
            << "last modified " << format_time_ms(d.last_modified_ms) << '\n'
            << "finished      " << format_time_ms(d.finished_at_ms) << '\n'
            << "published     " << (is_terminal(d.state) ? (d.notified ? "yes" : "not yet") : "-") << '\n'
            << "origin        ";
  if (d.origin.topic.empty()) {
    std::cout << "-\n";
  } else {
    std::cout << d.origin.topic << " partition " << d.origin.partition << " offset " << d.origin.offset
              << '\n';
  }
  std::cout << "postings      " << (postings.empty() ? "none" : std::to_string(postings.size())) << '\n';
  for (const Posting& p : postings) {
    const std::int64_t v = signed_amount(p.kind, p.amount);
    std::cout << "  " << format_time_ms(p.at_ms) << "  " << pad(std::string(to_string(p.kind)), 14)
              << pad(p.account_id, 20) << ' ' << (v > 0 ? "+" : "") << v << '\n';
  }
  std::cout << "history\n";
  for (const Event& e : history(d, postings)) {
    std::cout << "  " << format_time_ms(e.at_ms) << "  " << e.what << '\n';
  }
  // Take-overs are not timestamped; the epoch and attempts count them.
  std::cout << "  " << pad("now", 24) << "  owner " << d.owner << " at epoch " << d.epoch << " after "
            << d.attempts << " take-over(s) (recovery or operator)\n";
  return kExitOk;
}

struct StuckArgs {
  std::string older_than = "1m";
  std::size_t limit = 1000;
  bool json = false;
};

void print_stuck_json(const std::vector<TransferDoc>& docs, std::int64_t now, std::int64_t older_ms,
                      bool truncated) {
  JsonWriter j;
  j.object()
      .number("older_than_ms", older_ms)
      .number("count", static_cast<std::int64_t>(docs.size()))
      .boolean("truncated", truncated)
      .array("transfers");
  for (const TransferDoc& d : docs) {
    j.object()
        .string("id", d.id)
        .string("state", to_string(d.state))
        .string("reason", to_string(d.reason))
        .number("age_ms", now - d.last_modified_ms)
        .string("owner", d.owner)
        .number("epoch", d.epoch)
        .number("attempts", d.attempts)
        .boolean("lease_expired", d.lease_until_ms < now)
        .string("from", d.source)
        .string("to", d.destination)
        .number("amount", d.amount)
        .end();
  }
  std::cout << j.end().end().text() << '\n';
}

int list_stuck(Ledger& ledger, const StuckArgs& args) {
  const std::optional<std::int64_t> older_ms = parse_duration_ms(args.older_than);
  if (!older_ms) {
    return fail(kExitUsage,
                "--older-than: expected a duration like 30s, 5m or 1h, got '" + args.older_than + "'");
  }
  if (args.limit == 0) return fail(kExitUsage, "--limit must be at least 1");
  std::int64_t now = 0;
  if (Status s = ledger.transfers().now_ms(now); !s) return fail(s);
  std::vector<TransferDoc> docs;
  // One more than asked for tells whether the list was cut.
  if (Status s = ledger.transfers().list_stale(now - *older_ms, args.limit + 1, docs); !s) return fail(s);
  const bool truncated = docs.size() > args.limit;
  if (truncated) docs.resize(args.limit);
  if (args.json) {
    print_stuck_json(docs, now, *older_ms, truncated);
    return kExitOk;
  }
  if (docs.empty()) {
    std::cout << "no transfer has been non-terminal for longer than " << format_duration_ms(*older_ms)
              << '\n';
    return kExitOk;
  }
  std::cout << pad("ID", 24) << pad("STATE", 11) << pad("AGE", 9) << pad("LEASE", 9) << pad("ATTEMPTS", 9)
            << pad("EPOCH", 6) << "OWNER\n";
  for (const TransferDoc& d : docs) {
    std::cout << pad(d.id, 23) << ' ' << pad(std::string(to_string(d.state)), 11)
              << pad(format_duration_ms(now - d.last_modified_ms), 9)
              << pad(d.lease_until_ms < now ? "expired" : "held", 9) << pad(std::to_string(d.attempts), 9)
              << pad(std::to_string(d.epoch), 6) << d.owner << '\n';
  }
  std::cout << docs.size() << " transfer(s) non-terminal for longer than " << format_duration_ms(*older_ms)
            << (truncated ? " (list cut at --limit; there are more)" : "") << '\n';
  return kExitOk;
}

using OperatorAction = Status (*)(Ledger&, std::string_view, std::string_view, SagaObserver&,
                                  ActionOutcome&);

int operator_command(Ledger& ledger, const std::string& id, OperatorAction act) {
  NullObserver observer;
  ActionOutcome out;
  if (Status s = act(ledger, id, operator_id(), observer, out); !s) return fail(s);
  switch (out.result) {
    case ActionResult::done:
      std::cout << out.message << '\n';
      return kExitOk;
    case ActionResult::refused:
      return fail(kExitRefused, out.message);
    case ActionResult::not_found:
      return fail(kExitNotFound, out.message.empty() ? "no transfer " + id : out.message);
    case ActionResult::preempted:
      return fail(kExitPreempted, out.message);
  }
  return fail(kExitFailed, "unknown outcome for transfer " + id);
}

}  // namespace

void add_transfer_commands(CLI::App& app, Action& action) {
  CLI::App* transfer = app.add_subcommand("transfer", "inspect one transfer");
  transfer->require_subcommand(1);
  add_show_command(*transfer, action,
                   "the transfer document, its postings across both accounts' stores, and its history",
                   "transfer", show_transfer);

  auto stuck_args = std::make_shared<StuckArgs>();
  CLI::App* stuck = app.add_subcommand(
      "stuck", "list non-terminal transfers not modified for a while, oldest first (exit 0)");
  stuck->add_option("--older-than", stuck_args->older_than, "how long untouched, e.g. 30s, 5m, 1h")
      ->type_name("DURATION")
      ->capture_default_str();
  stuck->add_option("--limit", stuck_args->limit, "list at most this many")
      ->type_name("N")
      ->capture_default_str();
  stuck->add_flag("--json", stuck_args->json, "print one JSON object");
  stuck->callback([&action, stuck_args] {
    action = {true, [stuck_args](Ledger& ledger) { return list_stuck(ledger, *stuck_args); }};
  });

  const std::pair<const char*, const char*> ops[] = {
      {"retry", "take a non-terminal transfer over now and drive it to the end (exit 3 if terminal)"},
      {"cancel", "cancel a transfer that has not applied, reversing a posted debit (exit 3 once "
                 "applied: publish a reverse transfer instead; exit 5 if it was canceled by "
                 "someone else, for their reason)"}};
  for (const auto& [name, help] : ops) {
    auto id = std::make_shared<std::string>();
    CLI::App* sub = app.add_subcommand(name, help);
    sub->add_option("ID", *id, "transfer id")->required();
    const OperatorAction act = std::string_view(name) == "retry" ? retry_transfer : cancel_transfer;
    sub->callback([&action, id, act] {
      action = {true, [id, act](Ledger& ledger) { return operator_command(ledger, *id, act); }};
    });
  }
}

}  // namespace sagapool::ctl
