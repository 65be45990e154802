#include "pg_server.hpp"

#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <stdexcept>
#include <system_error>
#include <thread>

namespace sagapool::test {

namespace fs = std::filesystem;

namespace {

std::string tail(const std::string& s, std::size_t n = 4000) {
  return s.size() <= n ? s : s.substr(s.size() - n);
}

void chown_to(const fs::path& p, std::optional<uid_t> uid, std::optional<gid_t> gid) {
  if (!uid) return;
  if (::chown(p.c_str(), *uid, gid.value_or(static_cast<gid_t>(-1))) != 0) {
    throw std::system_error(errno, std::generic_category(), "chown " + p.string());
  }
}

}  // namespace

std::optional<fs::path> find_pg_bin_dir() {
  if (const char* env = std::getenv("SAGA_PG_BIN_DIR"); env != nullptr && env[0] != '\0') {
    if (fs::exists(fs::path(env) / "postgres")) return fs::path(env);
    return std::nullopt;
  }
  std::optional<fs::path> best;
  int best_version = -1;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/usr/lib/postgresql", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() ||
        !std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; }))
      continue;
    const int version = std::stoi(name);
    const fs::path bin = entry.path() / "bin";
    if (version > best_version && fs::exists(bin / "postgres") && fs::exists(bin / "initdb")) {
      best = bin;
      best_version = version;
    }
  }
  return best;
}

PgServer::PgServer() : PgServer(std::vector<std::string>{}) {}

