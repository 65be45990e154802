// sagactl end to end on a two-store SQLite ledger: init, accounts (create,
// import, show, lock), transfer show / cancel / retry / stuck on transfers
// driven in-process by the real engine, the audit catching a corrupted
// balance, and the stores given in the wrong order.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sqlite3.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "process.hpp"
#include "sagapool/audit.hpp"
#include "sagapool/ledger.hpp"
#include "sagapool/operator_actions.hpp"
#include "sagapool/saga_engine.hpp"

namespace sagapool::test {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

std::size_t count_lines(const std::string& s) {
  std::size_t n = 0;
  for (char c : s) {
    if (c == '\n') ++n;
  }
  return n;
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// Each of `parts` appears in the command's output.
void expect_output_has(const RunResult& r, std::initializer_list<std::string> parts) {
  for (const std::string& part : parts) {
    EXPECT_TRUE(contains(r.output, part)) << "missing '" << part << "' in:\n" << r.output;
  }
}

std::string hostname() {
  std::array<char, 256> host{};
  if (gethostname(host.data(), host.size() - 1) != 0) return "unknown-host";
  return host.data();
}

void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
}

class SagactlTest : public ::testing::Test {
 protected:
  std::vector<std::string> store_args() const {
    return {"--store", url_a_, "--store", url_b_};
  }

  // sagactl --store A --store B <args...>
  RunResult ctl(const std::vector<std::string>& args) const {
    std::vector<std::string> argv{bin("sagactl").string()};
    for (const std::string& s : store_args()) argv.push_back(s);
    argv.insert(argv.end(), args.begin(), args.end());
    return run(argv);
  }
  // sagactl with exactly these arguments.
  static RunResult raw(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv{bin("sagactl").string()};
    argv.insert(argv.end(), args.begin(), args.end());
    return run(argv, env);
  }

