// saga-broker: a local Kafka-protocol broker for development and tests,
// built on librdkafka's mock cluster (rdkafka_mock.h). Creates the three
// sagapool topics, prints the bootstrap servers on one line, serves until
// SIGTERM/SIGINT, and takes fault-injection commands on a named pipe.
//
// Limits of the mock (librdkafka 2.0.2): in memory only; each partition
// keeps at most 5 MiB or 100,000 message sets and silently drops the oldest
// beyond that (we watch for it and warn); no SASL/TLS; transactions are not
// really emulated; listeners bind to 127.0.0.1 on ephemeral ports.
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <spdlog/spdlog.h>
#include <string>

#include "mock.hpp"
#include "sagapool/config.hpp"
#include "sagapool/kafka.hpp"
#include "sagapool/log.hpp"
#include "watch.hpp"

namespace {

namespace broker = sagapool::broker;
using sagapool::Status;

constexpr std::array<const char*, 3> kTopics = {"transfers.requests", "transfers.results",
                                                "transfers.dlq"};
constexpr std::size_t kMaxControlLine = 1024;

struct Options {
  int partitions = 12;
  int brokers = 3;
  std::string bootstrap_file;
  std::string control_fifo;
  std::string log_format = "text";
  std::string watch_interval = "5s";
};

// Writes `content` to a temporary file beside `path` and renames it into
// place, so a reader sees either no file or the whole line.
bool write_atomically(const std::string& path, const std::string& content, std::string& error) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << content;
    out.flush();
    if (!out) {
      error = "cannot write " + tmp;
      return false;
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    error = "cannot rename " + tmp + " to " + path + ": " + std::strerror(errno);
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

// A fd closed on scope exit.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Opens (creating if needed) the control FIFO. O_RDWR keeps a writer end
// open ourselves, so the pipe never reports EOF between clients.
int open_control_fifo(const std::string& path, std::string& error) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) {
    if (!S_ISFIFO(st.st_mode)) {
      error = path + " exists and is not a named pipe";
      return -1;
    }
  } else if (::mkfifo(path.c_str(), 0600) != 0) {
    error = "cannot create named pipe " + path + ": " + std::strerror(errno);
    return -1;
  }
  const int fd = ::open(path.c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) error = "cannot open " + path + ": " + std::strerror(errno);
  return fd;
}

// Reads what is available on the FIFO and runs each complete line.
void serve_control(int fd, std::string& pending, rd_kafka_mock_cluster_t& cluster) {
  std::array<char, 4096> buf{};
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n <= 0) break;
    pending.append(buf.data(), static_cast<std::size_t>(n));
  }
  std::size_t pos = 0;
  for (auto nl = pending.find('\n'); nl != std::string::npos; nl = pending.find('\n', pos)) {
    const std::string_view line(pending.data() + pos, nl - pos);
    pos = nl + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    bool ok = false;
    const std::string answer = broker::run_control_command(cluster, line, ok);
    if (ok) {
      spdlog::info("control: {} -> {}", line, answer);
    } else {
      spdlog::warn("control: {} -> {}", line, answer);
    }
  }
  pending.erase(0, pos);
  if (pending.size() > kMaxControlLine) {
    spdlog::warn("control: discarding {} bytes without a newline", pending.size());
    pending.clear();
  }
}

