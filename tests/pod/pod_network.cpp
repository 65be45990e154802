#include "pod_network.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <system_error>

namespace sagapool::test {

namespace {

sockaddr_in loopback(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  return addr;
}

// Runs `make` on a thread that entered the namespace at `ns_path`, so the
// socket it creates belongs to that namespace (a socket keeps the namespace
// it was made in, whichever thread uses it later).
template <typename Make>
int in_namespace(const std::string& ns_path, Make make) {
  int fd = -1;
  std::thread([&] {
    const int ns = ::open(ns_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0) return;
    if (::setns(ns, CLONE_NEWNET) == 0) fd = make();
    ::close(ns);
  }).join();
  return fd;
}

}  // namespace

struct PodNetwork::Connection {
  int inside = -1;   // accepted in the pod
  int outside = -1;  // to the service on the machine's loopback
  std::atomic<int> open_pumps{2};
  ~Connection() {
    if (inside >= 0) ::close(inside);
    if (outside >= 0) ::close(outside);
  }
};

PodNetwork::PodNetwork(const std::vector<int>& forwarded_ports) {
  int ready[2];
  if (::pipe2(ready, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe");
  holder_ = ::fork();
  if (holder_ < 0) throw std::system_error(errno, std::generic_category(), "fork");
  if (holder_ == 0) {
    // Only async-signal-safe calls here: the test process has threads.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::unshare(CLONE_NEWNET) != 0) _exit(1);
    const int s = ::socket(AF_INET, SOCK_DGRAM, 0);
    ifreq ifr{};
    std::memcpy(ifr.ifr_name, "lo", 3);
    if (s < 0 || ::ioctl(s, SIOCGIFFLAGS, &ifr) != 0) _exit(1);
    ifr.ifr_flags = static_cast<short>(ifr.ifr_flags | IFF_UP);
    if (::ioctl(s, SIOCSIFFLAGS, &ifr) != 0) _exit(1);
    (void)!::write(ready[1], "1", 1);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char byte = 0;
  const bool up = ::read(ready[0], &byte, 1) == 1;
  ::close(ready[0]);
  if (!up) {
    ::waitpid(holder_, nullptr, 0);
    holder_ = -1;
    throw std::runtime_error("cannot make a network namespace for a pod (needs root)");
  }
  for (const int port : forwarded_ports) {
    const int listener = in_namespace(path(), [port] {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      const sockaddr_in addr = loopback(port);
      if (fd < 0 || ::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 ||
          ::listen(fd, 64) != 0) {
        if (fd >= 0) ::close(fd);
        return -1;
      }
      return fd;
    });
    if (listener < 0) throw std::runtime_error("cannot listen on port " + std::to_string(port) + " in a pod");
    listeners_.push_back(listener);
    threads_.emplace_back([this, listener] { accept_loop(listener); });
  }
}

PodNetwork::~PodNetwork() {
  stopping_ = true;
  for (const int fd : listeners_) ::shutdown(fd, SHUT_RDWR);
  for (auto& t : threads_) t.join();
  for (const int fd : listeners_) ::close(fd);
  {
    std::lock_guard lock(mutex_);
    for (const auto& c : connections_) {
      ::shutdown(c->inside, SHUT_RDWR);
      ::shutdown(c->outside, SHUT_RDWR);
    }
  }
  for (auto& t : pumps_) t.join();
  if (holder_ > 0) {
    ::kill(holder_, SIGKILL);
    ::waitpid(holder_, nullptr, 0);
  }
}

std::string PodNetwork::path() const { return "/proc/" + std::to_string(holder_) + "/ns/net"; }

int PodNetwork::socket_inside() const {
  return in_namespace(path(), [] { return ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0); });
}

void PodNetwork::accept_loop(int listener) {
  sockaddr_in local{};
  socklen_t len = sizeof local;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&local), &len);
  const int port = ntohs(local.sin_port);
  while (!stopping_) {
    const int inside = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (inside < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // shut down
    }
    auto c = std::make_shared<Connection>();
    c->inside = inside;
    // This thread never entered the pod's namespace: the machine's loopback.
    c->outside = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const sockaddr_in addr = loopback(port);
    if (c->outside < 0 || ::connect(c->outside, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
      continue;  // the service is down: the pod sees its connection closed
    }
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    connections_.push_back(c);
    pumps_.emplace_back([this, c] { pump(c, true); });
    pumps_.emplace_back([this, c] { pump(c, false); });
  }
}

void PodNetwork::pump(std::shared_ptr<Connection> c, bool inbound) {
  const int from = inbound ? c->inside : c->outside;
  const int to = inbound ? c->outside : c->inside;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(from, buf, sizeof buf);
    if (n <= 0) break;
    ssize_t sent = 0;
    while (sent < n) {
      const ssize_t w = ::send(to, buf + sent, static_cast<std::size_t>(n - sent), MSG_NOSIGNAL);
      if (w <= 0) break;
      sent += w;
    }
    if (sent < n) break;
  }
  // One direction ended: pass the end on, and close both once both ended.
  ::shutdown(to, SHUT_WR);
  ::shutdown(from, SHUT_RD);
  if (--c->open_pumps == 0) {
    std::lock_guard lock(mutex_);
    std::erase(connections_, c);
  }
}

int probe_http(const PodNetwork& network, int port, const std::string& path, int timeout_s) {
  const int fd = network.socket_inside();
  if (fd < 0) return 0;
  timeval tv{};
  tv.tv_sec = timeout_s;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  const sockaddr_in addr = loopback(port);
  std::string raw;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) {
    const std::string request = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) +
                                "\r\nUser-Agent: kube-probe/1.30\r\nConnection: close\r\n\r\n";
    if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
      char buf[4096];
      ssize_t n;
      while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) raw.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  int status = 0;
  if (std::sscanf(raw.c_str(), "HTTP/%*d.%*d %d", &status) != 1) return 0;
  return status;
}

}  // namespace sagapool::test
