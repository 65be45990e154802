#include "ferret_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <stdexcept>
#include <thread>

namespace sagapool::test {

namespace fs = std::filesystem;

namespace {

// The build tools/mongodb/ferretdb.sh makes (its cache folder's name).
constexpr const char* kFerretVersion = "v1.24.2-idx";

std::string tail(const std::string& s, std::size_t n = 4000) {
  return s.size() <= n ? s : s.substr(s.size() - n);
}

bool is_executable(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec) && ::access(p.c_str(), X_OK) == 0;
}

// Whether something accepts TCP connections on 127.0.0.1:port.
bool accepts(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

std::optional<fs::path> find_ferretdb() {
  if (const char* env = std::getenv("SAGA_FERRETDB"); env != nullptr && env[0] != '\0') {
    if (is_executable(env)) return fs::path(env);
    return std::nullopt;
  }
  fs::path home;
  if (const char* env = std::getenv("SAGA_FERRETDB_HOME"); env != nullptr && env[0] != '\0') {
    home = env;
  } else if (const char* user_home = std::getenv("HOME"); user_home != nullptr) {
    home = fs::path(user_home) / ".cache" / "sagapool" / (std::string("ferretdb-") + kFerretVersion);
  } else {
    return std::nullopt;
  }
  if (is_executable(home / "ferretdb")) return home / "ferretdb";
  return std::nullopt;
}

FerretServer::FerretServer() {
  const auto binary = find_ferretdb();
  if (!binary) {
    throw std::runtime_error(
        "FerretDB not found: run tools/mongodb/ferretdb.sh fetch (./dev build does), or name the "
        "binary in SAGA_FERRETDB");
  }
  binary_ = *binary;
  log_file_ = dir_ / "server.log";
  fs::create_directory(dir_ / "data");
  fs::create_directory(dir_ / "state");
  // A port that was free a moment ago can be taken by the time the server
  // binds it: try a few.
  for (int attempt = 0;; ++attempt) {
    port_ = free_loopback_port();
    try {
      start();
      return;
    } catch (const std::runtime_error&) {
      if (attempt == 4) throw;
    }
  }
}

FerretServer::~FerretServer() {
  stop();
  server_.reset();
}

void FerretServer::launch() {
  // Loopback only, no debug listener, no telemetry (no traffic off the
  // machine); warnings and errors in server.log.
  const std::vector<std::string> argv = {
      binary_.string(),
      "--handler=sqlite",
      "--sqlite-url=file:" + (dir_ / "data").string() + "/",
      "--state-dir=" + (dir_ / "state").string(),
      "--listen-addr=127.0.0.1:" + std::to_string(port_),
      "--debug-addr=-",
      "--telemetry=disable",
      "--log-level=WARN",
  };
  // SIGKILL when the test process dies: nothing of a throwaway server is
  // worth a clean shutdown.
  server_ = std::make_unique<Process>(Process::start(
      argv, log_file_, Process::Options{.death_signal = SIGKILL, .cwd = dir_.path()}));
}

void FerretServer::start() {
  if (server_ && server_->running()) return;
  // Something else listening on the port would pass for this server below.
  if (accepts(port_)) {
    throw std::runtime_error("127.0.0.1:" + std::to_string(port_) + " is already in use");
  }
  launch();
  wait_ready(std::chrono::seconds(60));
}

void FerretServer::wait_ready(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (!server_->running()) {
      throw std::runtime_error("ferretdb exited during start-up:\n" + tail(log()));
    }
    if (accepts(port_)) return;
    if (std::chrono::steady_clock::now() >= deadline) {
      stop(std::chrono::seconds(1));
      throw std::runtime_error("ferretdb does not accept connections on 127.0.0.1:" +
                               std::to_string(port_) + " in time:\n" + tail(log()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

void FerretServer::stop(std::chrono::milliseconds grace) {
  if (!server_ || !server_->running()) return;
  const pid_t pid = server_->pid();
  server_->signal(SIGCONT);  // a frozen server could not take the SIGTERM
  (void)server_->stop(grace);
  // What it started, in its process group (SAGA_FERRETDB may name a wrapper
  // script), goes too.
  ::kill(-pid, SIGKILL);
}

void FerretServer::signal(int sig) {
  if (server_) server_->signal(sig);
}

bool FerretServer::running() { return server_ && server_->running(); }

std::string FerretServer::url(const std::string& database) const {
  return "mongodb://127.0.0.1:" + std::to_string(port_) + "/" + database;
}

std::string FerretServer::log() const { return read_file(log_file_); }

}  // namespace sagapool::test
