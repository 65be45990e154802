#include "sagapool/named_sql.hpp"

#include <stdexcept>

namespace sagapool {

NamedSql::NamedSql(std::string_view file) {
  constexpr std::string_view kMarker = "-- name: ";
  for (std::size_t pos = 0; pos < file.size();) {
    std::size_t end = file.find('\n', pos);
    if (end == std::string_view::npos) end = file.size();
    std::string_view line = file.substr(pos, end - pos);
    pos = end + 1;
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.remove_suffix(1);
    if (line.starts_with(kMarker)) {
      const std::string_view name = line.substr(kMarker.size());
      for (const auto& [known, text] : statements_) {
        if (known == name) throw std::logic_error("statement " + std::string(name) + " named twice");
      }
      statements_.emplace_back(std::string(name), std::string());
    } else if (!line.empty() && !line.starts_with("--") && !statements_.empty()) {
      std::string& text = statements_.back().second;
      if (!text.empty()) text += ' ';
      text += line;
    }
  }
  for (auto& [name, text] : statements_) {
    if (!text.empty() && text.back() == ';') text.pop_back();
    if (text.empty()) throw std::logic_error("statement " + name + " has no text");
  }
}

const std::string& NamedSql::operator[](std::string_view name) const {
  for (const auto& [known, text] : statements_) {
    if (known == name) return text;
  }
  throw std::logic_error("no statement named " + std::string(name));
}

}  // namespace sagapool
