#pragma once
// Command-line plumbing shared by every program: every flag also reads
// SAGA_<FLAG_NAME> from the environment and an optional `--config FILE`
// (TOML). Precedence: flag > environment > file > default (CLI11's own order).
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace CLI {
class App;
}

namespace sagapool {

// "250ms", "30s", "5m", "1h"; a bare number is seconds. nullopt if malformed.
std::optional<std::int64_t> parse_duration_ms(std::string_view text) noexcept;

// Adds what every program takes: `--log-level`, `--version` and
// `--config FILE` (a key no flag has is an error), and for every option with
// a long name the environment variable <env_prefix><NAME> (dashes become
// underscores), SAGA_CONFIG included. Call after all options are defined.
// Appends the precedence rule to the footer of --help.
void finish_cli(CLI::App& app, std::string_view env_prefix = "SAGA_");

// Parses argv and applies --log-level; on a bad flag or config key prints
// one clear line (and a hint to --help) to stderr and returns the exit code
// to use; nullopt when parsing succeeded.
std::optional<int> parse_cli(CLI::App& app, int argc, char** argv);

// `key=value` pairs from --kafka-opt; a malformed one is a fatal flag error.
struct KeyValue {
  std::string key;
  std::string value;
};
std::optional<std::vector<KeyValue>> parse_key_values(const std::vector<std::string>& items,
                                                      std::string& error);

// Kafka SASL credentials from SAGA_KAFKA_SASL_USERNAME / SAGA_KAFKA_SASL_PASSWORD,
// appended to `opts` (so they win over --kafka-opt). The environment keeps
// them out of process listings, unlike a flag.
void add_kafka_sasl_from_env(std::vector<KeyValue>& opts);

// True for configuration keys whose values are secrets (passwords, SASL,
// keys): they are never printed or logged.
bool is_secret_key(std::string_view key) noexcept;

}  // namespace sagapool
