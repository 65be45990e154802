#include "sagapool/outcome.hpp"

#include <ctime>

#include "sagapool/json_text.hpp"

namespace sagapool {

void append_utc_timestamp(std::int64_t ms, std::string& out) {
  const std::time_t secs = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[32];
  const std::size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  out.append(buf, n);
  char frac[8];
  const int m = std::snprintf(frac, sizeof frac, ".%03dZ", static_cast<int>(ms % 1000));
  out.append(frac, static_cast<std::size_t>(m));
}

void format_outcome(const OutcomeFields& f, std::string& out) {
  // Ids and account ids are validated to [A-Za-z0-9._:-]; escaping is still
  // applied so the output is JSON whatever a store returns.
  out.assign("{\"id\":\"");
  append_json_escaped(out, f.id);
  out += "\",\"state\":\"";
  out += to_string(f.state);
  out += "\",\"reason\":";
  if (f.reason == Reason::none) {
    out += "null";
  } else {
    out += '"';
    out += to_string(f.reason);
    out += '"';
  }
  out += ",\"from\":\"";
  append_json_escaped(out, f.from);
  out += "\",\"to\":\"";
  append_json_escaped(out, f.to);
  out += "\",\"amount\":";
  out += std::to_string(f.amount);
  out += ",\"currency\":";
  if (f.currency.empty()) {
    out += "null";
  } else {
    out += '"';
    append_json_escaped(out, f.currency);
    out += '"';
  }
  // Validated on the way in as one JSON object of at most 4 KiB.
  out += ",\"metadata\":";
  out += f.metadata.empty() ? std::string_view("null") : f.metadata;
  out += ",\"finished_at\":\"";
  append_utc_timestamp(f.finished_at_ms, out);
  out += "\"}";
}

void format_rejection(const RejectionFields& f, std::string& out) {
  out.assign("{\"id\":\"");
  append_json_escaped(out, f.id);
  out += "\",\"state\":\"rejected\",\"reason\":\"";
  out += to_string(f.reason);
  out += "\",\"error\":\"";
  append_json_escaped(out, f.error);
  out += "\",\"message\":\"";
  append_json_escaped(out, f.message);
  out += "\",\"request\":{\"topic\":\"";
  append_json_escaped(out, f.topic);
  out += "\",\"partition\":";
  out += std::to_string(f.partition);
  out += ",\"offset\":";
  out += std::to_string(f.offset);
  out += "},\"finished_at\":\"";
  append_utc_timestamp(f.rejected_at_ms, out);
  out += "\"}";
}

}  // namespace sagapool