int serve(const Options& o) {
  sagapool::ConfPtr conf;
  if (Status s = sagapool::make_conf({{"client.id", "saga-broker"}}, conf); !s) {
    spdlog::error("{}", s.message());
    return 1;
  }
  broker::install_quiet_log_callbacks(*conf);
  std::array<char, 512> errstr{};
  sagapool::KafkaHandle rk(
      rd_kafka_new(RD_KAFKA_PRODUCER, conf.get(), errstr.data(), errstr.size()));
  if (!rk) {
    spdlog::error("cannot create the mock cluster's handle: {}", errstr.data());
    return 1;
  }
  (void)conf.release();
  broker::MockClusterPtr cluster(rd_kafka_mock_cluster_new(rk.get(), o.brokers));
  if (!cluster) {
    spdlog::error("cannot create the mock cluster");
    return 1;
  }
  const int replication = std::min(o.brokers, 3);
  for (const char* topic : kTopics) {
    const rd_kafka_resp_err_t err =
        rd_kafka_mock_topic_create(cluster.get(), topic, o.partitions, replication);
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      spdlog::error("cannot create topic {}: {}", topic, rd_kafka_err2str(err));
      return 1;
    }
  }
  const std::string bootstrap = rd_kafka_mock_cluster_bootstraps(cluster.get());

  std::string fifo_error;
  const Fd fifo(o.control_fifo.empty() ? -1 : open_control_fifo(o.control_fifo, fifo_error));
  if (!o.control_fifo.empty() && fifo.get() < 0) {
    spdlog::error("{}", fifo_error);
    return 1;
  }
  if (!o.bootstrap_file.empty()) {
    std::string error;
    if (!write_atomically(o.bootstrap_file, bootstrap + "\n", error)) {
      spdlog::error("{}", error);
      return 1;
    }
  }
  // The one line scripts read: bootstrap servers, flushed at once.
  std::fprintf(stdout, "%s\n", bootstrap.c_str());
  std::fflush(stdout);

  spdlog::info("{} broker(s), topics {} {} {} with {} partition(s) each, on {}",
               o.brokers, kTopics[0], kTopics[1], kTopics[2], o.partitions, bootstrap);
  spdlog::warn(
      "saga-broker: in-memory mock; each partition keeps at most {} MiB or {} message sets and "
      "DROPS the oldest beyond that, so a consumer lagging by more (about {} MiB per topic "
      "here) loses messages; drops are logged",
      broker::kMockPartitionMaxBytes / (1024 * 1024), broker::kMockPartitionMaxMessageSets,
      broker::kMockPartitionMaxBytes / (1024 * 1024) * o.partitions);
  if (fifo.get() >= 0) {
    spdlog::info("control pipe {} ({})", o.control_fifo, broker::control_help());
  }

  std::optional<broker::RetentionWatcher> watcher;
  const auto watch_ms = sagapool::parse_duration_ms(o.watch_interval).value_or(0);
  if (watch_ms > 0) {
    std::vector<std::string> topics(kTopics.begin(), kTopics.end());
    watcher.emplace(bootstrap, std::move(topics), o.partitions,
                    std::chrono::milliseconds(watch_ms));
    (void)watcher->start();
  }

  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  const Fd sigfd(::signalfd(-1, &mask, SFD_CLOEXEC));
  if (sigfd.get() < 0) {
    spdlog::error("signalfd: {}", std::strerror(errno));
    return 1;
  }
  std::string pending;
  for (;;) {
    std::array<pollfd, 2> fds{{{sigfd.get(), POLLIN, 0}, {fifo.get(), POLLIN, 0}}};
    const nfds_t nfds = fifo.get() >= 0 ? 2 : 1;
    if (::poll(fds.data(), nfds, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::error("poll: {}", std::strerror(errno));
      return 1;
    }
    if ((fds[0].revents & POLLIN) != 0) {
      signalfd_siginfo info{};
      (void)!::read(sigfd.get(), &info, sizeof info);
      spdlog::info("{} received, shutting down", strsignal(static_cast<int>(info.ssi_signo)));
      break;
    }
    if (nfds == 2 && (fds[1].revents & POLLIN) != 0) serve_control(fifo.get(), pending, *cluster);
  }

  if (watcher) watcher->stop();
  if (!o.control_fifo.empty()) ::unlink(o.control_fifo.c_str());
  // A stale bootstrap file would send the next reader to a dead port.
  if (!o.bootstrap_file.empty()) ::unlink(o.bootstrap_file.c_str());
  cluster.reset();  // before the handle it was created on
  rk.reset();
  spdlog::info("stopped");
  spdlog::default_logger()->flush();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "saga-broker: a local Kafka-protocol broker (librdkafka's mock cluster) for development "
      "and tests; in memory, loopback only"};
  app.add_option("--partitions", o.partitions,
                 "partitions of transfers.requests, transfers.results and transfers.dlq")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--brokers", o.brokers, "number of mock brokers (ids 1..N)")
      ->check(CLI::Range(1, 16))
      ->capture_default_str();
  app.add_option("--bootstrap-file", o.bootstrap_file,
                 "also write the bootstrap servers here (atomically; removed on exit)");
  app.add_option("--control-fifo", o.control_fifo,
                 "create this named pipe and read fault-injection commands from it, one per "
                 "line: down <broker|all>, up <broker|all>, rtt <broker|all> <ms>, errors "
                 "<api_key> <count> <ERR>, clear <api_key>, leader <topic> <partition> <broker>, "
                 "coordinator <group> <broker>");
  app.add_option("--watch-interval", o.watch_interval,
                 "how often to check for messages the mock dropped (0 = never)")
      ->capture_default_str();
  app.add_option("--log-format", o.log_format, "text or json")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  // Its own prefix: SAGA_BROKERS and SAGA_PARTITIONS belong to the
  // worker and the producer, which often share a shell with it.
  sagapool::finish_cli(app, "SAGA_BROKER_");
  if (auto code = sagapool::parse_cli(app, argc, argv)) return *code;
  if (!sagapool::parse_duration_ms(o.watch_interval)) {
    std::cerr << "saga-broker: --watch-interval: expected a duration like 5s\n";
    return 2;
  }

  // Block the stop signals before any thread exists (spdlog's flusher,
  // librdkafka's), so only the signalfd in the main loop sees them.
  sigset_t mask;
  sigemptyset(&mask);
  sigaddset(&mask, SIGTERM);
  sigaddset(&mask, SIGINT);
  if (::pthread_sigmask(SIG_BLOCK, &mask, nullptr) != 0) {
    std::cerr << "saga-broker: cannot block signals\n";
    return 1;
  }
  ::signal(SIGPIPE, SIG_IGN);
  sagapool::init_logging("saga-broker", *sagapool::parse_log_format(o.log_format));
  return serve(o);
}
