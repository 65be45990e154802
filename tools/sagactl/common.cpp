// Small helpers every sagactl command uses: error lines, strict numbers,
// times and durations as operators read them.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <array>
#include <charconv>
#include <cstdint>
#include <ctime>
#include <iostream>

#include "commands.hpp"

namespace sagapool::ctl {

int fail(int code, std::string_view message) {
  std::cerr << "sagactl: " << message << '\n';
  return code;
}

int fail(const Status& s) { return fail(kExitFailed, s.message()); }

bool parse_int64(std::string_view text, std::int64_t& out) {
  std::string_view digits = text;
  if (!digits.empty() && digits.front() == '-') digits.remove_prefix(1);
  if (digits.empty() || (digits.size() > 1 && digits.front() == '0')) return false;
  for (char c : digits) {
    if (c < '0' || c > '9') return false;
  }
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, out, 10);
  return ec == std::errc() && ptr == end;
}

bool is_valid_currency(std::string_view text) noexcept {
  if (text.empty()) return true;
  if (text.size() != 3) return false;
  for (char c : text) {
    if (c < 'A' || c > 'Z') return false;
  }
  return true;
}

std::string format_time_ms(std::int64_t ms) {
  if (ms <= 0) return "-";
  const std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  if (gmtime_r(&secs, &tm) == nullptr) return std::to_string(ms) + "ms";
  std::array<char, 32> buf{};
  const std::size_t n = std::strftime(buf.data(), buf.size(), "%Y-%m-%dT%H:%M:%S", &tm);
  std::string out(buf.data(), n);
  const auto frac = static_cast<int>(ms % 1000);
  out += '.';
  out += static_cast<char>('0' + frac / 100);
  out += static_cast<char>('0' + frac / 10 % 10);
  out += static_cast<char>('0' + frac % 10);
  out += 'Z';
  return out;
}

std::string format_duration_ms(std::int64_t ms) {
  if (ms < 0) return "-" + format_duration_ms(ms == INT64_MIN ? INT64_MAX : -ms);
  if (ms < 1000) return std::to_string(ms) + "ms";
  const std::int64_t s = ms / 1000;
  auto two = [](std::int64_t v) { return (v < 10 ? "0" : "") + std::to_string(v); };
  if (s < 60) return std::to_string(s) + "s";
  if (s < 3600) return std::to_string(s / 60) + "m" + two(s % 60) + "s";
  if (s < 86400) return std::to_string(s / 3600) + "h" + two(s / 60 % 60) + "m";
  return std::to_string(s / 86400) + "d" + two(s / 3600 % 24) + "h";
}

std::string describe_shard(Ledger& ledger, std::size_t index) {
  return "store " + std::to_string(index + 1) + " of " + std::to_string(ledger.shard_count()) +
         " (" + ledger.shard(index).display_name() + ")";
}

std::string operator_id() {
  std::array<char, 256> host{};
  if (gethostname(host.data(), host.size() - 1) != 0 || host[0] == '\0') {
    return "sagactl@unknown-host";
  }
  return "sagactl@" + std::string(host.data());
}

void add_show_command(CLI::App& parent, Action& action, const std::string& description,
                      const std::string& what, std::function<int(Ledger&, const std::string&, bool)> show) {
  struct Args {
    std::string id;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = parent.add_subcommand("show", description);
  cmd->add_option("ID", args->id, what + " id")->required();
  cmd->add_flag("--json", args->json, "print it as one JSON object");
  cmd->callback([&action, args, show] {
    action = {true, [args, show](Ledger& ledger) { return show(ledger, args->id, args->json); }};
  });
}

}  // namespace sagapool::ctl
