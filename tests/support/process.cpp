#include "process.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <system_error>
#include <thread>

extern char** environ;

namespace sagapool::test {

std::filesystem::path bin_dir() { return SAGA_BIN_DIR; }
std::filesystem::path bin(const std::string& program) { return bin_dir() / program; }
std::filesystem::path source_dir() { return SAGA_SOURCE_DIR; }

TempDir::TempDir(const std::string& prefix) {
  std::random_device rd;
  const auto base = std::filesystem::temp_directory_path();
  for (int i = 0; i < 100; ++i) {
    auto candidate = base / (prefix + "-" + std::to_string(getpid()) + "-" + std::to_string(rd()));
    if (std::filesystem::create_directory(candidate)) {
      path_ = candidate;
      return;
    }
  }
  throw std::runtime_error("cannot create a temporary folder");
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

Process Process::start(const std::vector<std::string>& argv, const std::filesystem::path& log_file,
                       const Options& options) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  for (const auto& kv : options.env) env_strings.push_back(kv);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (auto& a : args) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  const std::string cwd = options.cwd ? options.cwd->string() : std::string();

  const int fd = ::open(log_file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "open " + log_file.string());
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fd);
    throw std::system_error(errno, std::generic_category(), "fork");
  }
  if (pid == 0) {
    // Only async-signal-safe calls from here to exec.
    ::setpgid(0, 0);
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, STDIN_FILENO);
    if (options.gid && (::setgroups(1, &*options.gid) != 0 || ::setgid(*options.gid) != 0)) _exit(126);
    if (options.uid && ::setuid(*options.uid) != 0) _exit(126);
    // After setuid, which clears it.
    if (options.death_signal != 0) {
      ::prctl(PR_SET_PDEATHSIG, options.death_signal);
      if (::getppid() != parent) _exit(125);  // the parent died before prctl
    }
    if (!cwd.empty() && ::chdir(cwd.c_str()) != 0) _exit(126);
    ::execve(cargv[0], cargv.data(), envp.data());
    _exit(127);
  }
  ::close(fd);
  Process p;
  p.pid_ = pid;
  return p;
}

Process::Process(Process&& other) noexcept : pid_(other.pid_), exit_code_(other.exit_code_) {
  other.pid_ = -1;
}

Process& Process::operator=(Process&& other) noexcept {
  if (this != &other) {
    if (pid_ > 0 && !exit_code_) {
      ::kill(pid_, SIGKILL);
      (void)wait(std::chrono::seconds(5));
    }
    pid_ = other.pid_;
    exit_code_ = other.exit_code_;
    other.pid_ = -1;
  }
  return *this;
}

Process::~Process() {
  if (pid_ > 0 && !exit_code_) {
    ::kill(-pid_, SIGKILL);  // its group: what it started dies with it
    ::kill(pid_, SIGKILL);
    (void)wait(std::chrono::seconds(10));
  }
}

bool Process::running() {
  if (pid_ <= 0 || exit_code_) return false;
  return !wait(std::chrono::milliseconds(0)).has_value();
}

void Process::signal(int sig) const {
  if (pid_ > 0 && !exit_code_) ::kill(pid_, sig);
}

std::optional<int> Process::wait(std::chrono::milliseconds timeout) {
  if (exit_code_) return exit_code_;
  if (pid_ <= 0) return -1;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return exit_code_;
    }
    if (r < 0) {
      exit_code_ = -1;
      return exit_code_;
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

int Process::stop(std::chrono::milliseconds grace) {
  if (pid_ <= 0) return -1;
  signal(SIGTERM);
  if (auto code = wait(grace)) return *code;
  signal(SIGKILL);
  return wait(std::chrono::seconds(10)).value_or(-1);
}

RunResult run(const std::vector<std::string>& argv, const std::vector<std::string>& env,
              std::chrono::milliseconds timeout) {
  TempDir dir("sagapool-run");
  const auto log = dir / "output";
  Process p = Process::start(argv, log, env);
  RunResult r;
  auto code = p.wait(timeout);
  if (!code) {
    p.signal(SIGKILL);
    code = p.wait(std::chrono::seconds(5));
    r.output = "[timed out]\n";
  }
  r.exit_code = code.value_or(-1);
  r.output += read_file(log);
  return r;
}

int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    throw std::system_error(errno, std::generic_category(), "bind");
  }
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

std::string random_hex(std::size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::random_device rd;
  std::string out;
  for (std::size_t i = 0; i < n; ++i) out.push_back(kDigits[rd() % 16]);
  return out;
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string last_lines(const std::string& text, std::size_t lines) {
  std::size_t at = text.size();
  for (std::size_t n = 0; n <= lines && at != std::string::npos && at > 0; ++n) {
    at = text.rfind('\n', at - 1);
  }
  return at == std::string::npos || at >= text.size() ? text : text.substr(at + 1);
}

std::string log_tails(const std::filesystem::path& dir, std::size_t lines) {
  std::vector<std::filesystem::path> logs;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    // Not into servers' data folders: Kafka's segments are *.log files too.
    if (it->is_directory() && it->path().filename() == "data") it.disable_recursion_pending();
    if (it->is_regular_file() && it->path().extension() == ".log") logs.push_back(it->path());
  }
  std::sort(logs.begin(), logs.end());
  std::string out;
  for (const auto& log : logs) {
    out += "--- " + std::filesystem::relative(log, dir).string() + "\n" +
           last_lines(read_file(log), lines) + "\n";
  }
  return out;
}

}  // namespace sagapool::test
