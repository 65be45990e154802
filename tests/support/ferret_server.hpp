#pragma once
// A throwaway FerretDB (MongoDB's wire protocol on SQLite) for the mongodb://
// store's tests: one server in a temporary folder, listening on 127.0.0.1 at
// a free port, stopped and removed when the object goes out of scope (also
// when the test fails, and — through PR_SET_PDEATHSIG — when the test
// process dies).
//
// The binary is the one tools/mongodb/ferretdb.sh fetch builds (./dev does),
// or the one SAGA_FERRETDB names. No authentication: the URLs carry no
// credentials.
//
// Create it on a thread that outlives it: the server's death signal is tied
// to the thread that started it.
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "process.hpp"

namespace sagapool::test {

// The FerretDB binary: SAGA_FERRETDB when set, else ferretdb.sh's cache
// (SAGA_FERRETDB_HOME, default ~/.cache/sagapool/ferretdb-v1.24.2-idx); nullopt
// when it is not there.
std::optional<std::filesystem::path> find_ferretdb();

class FerretServer {
 public:
  // Starts the server and waits until it accepts connections; throws
  // std::runtime_error (with the server log's tail) when it cannot.
  FerretServer();
  ~FerretServer();
  FerretServer(const FerretServer&) = delete;
  FerretServer& operator=(const FerretServer&) = delete;

  // SIGTERM (FerretDB's clean shutdown), SIGKILL after `grace`.
  void stop(std::chrono::milliseconds grace = std::chrono::seconds(10));
  // Starts the server again on the same folder and port (after a stop, or a
  // SIGKILL sent with signal()): the databases written before are still there.
  void start();
  bool running();
  // Sends `sig` to the server (SIGSTOP/SIGCONT to freeze it, SIGKILL).
  void signal(int sig);

  // mongodb://127.0.0.1:PORT/DATABASE
  std::string url(const std::string& database) const;
  // MongoDB creates a database on its first write: nothing to do but name it.
  std::string create_database(const std::string& name) { return url(name); }
  int port() const { return port_; }
  // The server's folder: data/ (one SQLite file per database), state/, server.log.
  const std::filesystem::path& dir() const { return dir_.path(); }
  std::string log() const;

 private:
  void launch();
  void wait_ready(std::chrono::milliseconds timeout);

  std::filesystem::path binary_;
  TempDir dir_{"sagapool-ferret"};
  std::filesystem::path log_file_;
  int port_ = 0;
  std::unique_ptr<Process> server_;
};

}  // namespace sagapool::test
