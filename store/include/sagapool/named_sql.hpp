#pragma once
// A backend's statements, kept as a .sql file of named statements and
// embedded at build time (cmake/embed_sql.cmake). Each statement starts at a
// line `-- name: NAME`; the lines up to the next such line are its text,
// trimmed and joined with single spaces, without comment lines or a closing
// semicolon.
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sagapool {

class NamedSql {
 public:
  // Throws std::logic_error for a name given twice or a statement with no
  // text: the file is part of the build, so either is a build mistake.
  explicit NamedSql(std::string_view file);

  // The statement's text; throws std::logic_error for a name the file lacks.
  const std::string& operator[](std::string_view name) const;

  std::size_t size() const noexcept { return statements_.size(); }

 private:
  std::vector<std::pair<std::string, std::string>> statements_;  // (name, text)
};

}  // namespace sagapool