PgServer::PgServer(std::vector<std::string> settings) : settings_(std::move(settings)) {
  const auto bin = find_pg_bin_dir();
  if (!bin) {
    throw std::runtime_error(
        "PostgreSQL server binaries not found under /usr/lib/postgresql/<version>/bin "
        "(install Debian's `postgresql` package, or set SAGA_PG_BIN_DIR)");
  }
  bin_dir_ = *bin;
  if (::geteuid() == 0) {
    const passwd* pw = ::getpwnam("postgres");
    if (pw == nullptr) pw = ::getpwnam("nobody");
    if (pw == nullptr)
      throw std::runtime_error("running as root and no `postgres` or `nobody` user");
    run_uid_ = pw->pw_uid;
    run_gid_ = pw->pw_gid;
    // The server's user must reach its folders inside ours.
    fs::permissions(dir_.path(), fs::perms::owner_all | fs::perms::group_read |
                                     fs::perms::group_exec | fs::perms::others_read |
                                     fs::perms::others_exec);
  }
  data_dir_ = dir_ / "data";
  socket_dir_ = dir_ / "socket";
  log_file_ = dir_ / "server.log";
  fs::create_directory(data_dir_);
  fs::create_directory(socket_dir_);
  fs::permissions(data_dir_, fs::perms::owner_all);
  fs::permissions(socket_dir_, fs::perms::owner_all);
  chown_to(data_dir_, run_uid_, run_gid_);
  chown_to(socket_dir_, run_uid_, run_gid_);

  password_ = random_hex(24);
  const fs::path pwfile = dir_ / "pwfile";
  {
    std::ofstream out(pwfile);
    out << password_ << "\n";
  }
  fs::permissions(pwfile, fs::perms::owner_read | fs::perms::owner_write);
  chown_to(pwfile, run_uid_, run_gid_);

  Process initdb = start({(bin_dir_ / "initdb").string(), "-D", data_dir_.string(), "-U", user_,
                          "--pwfile=" + pwfile.string(), "--auth-local=trust",
                          "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C", "--no-sync"});
  const auto code = initdb.wait(std::chrono::seconds(120));
  fs::remove(pwfile);
  if (code != 0) {
    throw std::runtime_error("initdb failed (exit " + std::to_string(code.value_or(-1)) + "):\n" +
                             tail(log()));
  }
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

PgServer::~PgServer() {
  if (server_ && server_->running()) {
    server_->signal(SIGINT);  // fast shutdown
    if (!server_->wait(std::chrono::seconds(30))) server_->signal(SIGKILL);
  }
  server_.reset();
}

void PgServer::launch() {
  // fsync=off and full_page_writes=off only matter if the machine itself
  // crashes; a killed server (immediate stop, SIGKILL) still keeps every
  // committed transaction, which fault tests rely on. So commits stay
  // synchronous (synchronous_commit=off would lose the last ones).
  // Prepared transactions (batches across stores, two-phase commit): more
  // than connections, so every connection can leave one prepared.
  std::vector<std::string> argv = {(bin_dir_ / "postgres").string(), "-D", data_dir_.string(),
                                   "-h", "127.0.0.1", "-p", std::to_string(port_),
                                   "-k", socket_dir_.string()};
  for (const char* setting : {"fsync=off", "full_page_writes=off", "max_connections=60",
                              "max_prepared_transactions=100", "shared_buffers=32MB",
                              "logging_collector=off"}) {
    argv.insert(argv.end(), {"-c", setting});
  }
  for (const std::string& setting : settings_) argv.insert(argv.end(), {"-c", setting});
  server_ = std::make_unique<Process>(start(argv));
}

void PgServer::start() {
  if (server_ && server_->running()) return;
  launch();
  wait_ready(std::chrono::seconds(60));
}

std::vector<std::string> PgServer::client(const std::string& program) const {
  return {(bin_dir_ / program).string(),
          "-h",
          socket_dir_.string(),
          "-p",
          std::to_string(port_),
          "-U",
          user_};
}

// initdb and postgres run in the server's folder, as an unprivileged user
// when the test runs as root; a server outliving a crashed test shuts down
// at once (SIGQUIT = immediate shutdown).
Process PgServer::start(const std::vector<std::string>& argv) const {
  return Process::start(argv, log_file_,
                        Process::Options{.death_signal = SIGQUIT,
                                         .cwd = dir_.path(),
                                         .uid = run_uid_,
                                         .gid = run_gid_});
}

void PgServer::wait_ready(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto argv = client("pg_isready");
  argv.insert(argv.end(), {"-d", "postgres", "-t", "2"});
  for (;;) {
    if (!server_->running()) {
      throw std::runtime_error("postgres exited during start-up:\n" + tail(log()));
    }
    if (run(argv, {}, std::chrono::seconds(10)).exit_code == 0) return;
    if (std::chrono::steady_clock::now() >= deadline) {
      stop(StopMode::immediate);
      throw std::runtime_error("postgres not ready in time:\n" + tail(log()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void PgServer::stop(StopMode mode, std::chrono::milliseconds grace) {
  if (!server_ || !server_->running()) return;
  const int sig = mode == StopMode::smart ? SIGTERM : mode == StopMode::fast ? SIGINT : SIGQUIT;
  server_->signal(sig);
  if (!server_->wait(grace)) {
    server_->signal(SIGKILL);
    (void)server_->wait(std::chrono::seconds(10));
  }
}

void PgServer::signal(int sig) {
  if (server_) server_->signal(sig);
}

bool PgServer::running() { return server_ && server_->running(); }

std::string PgServer::create_database(const std::string& name) {
  auto argv = client("createdb");
  argv.push_back(name);
  const RunResult r = run(argv, {}, std::chrono::seconds(60));
  if (r.exit_code != 0) {
    throw std::runtime_error("createdb " + name + " failed: " + r.output);
  }
  return url(name);
}

RunResult PgServer::psql(const std::string& database, const std::string& sql) const {
  auto argv = client("psql");
  argv.insert(argv.end(),
              {"-d", database, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql});
  return run(argv, {}, std::chrono::seconds(60));
}

std::string PgServer::url(const std::string& database) const {
  return "postgresql://" + user_ + ":" + password_ + "@127.0.0.1:" + std::to_string(port_) + "/" +
         database;
}

std::string PgServer::log() const { return read_file(log_file_); }

}  // namespace sagapool::test
