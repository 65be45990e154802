// libFuzzer target: the `sagactl accounts import` parser on arbitrary
// bytes. Besides "no crash, no hang, no sanitizer report": errors are
// bounded, and a file without errors yields only accounts the ledger can
// hold (valid ids, no id twice, balance >= min_balance, currency valid).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <string_view>

#include "import_parse.hpp"
#include "sagapool/request.hpp"

namespace {

void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_import_csv: violated: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  sagapool::ctl::ImportErrors errors("fuzz.csv");
  sagapool::ctl::ParsedImport out;
  sagapool::ctl::parse_accounts_csv(text, out, errors);
  require(errors.shown().size() <= sagapool::ctl::ImportErrors::kMaxShown, "at most 10 errors are kept");
  require(errors.shown().size() == std::min(errors.count(), sagapool::ctl::ImportErrors::kMaxShown),
          "errors are counted past the ones kept");
  for (const std::string& e : errors.shown()) require(e.rfind("fuzz.csv:", 0) == 0, "each error names the file");
  if (errors.any()) return 0;
  require(out.accounts.size() == out.lines.size(), "one line number per account");
  std::set<std::string> ids;
  std::size_t last_line = 1;
  for (std::size_t i = 0; i < out.accounts.size(); ++i) {
    const sagapool::Account& a = out.accounts[i];
    require(sagapool::is_valid_identifier(a.id, sagapool::kMaxAccountIdLength), "account ids are valid");
    require(ids.insert(a.id).second, "no account id twice");
    require(a.balance >= a.min_balance, "balance >= min_balance");
    require(a.opening_balance == a.balance, "an account opens at its balance");
    require(a.currency.empty() || (a.currency.size() == 3 && a.currency.find_first_not_of(
                                                                  "ABCDEFGHIJKLMNOPQRSTUVWXYZ") == std::string::npos),
            "currency is empty or 3 upper-case letters");
    require(out.lines[i] > last_line, "line numbers increase past the header");
    last_line = out.lines[i];
  }
  return 0;
}
