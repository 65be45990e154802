#pragma once
// A throwaway PostgreSQL server for tests: `initdb` into a temporary folder,
// listening on 127.0.0.1 at a free port with its own unix socket folder,
// stopped and removed when the object goes out of scope (also when the test
// fails, and — through PR_SET_PDEATHSIG — when the test process dies).
//
// Finds initdb/postgres under /usr/lib/postgresql/<version>/bin (the Debian
// layout; the highest version wins) unless SAGA_PG_BIN_DIR names a folder.
// PostgreSQL refuses to run as root: as root the server runs as the
// `postgres` system user (installed with Debian's `postgresql` package),
// falling back to `nobody`.
//
// Authentication: trust on the unix socket, scram-sha-256 over TCP, so the
// URLs handed out carry a real password.
//
// Create it on a thread that outlives it: the server's death signal is tied
// to the thread that started it.
#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "process.hpp"

namespace sagapool::test {

// The folder holding initdb and postgres, or nullopt when none is installed.
std::optional<std::filesystem::path> find_pg_bin_dir();

class PgServer {
 public:
  enum class StopMode { smart, fast, immediate };

  // initdb and start; throws std::runtime_error (with the server log's tail)
  // when either fails. `settings` are extra `name=value` server settings
  // (passed as -c), e.g. shared_preload_libraries=pg_stat_statements.
  PgServer();
  explicit PgServer(std::vector<std::string> settings);
  ~PgServer();
  PgServer(const PgServer&) = delete;
  PgServer& operator=(const PgServer&) = delete;

  // Stops the server (smart = SIGTERM, fast = SIGINT, immediate = SIGQUIT, as
  // pg_ctl does) and waits for it; SIGKILL after `grace`.
  void stop(StopMode mode = StopMode::fast,
            std::chrono::milliseconds grace = std::chrono::seconds(30));
  // Sends `sig` to the postmaster (SIGSTOP/SIGCONT to freeze it, SIGKILL).
  void signal(int sig);
  // Starts the server again on the same folder and port (after a stop).
  void start();
  bool running();

  // Creates a database and returns its URL.
  std::string create_database(const std::string& name);
  // Runs SQL through psql on the unix socket (ON_ERROR_STOP, unaligned tuples
  // only): for tests that reach under the store.
  RunResult psql(const std::string& database, const std::string& sql) const;
  // postgresql://USER:PASSWORD@127.0.0.1:PORT/DB
  std::string url(const std::string& database) const;
  const std::string& user() const { return user_; }
  const std::string& password() const { return password_; }
  int port() const { return port_; }
  std::string log() const;

 private:
  Process start(const std::vector<std::string>& argv) const;
  void launch();
  void wait_ready(std::chrono::milliseconds timeout);
  std::vector<std::string> client(const std::string& program) const;

  std::filesystem::path bin_dir_;
  TempDir dir_{"sagapool-pg"};
  std::filesystem::path data_dir_;
  std::filesystem::path socket_dir_;
  std::filesystem::path log_file_;
  std::string user_ = "saga";
  std::string password_;
  int port_ = 0;
  std::vector<std::string> settings_;
  std::optional<uid_t> run_uid_;
  std::optional<gid_t> run_gid_;
  std::unique_ptr<Process> server_;
};

}  // namespace sagapool::test
