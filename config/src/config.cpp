#include "sagapool/config.hpp"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <iostream>

#include "sagapool/log.hpp"

namespace sagapool {

std::optional<std::int64_t> parse_duration_ms(std::string_view text) noexcept {
  std::int64_t value = 0;
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ec != std::errc() || ptr == begin || value < 0) return std::nullopt;
  const std::string_view unit(ptr, static_cast<std::size_t>(end - ptr));
  std::int64_t scale = 0;
  if (unit.empty() || unit == "s") scale = 1000;
  else if (unit == "ms") scale = 1;
  else if (unit == "m") scale = 60'000;
  else if (unit == "h") scale = 3'600'000;
  else return std::nullopt;
  if (value > INT64_MAX / scale) return std::nullopt;
  return value * scale;
}

namespace {
// The --log-level of this process, applied by parse_cli.
std::string g_log_level = "info";
}  // namespace

void finish_cli(CLI::App& app, std::string_view env_prefix) {
  app.add_option("--log-level", g_log_level,
                 "trace, debug, info, warn, error, critical or off (any case)")
      ->check([](const std::string& v) {
        return is_log_level(v) ? std::string() : "expected trace, debug, info, warn, error, critical or off";
      })
      ->capture_default_str();
  app.set_version_flag("--version", [&app] {
    const std::string& path = app.get_name();  // argv[0] by now
    return path.substr(path.find_last_of('/') + 1) + " " + SAGAPOOL_VERSION;
  });
  const std::string prefix(env_prefix);
  auto env_name = [&](const std::string& name) {
    std::string env = prefix;
    for (char c : name) {
      env += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    }
    return env;
  };
  for (CLI::Option* opt : app.get_options()) {
    const std::string& name = opt->get_single_name();
    if (opt->get_lnames().empty() || name == "help" || name == "version") continue;
    opt->envname(env_name(name));
  }
  // CLI11 reads the config file before the environment, so <prefix>CONFIG
  // becomes the option's default (a file that must exist) rather than its
  // envname.
  const char* from_env = std::getenv(env_name("config").c_str());
  const bool env_file = from_env != nullptr && *from_env != '\0';
  app.set_config("--config", env_file ? from_env : "",
                 "read flags from a TOML file (key = value, flag names as keys); also " + env_name("config"),
                 env_file);
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.footer(
      "Every flag can also be set through the environment variable " + prefix + "<FLAG_NAME> (for\n"
      "example --log-level -> " + prefix + "LOG_LEVEL) or in the --config TOML file.\n"
      "Precedence: flag > environment > config file > default.");
}

std::optional<int> parse_cli(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::Success& e) {
    return app.exit(e);
  } catch (const CLI::ConfigError& e) {
    // CLI11 says "INI was not able to parse KEY" for a key no flag has.
    std::string what = e.what();
    constexpr std::string_view kUnknown = "INI was not able to parse ";
    if (what.rfind(kUnknown, 0) == 0) {
      what = "unknown key '" + what.substr(kUnknown.size()) + "' in the --config file (no flag has that name)";
    }
    std::cerr << app.get_name() << ": " << what << " (see --help)\n";
    return 2;
  } catch (const CLI::ParseError& e) {
    std::cerr << app.get_name() << ": " << e.what() << " (see --help)\n";
    return 2;
  }
  set_log_level(g_log_level);
  return std::nullopt;
}

std::optional<std::vector<KeyValue>> parse_key_values(const std::vector<std::string>& items,
                                                      std::string& error) {
  std::vector<KeyValue> out;
  out.reserve(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    const std::string& item = items[i];
    const auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      // The item is not repeated: a typo such as `sasl.password:pw` or
      // `sasl.password= pw` (the shell makes `pw` an item of its own) would
      // print the secret.
      error = "expected key=value, but item " + std::to_string(i + 1) + " of " +
              std::to_string(items.size()) + (eq == 0 ? " has an empty key" : " has no '='") +
              " (not shown: it may hold a secret)";
      return std::nullopt;
    }
    out.push_back({item.substr(0, eq), item.substr(eq + 1)});
  }
  return out;
}

void add_kafka_sasl_from_env(std::vector<KeyValue>& opts) {
  if (const char* user = std::getenv("SAGA_KAFKA_SASL_USERNAME")) opts.push_back({"sasl.username", user});
  if (const char* pass = std::getenv("SAGA_KAFKA_SASL_PASSWORD")) opts.push_back({"sasl.password", pass});
}

bool is_secret_key(std::string_view key) noexcept {
  static constexpr std::string_view kMarkers[] = {"password", "secret", "sasl.jaas", "key.pem",
                                                  "token", "oauthbearer.config"};
  std::string lower(key);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return std::any_of(std::begin(kMarkers), std::end(kMarkers),
                     [&](std::string_view m) { return lower.find(m) != std::string::npos; });
}

}  // namespace sagapool