  void init() {
    const RunResult r = ctl({"init"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }

  // The same ledger, opened in this process.
  Ledger& ledger() {
    if (!ledger_) {
      const Status s = Ledger::open({url_a_, url_b_}, ledger_);
      EXPECT_TRUE(s.is_ok()) << s.message();
      EXPECT_TRUE(ledger_->verify_topology().is_ok());
    }
    return *ledger_;
  }

  std::size_t account_count() {
    std::size_t n = 0;
    for (std::size_t i = 0; i < ledger().shard_count(); ++i) {
      EXPECT_TRUE(ledger().shard(i).scan_accounts([&](const Account&) { ++n; }).is_ok());
    }
    return n;
  }

  std::optional<Account> account(const std::string& id) {
    std::optional<Account> a;
    EXPECT_TRUE(ledger().shard_for(id).load_account(id, a).is_ok());
    return a;
  }

  const std::filesystem::path& file_of(const std::string& account_id) {
    return ledger().shard_index(account_id) == 0 ? file_a_ : file_b_;
  }

  // Inserts a transfer owned by `owner` (state initial, epoch 1).
  void insert_transfer(const std::string& id, const std::string& from, const std::string& to,
                       std::int64_t amount, const std::string& owner = "worker-x") {
    NewTransfer t;
    t.request.id = id;
    t.request.from = from;
    t.request.to = to;
    t.request.amount = amount;
    t.payload_hash = payload_hash(t.request);
    t.requested_at_ms = 1'700'000'000'000;
    t.origin_topic = "transfers.requests";
    t.origin_partition = 3;
    t.origin_offset = 42;
    InsertResult result = InsertResult::conflict;
    ASSERT_TRUE(ledger().transfers().insert_transfers({&t, 1}, owner, 30'000, {&result, 1}).is_ok());
    ASSERT_EQ(result, InsertResult::inserted);
  }

  void run_engine(const std::string& id, const std::string& owner = "worker-x") {
    std::optional<TransferDoc> doc;
    ASSERT_TRUE(ledger().transfers().load_transfer(id, doc).is_ok());
    ASSERT_TRUE(doc.has_value());
    std::vector<SagaItem> items(1);
    items[0].assign(*doc);
    NullObserver observer;
    SagaEngine engine(ledger(), {owner, 30'000, 5}, &observer);
    ASSERT_TRUE(engine.run(items).is_ok());
  }

  TransferDoc transfer(const std::string& id) {
    std::optional<TransferDoc> doc;
    EXPECT_TRUE(ledger().transfers().load_transfer(id, doc).is_ok());
    EXPECT_TRUE(doc.has_value()) << id;
    return doc.value_or(TransferDoc{});
  }

  TempDir dir_{"sagactl-test"};
  std::filesystem::path file_a_ = dir_ / "a.db";
  std::filesystem::path file_b_ = dir_ / "b.db";
  std::string url_a_ = "sqlite:" + file_a_.string();
  std::string url_b_ = "sqlite:" + file_b_.string();
  std::unique_ptr<Ledger> ledger_;
};

// ---- init and topology ------------------------------------------------------------

TEST_F(SagactlTest, InitTwiceIsIdempotent) {
  RunResult r = ctl({"init"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_output_has(r, {url_a_ + ": created schema", url_b_ + ": created schema", "shard 2 of 2"});
  std::optional<Topology> first;
  ASSERT_TRUE(ledger().shard(1).read_topology(first).is_ok());
  ASSERT_TRUE(first.has_value());

  r = ctl({"init"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_output_has(r, {url_a_ + ": already initialised", url_b_ + ": already initialised",
                        first->ledger_id});
  std::optional<Topology> second;
  ASSERT_TRUE(ledger().shard(1).read_topology(second).is_ok());
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ(second->ledger_id, first->ledger_id);
  EXPECT_EQ(second->shard_index, 1);
  EXPECT_EQ(second->shard_count, 2);

  r = ctl({"audit"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "audit passed")) << r.output;
}

TEST_F(SagactlTest, InitRefusesToReshard) {
  init();
  const RunResult r = raw({"--store", url_a_, "init"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(count_lines(r.output), 1u) << r.output;
  EXPECT_TRUE(contains(r.output, "re-sharding")) << r.output;
}

TEST_F(SagactlTest, StoresInTheOtherOrderAreRefused) {
  init();
  for (const std::vector<std::string>& cmd :
       {std::vector<std::string>{"audit"}, {"accounts", "show", "x"}, {"stuck"}}) {
    std::vector<std::string> args{"--store", url_b_, "--store", url_a_};
    args.insert(args.end(), cmd.begin(), cmd.end());
    const RunResult r = raw(args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_EQ(count_lines(r.output), 1u) << r.output;
    EXPECT_TRUE(contains(r.output, "sagactl: store #1 (" + url_b_ + ") is shard 2 of 2")) << r.output;
    EXPECT_TRUE(contains(r.output, "pass the stores in the order and number used at `sagactl init`"))
        << r.output;
  }
  // One store of two is refused as well.
  const RunResult r = raw({"--store", url_a_, "audit"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "given as store 1 of 1")) << r.output;
}

TEST_F(SagactlTest, UninitialisedOrUnusableStoresAreRefused) {
  RunResult r = ctl({"audit"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(count_lines(r.output), 1u) << r.output;
  EXPECT_TRUE(contains(r.output, "is not initialised; run `sagactl init`")) << r.output;

  r = raw({"--store", "mysql://nope", "audit"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(count_lines(r.output), 1u) << r.output;
  EXPECT_TRUE(contains(r.output, "unsupported store URL")) << r.output;

  r = raw({"--store", "sqlite:" + (dir_ / "missing" / "x.db").string(), "audit"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(count_lines(r.output), 1u) << r.output;
  EXPECT_TRUE(contains(r.output, "cannot open")) << r.output;
}

// Scripts read sagactl's stdout: the store's retry warnings while a server
// does not answer go to stderr.
TEST_F(SagactlTest, StoreWarningsStayOffStdout) {
  const std::string url = "postgresql://saga@127.0.0.1:" + std::to_string(free_loopback_port()) +
                          "/ledger?connect_timeout=2";
  const std::string command = bin("sagactl").string() + " --store '" + url + "' audit";
  RunResult both = run({"/bin/sh", "-c", command});
  EXPECT_EQ(both.exit_code, 2) << both.output;
  EXPECT_TRUE(contains(both.output, "retrying")) << both.output;  // the warnings exist
  RunResult out = run({"/bin/sh", "-c", command + " 2>/dev/null"});
  EXPECT_EQ(out.exit_code, 2);
  EXPECT_EQ(out.output, "");
}

TEST_F(SagactlTest, UsageErrorsExitTwoWithOneLine) {
  init();
  RunResult r = raw({"audit"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--store is required")) << r.output;
  EXPECT_EQ(count_lines(r.output), 1u) << r.output;

  for (const std::vector<std::string>& args :
       {std::vector<std::string>{}, {"accounts"}, {"accounts", "create", "x"}, {"audit", "--bogus"},
        {"stuck", "--older-than", "5x"}, {"audit", "--stuck-after", "soon"}, {"transfer"}}) {
    r = ctl(args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(r.output.starts_with("sagactl: ")) << r.output;
    EXPECT_EQ(count_lines(r.output), 1u) << r.output;
  }
  r = ctl({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_TRUE(contains(r.output, "SAGA_STORE")) << r.output;
  EXPECT_TRUE(contains(r.output, "Exit codes")) << r.output;
}

TEST_F(SagactlTest, StoresMayComeFromTheEnvironmentOrAfterTheCommand) {
  const RunResult init_one = raw({"init"}, {"SAGA_STORE=" + url_a_});
  ASSERT_EQ(init_one.exit_code, 0) << init_one.output;
  RunResult r = raw({"accounts", "create", "env-1", "--balance", "5"}, {"SAGA_STORE=" + url_a_});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = raw({"accounts", "show", "env-1", "--store", url_a_});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "balance      5")) << r.output;
}

// ---- accounts -------------------------------------------------------------------

TEST_F(SagactlTest, AccountsCreateShowLockUnlock) {
  init();
  RunResult r = ctl({"accounts", "create", "acct-1", "--balance", "2500", "--currency", "EUR"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::size_t shard = ledger().shard_index("acct-1");
  EXPECT_TRUE(contains(r.output, "store " + std::to_string(shard + 1) + " of 2")) << r.output;
  std::optional<Account> a = account("acct-1");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->balance, 2500);
  EXPECT_EQ(a->opening_balance, 2500);
  EXPECT_EQ(a->currency, "EUR");
  EXPECT_FALSE(a->locked);
  std::optional<Account> elsewhere;
  ASSERT_TRUE(ledger().shard(1 - shard).load_account("acct-1", elsewhere).is_ok());
  EXPECT_FALSE(elsewhere.has_value()) << "the account must live only on the store it hashes to";

  r = ctl({"accounts", "create", "acct-2", "--balance", "-100", "--min-balance", "-500", "--locked"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  a = account("acct-2");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->min_balance, -500);
  EXPECT_TRUE(a->locked);
  EXPECT_EQ(a->currency, "");

  r = ctl({"accounts", "show", "acct-1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_output_has(r, {"balance      2500", "opening      2500", "min balance  0",
                        "currency     EUR", "locked       no", "pending      0",
                        "postings     none"});

  r = ctl({"accounts", "lock", "acct-1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(account("acct-1")->locked);
  r = ctl({"accounts", "show", "acct-1"});
  EXPECT_TRUE(contains(r.output, "locked       yes")) << r.output;
  r = ctl({"accounts", "unlock", "acct-1"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(account("acct-1")->locked);

  // Refusals: one line each, nothing changed.
  struct Case {
    std::vector<std::string> args;
    int exit_code;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"accounts", "create", "acct-1", "--balance", "1"}, 1, "already exists"},
      {{"accounts", "create", "bad id", "--balance", "1"}, 2, "bad account id"},
      {{"accounts", "create", std::string(65, 'x'), "--balance", "1"}, 2, "bad account id"},
      {{"accounts", "create", "acct-3", "--balance", "1.5"}, 2, "--balance"},
      {{"accounts", "create", "acct-3", "--balance", "0x10"}, 2, "--balance"},
      {{"accounts", "create", "acct-3", "--balance", "99999999999999999999"}, 2, "--balance"},
      {{"accounts", "create", "acct-3", "--balance", "1", "--currency", "eur"}, 2, "--currency"},
      {{"accounts", "create", "acct-3", "--balance", "1", "--currency", "EURO"}, 2, "--currency"},
      {{"accounts", "create", "acct-3", "--balance", "1", "--min-balance", "5"}, 2, "below"},
      {{"accounts", "show", "nope"}, 4, "no account nope"},
      {{"accounts", "lock", "nope"}, 4, "no account nope"},
      {{"accounts", "unlock", "nope"}, 4, "no account nope"},
  };
  for (const Case& c : cases) {
    r = ctl(c.args);
    EXPECT_EQ(r.exit_code, c.exit_code) << c.args[1] << " " << c.args[2] << ": " << r.output;
    EXPECT_EQ(count_lines(r.output), 1u) << r.output;
    EXPECT_TRUE(contains(r.output, c.says)) << r.output;
  }
  EXPECT_EQ(account_count(), 2u);
  EXPECT_EQ(account("acct-1")->balance, 2500);
}

// ---- import ---------------------------------------------------------------------

TEST_F(SagactlTest, ImportOfAGoodCsv) {
  init();
  std::string csv = "locked,currency,balance,id,min_balance\r\n";
  for (int i = 0; i < 1000; ++i) {
    csv += (i == 7 ? "true" : "") + std::string(",") + (i % 2 ? "EUR" : "") + "," +
           std::to_string(100 + i) + ",imp-" + std::to_string(i) + "," + (i == 3 ? "-50" : "") + "\r\n";
  }
  write_file(dir_ / "good.csv", csv);
  const RunResult r = ctl({"accounts", "import", (dir_ / "good.csv").string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "imported 1000 accounts")) << r.output;
  EXPECT_EQ(account_count(), 1000u);
  std::optional<Account> a = account("imp-7");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->balance, 107);
  EXPECT_EQ(a->opening_balance, 107);
  EXPECT_TRUE(a->locked);
  EXPECT_EQ(a->currency, "EUR");
  a = account("imp-3");
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a->min_balance, -50);
  EXPECT_FALSE(a->locked);
  EXPECT_EQ(a->currency, "EUR");
  EXPECT_EQ(account("imp-0")->currency, "");
  EXPECT_EQ(ctl({"audit"}).exit_code, 0);
}

// RFC 4180: quoted fields (commas, doubled quotes and line breaks inside),
// a byte order mark, CRLF, and blank lines at the end.
TEST_F(SagactlTest, ImportTakesQuotedFieldsAndTrailingBlankLines) {
  init();
  write_file(dir_ / "quoted.csv",
             "\xEF\xBB\xBF\"id\",\"balance\",currency\r\n"
             "\"q-1\",\"100\",EUR\r\n"
             "q-2,200,\"\"\r\n"
             "\"q-3\",300,\r\n\r\n\n");
  const RunResult r = ctl({"accounts", "import", (dir_ / "quoted.csv").string()});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "imported 3 accounts")) << r.output;
  EXPECT_EQ(account("q-1")->currency, "EUR");
  EXPECT_EQ(account("q-2")->balance, 200);
  EXPECT_EQ(account("q-3")->balance, 300);

  // A quoted field spanning lines: errors after it name the right line.
  write_file(dir_ / "multiline.csv", "id,balance\n\"q-\n4\",1\nq-5,x\n");
  const RunResult bad = ctl({"accounts", "import", (dir_ / "multiline.csv").string()});
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_TRUE(contains(bad.output, ":2: column 1 (id): bad account id 'q-\n4'")) << bad.output;
  EXPECT_TRUE(contains(bad.output, ":4: column 2 (balance): bad balance 'x'")) << bad.output;
}

TEST_F(SagactlTest, ImportReadsStandardInputForADash) {
  init();
  std::string sagactl = "'" + bin("sagactl").string() + "'";
  for (const std::string& arg : store_args()) sagactl += " '" + arg + "'";
  auto import_piped = [&](const std::string& name, const std::string& csv) {
    write_file(dir_ / name, csv);
    return run({"/bin/sh", "-c", "exec " + sagactl + " accounts import - < '" + (dir_ / name).string() + "'"});
  };
  const RunResult r = import_piped("piped.csv", "id,balance\npiped-1,10\npiped-2,20\n");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "imported 2 accounts")) << r.output;
  EXPECT_EQ(account("piped-2")->balance, 20);

  const RunResult bad = import_piped("bad.csv", "id,balance\npiped-3,ten\n");
  EXPECT_EQ(bad.exit_code, 1) << bad.output;
  EXPECT_TRUE(contains(bad.output, "-:2:")) << bad.output;  // errors name standard input `-`
  EXPECT_FALSE(account("piped-3").has_value());
}

TEST_F(SagactlTest, ImportOfBadCsvsLeavesNothingBehind) {
  init();
  ASSERT_EQ(ctl({"accounts", "create", "taken", "--balance", "1"}).exit_code, 0);
  // Many good rows before the bad one, spread over both stores.
  std::string good_rows;
  for (int i = 0; i < 50; ++i) good_rows += "ok-" + std::to_string(i) + ",10\n";
  struct Case {
    std::string name;
    std::string text;
    std::string says;
  };
  const std::vector<Case> cases = {
      {"unknown_column", "id,balance,colour\nx,1,red\n", ":1: unknown column 'colour'"},
      {"no_balance_column", "id,min_balance\nx,1\n", ":1: the header has no 'balance' column"},
      {"duplicate_column", "id,balance,id\nx,1,y\n", ":1: column 'id' appears twice"},
      {"empty", "", ":1: empty file"},
      {"bad_number", "id,balance\n" + good_rows + "x,12a\n", ":52: column 2 (balance): bad balance '12a'"},
      {"float", "id,balance\n" + good_rows + "x,1.5\n", ":52: column 2 (balance): bad balance '1.5'"},
      {"leading_zero", "id,balance\n" + good_rows + "x,012\n", ":52: column 2 (balance): bad balance '012'"},
      {"too_large", "id,balance\n" + good_rows + "x,9223372036854775808\n", ":52: column 2 (balance): bad balance"},
      {"duplicate_id", "id,balance\n" + good_rows + "ok-3,5\n", ":52: account ok-3 repeats line 5"},
      {"bad_id", "id,balance\n" + good_rows + "not ok,5\n", ":52: column 1 (id): bad account id 'not ok'"},
      {"field_count", "id,balance\n" + good_rows + "x,1,2\n", ":52: 3 fields, but the header has 2"},
      {"bad_currency", "id,balance,currency\nx,1,eur\n", ":2: column 3 (currency): bad currency 'eur'"},
      {"bad_locked", "id,balance,locked\nx,1,maybe\n", ":2: column 3 (locked): bad locked 'maybe'"},
      {"below_min", "id,balance,min_balance\nx,1,5\n", ":2: balance 1 is below min_balance 5"},
      {"blank_line", "id,balance\n" + good_rows + "\nx,1\n", ":52: empty line"},
      {"unclosed_quote", "id,balance\n" + good_rows + "\"x,1\n", ":52: column 1: a quoted field is never closed"},
      {"stray_quote", "id,balance\n" + good_rows + "x\"y,1\n", ":52: column 1: a quote inside an unquoted field"},
      {"after_quote", "id,balance\n" + good_rows + "\"x\"y,1\n", ":52: column 1: only a comma or the end"},
      {"existing_account", "id,balance\n" + good_rows + "taken,5\n",
       ":52: account taken already exists on store"},
  };
  for (const Case& c : cases) {
    const std::filesystem::path file = dir_ / (c.name + ".csv");
    write_file(file, c.text);
    const RunResult r = ctl({"accounts", "import", file.string()});
    EXPECT_EQ(r.exit_code, 1) << c.name << ": " << r.output;
    EXPECT_TRUE(contains(r.output, "sagactl: " + file.string() + c.says)) << c.name << ": " << r.output;
    EXPECT_TRUE(contains(r.output, "nothing was imported")) << c.name << ": " << r.output;
    EXPECT_EQ(count_lines(r.output), 1u) << c.name << ": " << r.output;
    EXPECT_EQ(account_count(), 1u) << c.name << " left accounts behind";
  }
  // Several errors: one line each (at most 10), then a summary.
  std::string many = "id,balance\n";
  for (int i = 0; i < 15; ++i) many += "m-" + std::to_string(i) + ",x\n";
  write_file(dir_ / "many.csv", many);
  RunResult r = ctl({"accounts", "import", (dir_ / "many.csv").string()});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(count_lines(r.output), 11u) << r.output;
  EXPECT_TRUE(contains(r.output, "many.csv:11: column 2 (balance): bad balance 'x'")) << r.output;
  EXPECT_FALSE(contains(r.output, "many.csv:12:")) << r.output;
  EXPECT_TRUE(contains(r.output, "15 error(s) in the file (first 10 shown); nothing was imported")) << r.output;
  EXPECT_EQ(account_count(), 1u);

  r = ctl({"accounts", "import", (dir_ / "no-such.csv").string()});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "cannot open")) << r.output;
  EXPECT_EQ(ctl({"audit"}).exit_code, 0);
}

// A store that fails the insert after the checks passed (here: a trigger
// injected behind the ledger's back): the message says exactly which
// stores' accounts were created.
TEST_F(SagactlTest, ImportThatFailsOnALaterStoreSaysWhatWasCreated) {
  init();
  std::string csv = "id,balance\n";
  std::size_t on_first = 0;
  for (int i = 0; i < 40; ++i) {
    const std::string id = "p-" + std::to_string(i);
    if (ledger().shard_index(id) == 0) ++on_first;
    csv += id + ",1\n";
  }
  ASSERT_GT(on_first, 0u);
  ASSERT_LT(on_first, 40u);
  write_file(dir_ / "partial.csv", csv);
  auto exec_on = [](const std::filesystem::path& file, const char* sql) {
    sqlite3* raw_db = nullptr;
    ASSERT_EQ(sqlite3_open_v2(file.c_str(), &raw_db, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
    std::unique_ptr<sqlite3, decltype(&sqlite3_close_v2)> db(raw_db, &sqlite3_close_v2);
    ASSERT_EQ(sqlite3_exec(db.get(), sql, nullptr, nullptr, nullptr), SQLITE_OK) << sqlite3_errmsg(db.get());
  };
  constexpr const char* kFail =
      "CREATE TRIGGER injected BEFORE INSERT ON accounts BEGIN SELECT RAISE(ABORT, 'injected failure'); END";

  // Failing on the first store: nothing was created anywhere.
  exec_on(file_a_, kFail);
  RunResult r = ctl({"accounts", "import", (dir_ / "partial.csv").string()});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(count_lines(r.output), 1u) << r.output;
  EXPECT_TRUE(contains(r.output, "injected failure")) << r.output;
  EXPECT_TRUE(contains(r.output, "nothing was imported")) << r.output;
  EXPECT_EQ(account_count(), 0u);
  exec_on(file_a_, "DROP TRIGGER injected");

  // Failing on the second store after the first committed.
  exec_on(file_b_, kFail);
  r = ctl({"accounts", "import", (dir_ / "partial.csv").string()});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_EQ(count_lines(r.output), 1u) << r.output;
  EXPECT_TRUE(contains(r.output, "PARTIALLY IMPORTED")) << r.output;
  EXPECT_TRUE(contains(r.output, "placed on store 1 of 2 (" + url_a_ + "): " + std::to_string(on_first) +
                                     " accounts were created"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "the rows placed on store 2 of 2 (" + url_b_ + ") and later stores were not"))
      << r.output;
  EXPECT_EQ(account_count(), on_first);
}

TEST_F(SagactlTest, ImportOfAHundredThousandRowsIsQuick) {
  init();
  std::string csv = "id,balance\n";
  for (int i = 0; i < 100'000; ++i) csv += "bulk-" + std::to_string(i) + "," + std::to_string(i) + "\n";
  write_file(dir_ / "bulk.csv", csv);
  const auto started = std::chrono::steady_clock::now();
  const RunResult r = ctl({"accounts", "import", (dir_ / "bulk.csv").string()});
  const auto elapsed = std::chrono::steady_clock::now() - started;
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LT(elapsed, 20s) << "importing 100,000 rows took too long";
  EXPECT_EQ(account_count(), 100'000u);
  std::size_t on_first = 0;
  ASSERT_TRUE(ledger().shard(0).scan_accounts([&](const Account&) { ++on_first; }).is_ok());
  EXPECT_GT(on_first, 40'000u);
  EXPECT_LT(on_first, 60'000u);
  // The same file again: every id exists, nothing changes.
  const RunResult again = ctl({"accounts", "import", (dir_ / "bulk.csv").string()});
  EXPECT_EQ(again.exit_code, 1) << again.output;
  EXPECT_TRUE(contains(again.output, "100000 account(s) already exist")) << again.output;
  EXPECT_EQ(account_count(), 100'000u);
}

// ---- audit ------------------------------------------------------------------------

TEST_F(SagactlTest, AuditPassesOnAFreshLedgerAndFailsOnACorruptedBalance) {
  init();
  ASSERT_EQ(ctl({"accounts", "create", "acct-1", "--balance", "100"}).exit_code, 0);
  ASSERT_EQ(ctl({"accounts", "create", "acct-2", "--balance", "0"}).exit_code, 0);
  RunResult r = ctl({"audit"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = ctl({"audit", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  json j = json::parse(r.output);
  EXPECT_TRUE(j.at("ok").get<bool>());
  EXPECT_EQ(j.at("accounts").get<int>(), 2);
  EXPECT_EQ(j.at("checks").size(), 7u);  // invariant 3 has two: postings, reservations

  // Corrupt acct-1's balance behind the ledger's back.
  {
    sqlite3* raw_db = nullptr;
    ASSERT_EQ(sqlite3_open_v2(file_of("acct-1").c_str(), &raw_db, SQLITE_OPEN_READWRITE, nullptr), SQLITE_OK);
    std::unique_ptr<sqlite3, decltype(&sqlite3_close_v2)> db(raw_db, &sqlite3_close_v2);
    sqlite3_busy_timeout(db.get(), 5000);
    ASSERT_EQ(sqlite3_exec(db.get(), "UPDATE accounts SET balance = 90 WHERE id = 'acct-1'", nullptr,
                           nullptr, nullptr),
              SQLITE_OK);
    ASSERT_EQ(sqlite3_changes(db.get()), 1);
  }
  r = ctl({"audit"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  expect_output_has(r, {"audit FAILED", "FAIL 3.", "acct-1: balance 90 != opening 100",
                        "imbalance of -10"});

  r = ctl({"audit", "--json"});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  j = json::parse(r.output);
  EXPECT_FALSE(j.at("ok").get<bool>());
  bool named = false;
  for (const json& check : j.at("checks")) {
    if (check.at("invariant").get<int>() != 3) continue;
    // The balance no longer matches its postings; its reservation (none) still does.
    const bool postings_check = contains(check.at("name").get<std::string>(), "sum of its postings");
    EXPECT_EQ(check.at("ok").get<bool>(), !postings_check) << check.dump();
    for (const json& e : check.at("examples")) named |= contains(e.get<std::string>(), "acct-1");
  }
  EXPECT_TRUE(named) << r.output;
}

// ---- transfers ---------------------------------------------------------------------

TEST_F(SagactlTest, TransferShowCancelRetryAndStuck) {
  init();
  ASSERT_EQ(ctl({"accounts", "create", "alice", "--balance", "1000"}).exit_code, 0);
  ASSERT_EQ(ctl({"accounts", "create", "bob", "--balance", "0"}).exit_code, 0);

  // A transfer the engine finished.
  insert_transfer("t-done", "alice", "bob", 300);
  run_engine("t-done");
  ASSERT_EQ(transfer("t-done").state, TransferState::done);
  RunResult r = ctl({"transfer", "show", "t-done"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_output_has(
      r, {"transfer      t-done", "state         done", "from          alice", "to            bob",
          "amount        300", "owner         worker-x (epoch 1)", "attempts      0",
          "origin        transfers.requests partition 3 offset 42", "postings      2", "history",
          "requested (Kafka timestamp)", "created (state initial, epoch 1)",
          "debit posted on alice: -300", "credit posted on bob: +300", "finished: done"});
  // The same as one JSON object, for scripts.
  r = ctl({"transfer", "show", "t-done", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  {
    const nlohmann::json j = nlohmann::json::parse(r.output);
    EXPECT_EQ(j.at("id"), "t-done");
    EXPECT_EQ(j.at("state"), "done");
    EXPECT_TRUE(j.at("reason").is_null());
    EXPECT_EQ(j.at("from"), "alice");
    EXPECT_EQ(j.at("amount"), 300);
    EXPECT_EQ(j.at("epoch"), 1);
    EXPECT_EQ(j.at("origin").at("offset"), 42);
    ASSERT_EQ(j.at("postings").size(), 2u);
    EXPECT_EQ(j.at("postings")[0].at("amount").get<long long>() + j.at("postings")[1].at("amount").get<long long>(), 0);
  }
  r = ctl({"accounts", "show", "alice", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  {
    const nlohmann::json j = nlohmann::json::parse(r.output);
    EXPECT_EQ(j.at("balance"), 700);
    EXPECT_TRUE(j.at("currency").is_null());
    EXPECT_EQ(j.at("locked"), false);
    ASSERT_EQ(j.at("postings").size(), 1u);
    EXPECT_EQ(j.at("postings")[0].at("amount"), -300);
    EXPECT_EQ(j.at("postings")[0].at("transfer_id"), "t-done");
  }
  r = ctl({"cancel", "t-done"});
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_EQ(count_lines(r.output), 1u) << r.output;
  EXPECT_TRUE(contains(r.output, "publish a new transfer in the opposite direction")) << r.output;
  r = ctl({"retry", "t-done"});
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_TRUE(contains(r.output, "already done")) << r.output;
  EXPECT_EQ(transfer("t-done").state, TransferState::done);

  // A transfer stuck in pending, owned by a worker that went away.
  insert_transfer("t-stuck", "alice", "bob", 50);
  {
    const Transition t{"t-stuck", TransferState::initial, TransferState::pending, Reason::none,
                       "worker-x", 1};
    std::uint8_t applied = 0;
    ASSERT_TRUE(ledger().transfers().transition({&t, 1}, 30'000, {&applied, 1}).is_ok());
    ASSERT_EQ(applied, 1);
  }
  std::this_thread::sleep_for(20ms);
  r = ctl({"stuck"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(contains(r.output, "t-stuck")) << "younger than the default 1m:\n" << r.output;
  r = ctl({"stuck", "--older-than", "10ms"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  expect_output_has(r, {"t-stuck", "pending", "worker-x"});
  EXPECT_FALSE(contains(r.output, "t-done")) << r.output;
  r = ctl({"stuck", "--older-than", "10ms", "--json"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  json j = json::parse(r.output);
  ASSERT_EQ(j.at("count").get<int>(), 1) << r.output;
  EXPECT_EQ(j.at("transfers")[0].at("id").get<std::string>(), "t-stuck");
  EXPECT_EQ(j.at("transfers")[0].at("state").get<std::string>(), "pending");
  EXPECT_EQ(j.at("transfers")[0].at("owner").get<std::string>(), "worker-x");
  EXPECT_EQ(j.at("transfers")[0].at("attempts").get<int>(), 0);

  r = ctl({"cancel", "t-stuck"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "canceled")) << r.output;
  // The log line an operator finds by transfer id (stderr, with fields).
  EXPECT_TRUE(contains(r.output, "action=cancel transfer_id=t-stuck operator=sagactl@" + hostname() +
                                     " result=done state=canceled")) << r.output;
  TransferDoc d = transfer("t-stuck");
  EXPECT_EQ(d.state, TransferState::canceled);
  EXPECT_EQ(d.reason, Reason::canceled_by_operator);
  EXPECT_EQ(d.owner, "sagactl@" + hostname());
  EXPECT_EQ(d.epoch, 2);
  r = ctl({"transfer", "show", "t-stuck"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_output_has(r, {"state         canceled (canceled_by_operator)", "postings      none",
                        "owner sagactl@" + hostname() + " at epoch 2 after 1 take-over(s)"});
  r = ctl({"cancel", "t-stuck"});
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_TRUE(contains(r.output, "already canceled")) << r.output;
  r = ctl({"stuck", "--older-than", "0s", "--json"});
  EXPECT_EQ(json::parse(r.output).at("count").get<int>(), 0) << r.output;

  // A transfer left in initial: retry drives it to the end now.
  insert_transfer("t-retry", "alice", "bob", 25);
  r = ctl({"retry", "t-retry"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "is now done")) << r.output;
  d = transfer("t-retry");
  EXPECT_EQ(d.state, TransferState::done);
  EXPECT_EQ(d.attempts, 1);

  // Not found.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"transfer", "show", "nope"}, {"cancel", "nope"}, {"retry", "nope"}}) {
    r = ctl(args);
    EXPECT_EQ(r.exit_code, 4) << r.output;
    EXPECT_EQ(count_lines(r.output), 1u) << r.output;
  }

  // Balances and the accounts' view.
  EXPECT_EQ(account("alice")->balance, 1000 - 300 - 25);
  EXPECT_EQ(account("bob")->balance, 325);
  r = ctl({"accounts", "show", "alice"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_output_has(r, {"balance      675", "postings     last 2, newest first", "t-retry"});
  r = ctl({"audit"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST_F(SagactlTest, CancelReversesAPostedDebitAcrossStores) {
  init();
  // Accounts on different stores, so the legs cross shards.
  std::string src;
  std::string dst;
  for (int i = 0; src.empty() || dst.empty(); ++i) {
    const std::string id = "x-" + std::to_string(i);
    (ledger().shard_index(id) == 0 ? src : dst) = id;
  }
  ASSERT_EQ(ctl({"accounts", "create", src, "--balance", "100"}).exit_code, 0);
  ASSERT_EQ(ctl({"accounts", "create", dst, "--balance", "0"}).exit_code, 0);
  insert_transfer("t-half", src, dst, 60);
  {
    const Transition t{"t-half", TransferState::initial, TransferState::pending, Reason::none, "worker-x", 1};
    std::uint8_t applied = 0;
    ASSERT_TRUE(ledger().transfers().transition({&t, 1}, 30'000, {&applied, 1}).is_ok());
    const LegRequest debit{LegOp::debit, "t-half", src, 60, {}};
    LegResult result;
    ASSERT_TRUE(ledger().shard_for(src).apply_legs({&debit, 1}, {&result, 1}).is_ok());
    ASSERT_EQ(result.status, LegStatus::posted);
  }
  RunResult r = ctl({"accounts", "show", src});
  EXPECT_TRUE(contains(r.output, "pending      1 transfer(s): t-half")) << r.output;
  EXPECT_TRUE(contains(r.output, "balance      40")) << r.output;
  r = ctl({"transfer", "show", "t-half"});
  EXPECT_TRUE(contains(r.output, "state         pending")) << r.output;
  EXPECT_TRUE(contains(r.output, "postings      1")) << r.output;

  r = ctl({"cancel", "t-half"});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(account(src)->balance, 100);
  EXPECT_EQ(account(dst)->balance, 0);
  r = ctl({"transfer", "show", "t-half"});
  EXPECT_TRUE(contains(r.output, "reverse_debit posted on " + src + ": +60")) << r.output;
  EXPECT_TRUE(contains(r.output, "postings      2")) << r.output;
  r = ctl({"accounts", "show", src});
  EXPECT_TRUE(contains(r.output, "pending      0")) << r.output;
  EXPECT_EQ(ctl({"audit"}).exit_code, 0);
}

// ---- stores through SAGA_STORE, one a line -------------------------------------

// The Helm chart passes the stores as SAGA_STORE = URLs separated by newlines,
// never as --store arguments (a command line shows a password to anyone who
// can list processes). The order is the shard order.
TEST_F(SagactlTest, SeveralStoresThroughSagaStoreOneALine) {
  const std::vector<std::string> env{"SAGA_STORE=" + url_a_ + "\n" + url_b_};
  RunResult r = raw({"init"}, env);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  expect_output_has(r, {url_a_ + ": created schema", url_b_ + ": created schema", "shard 2 of 2"});
  for (std::size_t i = 0; i < 2; ++i) {
    std::optional<Topology> t;
    ASSERT_TRUE(ledger().shard(i).read_topology(t).is_ok());
    ASSERT_TRUE(t.has_value());
    EXPECT_EQ(t->shard_index, static_cast<int>(i));
    EXPECT_EQ(t->shard_count, 2);
  }

  r = raw({"audit"}, env);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "audit passed")) << r.output;
  r = raw({"accounts", "create", "env-2", "--balance", "7"}, env);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::size_t shard = ledger().shard_index("env-2");
  EXPECT_TRUE(contains(r.output, "store " + std::to_string(shard + 1) + " of 2")) << r.output;
  EXPECT_EQ(account("env-2").value_or(Account{}).balance, 7);

  // A trailing newline (as a YAML block scalar leaves) changes nothing.
  r = raw({"audit"}, {"SAGA_STORE=" + url_a_ + "\n" + url_b_ + "\n"});
  EXPECT_EQ(r.exit_code, 0) << r.output;

  // The lines are taken in order: swapped, the topology check refuses them.
  r = raw({"audit"}, {"SAGA_STORE=" + url_b_ + "\n" + url_a_});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(count_lines(r.output), 1u) << r.output;
  EXPECT_TRUE(contains(r.output, "sagactl: store #1 (" + url_b_ + ") is shard 2 of 2")) << r.output;

  // A --store flag replaces the whole list from the environment.
  r = raw({"--store", url_a_, "audit"}, env);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "given as store 1 of 1")) << r.output;
}

}  // namespace
}  // namespace sagapool::test
