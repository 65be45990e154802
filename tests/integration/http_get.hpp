#pragma once
// A minimal HTTP/1.0 GET over loopback for tests that scrape a worker or
// query Prometheus: status code and body, no dependencies.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdio>
#include <string>

namespace sagapool::test {

struct HttpReply {
  int status = 0;  // 0: no answer (refused, timed out, malformed)
  std::string body;
};

// GET http://ip:port/target (ip: an IPv4 address).
inline HttpReply http_get_at(const std::string& ip, int port, const std::string& target,
                             int timeout_s = 5) {
  HttpReply reply;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return reply;
  timeval tv{};
  tv.tv_sec = timeout_s;
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  if (::inet_pton(AF_INET, ip.c_str(), &addr.sin_addr) != 1) {
    ::close(fd);
    return reply;
  }
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return reply;
  }
  const std::string request = "GET " + target + " HTTP/1.0\r\nHost: " + ip + "\r\nConnection: close\r\n\r\n";
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return reply;
  }
  std::string raw;
  char buf[16384];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    raw.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  const std::size_t head_end = raw.find("\r\n\r\n");
  int status = 0;
  if (head_end == std::string::npos || std::sscanf(raw.c_str(), "HTTP/%*d.%*d %d", &status) != 1) return reply;
  reply.status = status;
  reply.body = raw.substr(head_end + 4);
  return reply;
}

inline HttpReply http_get(int port, const std::string& target, int timeout_s = 5) {
  return http_get_at("127.0.0.1", port, target, timeout_s);
}

// Percent-encodes a query parameter value.
inline std::string url_encode(const std::string& s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
        c == '_' || c == '.' || c == '~') {
      out += ch;
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

}  // namespace sagapool::test
