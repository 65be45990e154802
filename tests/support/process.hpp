#pragma once
// Child processes and temporary folders for tests that start real programs
// and servers. Every child is killed (SIGKILL, with its process group) when
// its Process goes out of scope, so a failing test never leaves a server
// behind.
#include <sys/types.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace sagapool::test {

// The folder holding the built programs (build/bin).
std::filesystem::path bin_dir();
std::filesystem::path bin(const std::string& program);
std::filesystem::path source_dir();

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "sagapool-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

class Process {
 public:
  Process() = default;
  struct Options {
    std::vector<std::string> env;  // "K=V", added to the current environment
    // Sent to the child when the thread that started it ends (the test's
    // main thread: the test process), so a server outlives no test; 0: none.
    int death_signal = 0;
    std::optional<std::filesystem::path> cwd{};
    std::optional<uid_t> uid{};  // run as this user and group (a test run as root)
    std::optional<gid_t> gid{};
  };
  // Starts argv[0] with argv in a process group of its own; stdout and
  // stderr go to `log_file` (appended).
  static Process start(const std::vector<std::string>& argv, const std::filesystem::path& log_file,
                       const Options& options);
  static Process start(const std::vector<std::string>& argv, const std::filesystem::path& log_file,
                       const std::vector<std::string>& env = {}, bool die_with_parent = false) {
    return start(argv, log_file, Options{.env = env, .death_signal = die_with_parent ? SIGKILL : 0});
  }
  Process(Process&& other) noexcept;
  Process& operator=(Process&& other) noexcept;
  ~Process();

  pid_t pid() const { return pid_; }
  bool running();
  void signal(int sig) const;
  // Waits for exit; the exit code (128+signal if killed), or nullopt on timeout.
  std::optional<int> wait(std::chrono::milliseconds timeout);
  // SIGTERM, wait up to `grace`, then SIGKILL.
  int stop(std::chrono::milliseconds grace = std::chrono::seconds(10));

 private:
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
};

// Runs a program to completion; returns its exit code and captured output.
struct RunResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr interleaved
};
RunResult run(const std::vector<std::string>& argv, const std::vector<std::string>& env = {},
              std::chrono::milliseconds timeout = std::chrono::seconds(120));

// A TCP port on 127.0.0.1 that was free a moment ago.
int free_loopback_port();

// Reads a whole file ("" if missing).
std::string read_file(const std::filesystem::path& p);

// The last `lines` lines of `text`, for failure messages.
std::string last_lines(const std::string& text, std::size_t lines);

// The last `lines` lines of every *.log file under `dir`, each headed by its
// path: what a test prints when it fails, so a CI log says why.
std::string log_tails(const std::filesystem::path& dir, std::size_t lines);

// n random hex digits (names, passwords and markers for tests).
std::string random_hex(std::size_t n);

// Polls `pred` every `poll` until it holds or `timeout` passes.
template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout,
                std::chrono::milliseconds poll = std::chrono::milliseconds(50)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(poll);
  }
  return pred();
}

}  // namespace sagapool::test

