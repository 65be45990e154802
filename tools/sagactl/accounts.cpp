// `accounts create|import|show|lock|unlock`.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>
#include <memory>
#include <optional>
#include <vector>

#include "commands.hpp"
#include "json_writer.hpp"
#include "sagapool/request.hpp"

namespace sagapool::ctl {
namespace {

constexpr std::size_t kShownPostings = 20;

struct CreateArgs {
  std::string id;
  std::string balance;
  std::string min_balance = "0";
  std::string currency;
  bool locked = false;
};

int create_account(Ledger& ledger, const CreateArgs& args) {
  if (!is_valid_identifier(args.id, kMaxAccountIdLength)) {
    return fail(kExitUsage, "bad account id '" + args.id + "': expected 1.." +
                                std::to_string(kMaxAccountIdLength) + " chars of [A-Za-z0-9._:-]");
  }
  Account a;
  a.id = args.id;
  if (!parse_int64(args.balance, a.balance)) {
    return fail(kExitUsage, "--balance: expected an integer of minor units, got '" + args.balance + "'");
  }
  if (!parse_int64(args.min_balance, a.min_balance)) {
    return fail(kExitUsage,
                "--min-balance: expected an integer of minor units, got '" + args.min_balance + "'");
  }
  if (a.balance < a.min_balance) {
    return fail(kExitUsage, "--balance " + args.balance + " is below --min-balance " + args.min_balance);
  }
  if (!is_valid_currency(args.currency)) {
    return fail(kExitUsage, "--currency: expected 3 upper-case letters (e.g. EUR), got '" +
                                args.currency + "'");
  }
  a.currency = args.currency;
  a.locked = args.locked;
  a.opening_balance = a.balance;
  const std::size_t shard = ledger.shard_index(a.id);
  if (Status s = ledger.shard(shard).create_accounts({&a, 1}); !s) return fail(s);
  std::cout << "created account " << a.id << " with balance " << a.balance << " on "
            << describe_shard(ledger, shard) << '\n';
  return kExitOk;
}

void print_account_json(const Account& a, const std::string& placed, const std::vector<std::string>& pending,
                        const std::vector<Posting>& postings) {
  JsonWriter j;
  j.object()
      .string("id", a.id)
      .string("placed_on", placed)
      .number("balance", a.balance)
      .number("reserved", a.reserved)
      .number("opening_balance", a.opening_balance)
      .number("min_balance", a.min_balance)
      .string_or_null("currency", a.currency)
      .boolean("locked", a.locked)
      .array("pending");
  for (const std::string& t : pending) j.string({}, t);
  j.end().array("postings");  // the last ones, newest first
  for (const Posting& p : postings) {
    j.object()
        .time("at", p.at_ms)
        .string("kind", to_string(p.kind))
        .number("amount", signed_amount(p.kind, p.amount))
        .string("transfer_id", p.transfer_id)
        .end();
  }
  std::cout << j.end().end().text() << '\n';
}

int show_account(Ledger& ledger, const std::string& id, bool json) {
  const std::size_t shard = ledger.shard_index(id);
  OperatorStore& store = ledger.shard(shard);
  std::optional<Account> a;
  if (Status s = store.load_account(id, a); !s) return fail(s);
  if (!a) return fail(kExitNotFound, "no account " + id + " on " + describe_shard(ledger, shard));
  std::vector<std::string> pending;
  if (Status s = store.pending_for_account(id, pending); !s) return fail(s);
  std::vector<Posting> postings;
  if (Status s = store.postings_for_account(id, kShownPostings, postings); !s) return fail(s);
  if (json) {
    print_account_json(*a, describe_shard(ledger, shard), pending, postings);
    return kExitOk;
  }

  std::cout << "account      " << a->id << '\n'
            << "placed on    " << describe_shard(ledger, shard) << '\n'
            << "balance      " << a->balance << '\n'
            << "reserved     " << a->reserved << " (for reversals of pending debits)\n"
            << "opening      " << a->opening_balance << '\n'
            << "min balance  " << a->min_balance << '\n'
            << "currency     " << (a->currency.empty() ? "any" : a->currency) << '\n'
            << "locked       " << (a->locked ? "yes" : "no") << '\n'
            << "pending      " << pending.size() << " transfer(s)";
  for (std::size_t i = 0; i < pending.size(); ++i) std::cout << (i ? ", " : ": ") << pending[i];
  std::cout << '\n';
  if (postings.empty()) {
    std::cout << "postings     none\n";
    return kExitOk;
  }
  std::cout << "postings     last " << postings.size() << ", newest first:\n";
  for (const Posting& p : postings) {
    const std::int64_t signed_value = signed_amount(p.kind, p.amount);
    std::string amount = (signed_value > 0 ? "+" : "") + std::to_string(signed_value);
    std::string kind(to_string(p.kind));
    kind.resize(std::max<std::size_t>(kind.size(), 13), ' ');
    amount.insert(0, amount.size() < 20 ? 20 - amount.size() : 0, ' ');
    std::cout << "  " << format_time_ms(p.at_ms) << "  " << kind << amount << "  " << p.transfer_id
              << '\n';
  }
  return kExitOk;
}

int set_locked(Ledger& ledger, const std::string& id, bool locked) {
  const std::size_t shard = ledger.shard_index(id);
  bool found = false;
  if (Status s = ledger.shard(shard).set_locked(id, locked, found); !s) return fail(s);
  if (!found) return fail(kExitNotFound, "no account " + id + " on " + describe_shard(ledger, shard));
  std::cout << "account " << id << (locked ? " locked" : " unlocked") << '\n';
  return kExitOk;
}

}  // namespace

void add_account_commands(CLI::App& app, Action& action) {
  CLI::App* accounts = app.add_subcommand("accounts", "create, import, show, lock and unlock accounts");
  accounts->require_subcommand(1);

  auto create = std::make_shared<CreateArgs>();
  CLI::App* c = accounts->add_subcommand("create", "create one account on the store its id hashes to");
  c->add_option("ID", create->id, "account id, 1..64 chars of [A-Za-z0-9._:-]")->required();
  c->add_option("--balance", create->balance, "opening balance in minor units")
      ->required()
      ->type_name("N");
  c->add_option("--min-balance", create->min_balance,
                "lowest balance allowed (0 = no credit; negative = an overdraft line)")
      ->type_name("N")
      ->capture_default_str();
  c->add_option("--currency", create->currency, "3 upper-case letters; omitted = any currency")
      ->type_name("CCC");
  c->add_flag("--locked", create->locked, "create it locked (no debit or credit until unlocked)");
  c->callback([&action, create] {
    action = {true, [create](Ledger& ledger) { return create_account(ledger, *create); }};
  });

  auto file = std::make_shared<std::string>();
  CLI::App* imp = accounts->add_subcommand(
      "import", "create the accounts of a CSV file (header id,balance[,min_balance,currency,locked]); "
                "all or nothing");
  imp->add_option("FILE", *file, "the CSV file, or - for standard input")->required();
  imp->callback([&action, file] {
    action = {true, [file](Ledger& ledger) { return import_accounts(ledger, *file); }};
  });

  add_show_command(*accounts, action, "balance, limits, pending transfers and the last postings of an account",
                   "account", show_account);

  for (const bool locked : {true, false}) {
    auto id = std::make_shared<std::string>();
    CLI::App* sub = accounts->add_subcommand(
        locked ? "lock" : "unlock",
        locked ? "refuse every new debit and credit on an account" : "allow debits and credits again");
    sub->add_option("ID", *id, "account id")->required();
    sub->callback([&action, id, locked] {
      action = {true, [id, locked](Ledger& ledger) { return set_locked(ledger, *id, locked); }};
    });
  }
}

}  // namespace sagapool::ctl
