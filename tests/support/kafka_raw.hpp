#pragma once
// Producing what kafka_client.hpp cannot: null or binary keys and values,
// and message headers, for the hostile-input tests. Only new functions; the
// rest of the test support is unchanged.
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace sagapool::test {

struct RawMessage {
  std::optional<std::string> key;    // nullopt: a null key
  std::optional<std::string> value;  // nullopt: a null value (a tombstone)
  std::vector<std::pair<std::string, std::optional<std::string>>> headers;  // nullopt: a null header value
};

// Produces every message in order and waits for delivery; throws on failure.
void produce_raw(const std::string& brokers, const std::string& topic,
                 const std::vector<RawMessage>& messages);

// GET http://ADDR/PATH with a plain socket (the worker's metrics endpoint);
// the body, or "" if nothing answered within `timeout_ms`.
std::string http_get_body(const std::string& host, int port, const std::string& path, int timeout_ms = 5000);

// The value of the Prometheus sample `name{labels}` (labels exactly as
// exposed, e.g. `reason="invalid"`) in `exposition`; -1 if absent.
double metric_value(const std::string& exposition, const std::string& name, const std::string& labels);

}  // namespace sagapool::test
