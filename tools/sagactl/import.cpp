// `accounts import FILE.csv`: all or nothing across every store.
//
// The whole file is parsed and checked first (import_parse.cpp: header,
// every field, ids repeated inside the file), then every id is looked up on the store it
// hashes to; only when nothing is wrong are the accounts created, one
// create_accounts batch (one transaction) per store. If a store still fails
// after others committed (a concurrent create, a lost connection), the
// message names exactly which stores' accounts were created.
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <vector>

#include "commands.hpp"
#include "import_parse.hpp"

namespace sagapool::ctl {

int ImportErrors::report(std::string_view what) const {
  if (count_ == 1) return fail(kExitFailed, shown_.front() + "; nothing was imported");
  for (const std::string& e : shown_) fail(kExitFailed, e);
  std::string summary = std::to_string(count_) + " " + std::string(what);
  if (count_ > shown_.size()) summary += " (first " + std::to_string(shown_.size()) + " shown)";
  return fail(kExitFailed, summary + "; nothing was imported");
}

namespace {

struct ShardRows {
  std::vector<Account> accounts;
  std::vector<std::size_t> lines;
};

// `-` is standard input, so an export can be piped in.
bool read_whole_file(const std::string& path, std::string& out, std::string& error) {
  std::ifstream file;
  std::istream* in = &std::cin;
  if (path != "-") {
    file.open(path, std::ios::binary);
    if (!file) {
      error = "cannot open " + path + ": " + std::strerror(errno);
      return false;
    }
    in = &file;
  }
  std::ostringstream ss;
  ss << in->rdbuf();
  if (in->bad()) {
    error = "cannot read " + (path == "-" ? std::string("standard input") : path);
    return false;
  }
  out = std::move(ss).str();
  return true;
}

}  // namespace

int import_accounts(Ledger& ledger, const std::string& file) {
  std::string text;
  std::string error;
  if (!read_whole_file(file, text, error)) return fail(kExitFailed, error);
  ImportErrors errors(file);
  ParsedImport parsed;
  parse_accounts_csv(text, parsed, errors);
  if (errors.any()) return errors.report(parsed.what);

  // Placement: the store each account hashes to.
  std::vector<ShardRows> shards(ledger.shard_count());
  for (std::size_t k = 0; k < parsed.accounts.size(); ++k) {
    ShardRows& rows = shards[ledger.shard_index(parsed.accounts[k].id)];
    rows.accounts.push_back(std::move(parsed.accounts[k]));
    rows.lines.push_back(parsed.lines[k]);
  }

  // Pass 2: nothing may exist yet, on any store.
  std::size_t total = 0;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    OperatorStore& store = ledger.shard(s);
    const ShardRows& rows = shards[s];
    total += rows.accounts.size();
    std::optional<Account> existing;
    for (std::size_t k = 0; k < rows.accounts.size(); ++k) {
      if (Status st = store.load_account(rows.accounts[k].id, existing); !st) {
        return fail(kExitFailed, st.message() + "; nothing was imported");
      }
      if (existing) {
        errors.add(rows.lines[k], "account " + rows.accounts[k].id + " already exists on " +
                                      describe_shard(ledger, s));
      }
    }
  }
  if (errors.any()) return errors.report("account(s) already exist");
  if (total == 0) {
    std::cout << "nothing to import: " << file << " has a header but no rows\n";
    return kExitOk;
  }

  // Pass 3: one all-or-nothing batch per store.
  std::size_t created = 0;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const ShardRows& rows = shards[s];
    if (rows.accounts.empty()) continue;
    if (Status st = ledger.shard(s).create_accounts(rows.accounts); !st) {
      if (created == 0) return fail(kExitFailed, st.message() + "; nothing was imported");
      std::string done;
      for (std::size_t d = 0; d < s; ++d) {
        if (shards[d].accounts.empty()) continue;
        done += (done.empty() ? "" : ", ") + describe_shard(ledger, d) + ": " +
                std::to_string(shards[d].accounts.size()) + " accounts";
      }
      return fail(kExitFailed,
                  "import stopped at " + describe_shard(ledger, s) + ": " + st.message() +
                      "; PARTIALLY IMPORTED: the rows of " + file + " placed on " + done +
                      " were created; the rows placed on " + describe_shard(ledger, s) +
                      " and later stores were not");
    }
    created += rows.accounts.size();
  }
  std::cout << "imported " << created << " accounts from " << file;
  for (std::size_t s = 0; s < shards.size(); ++s) {
    std::cout << (s ? ", " : ": ") << shards[s].accounts.size() << " on " << describe_shard(ledger, s);
  }
  std::cout << '\n';
  return kExitOk;
}

}  // namespace sagapool::ctl
