#include "kafka_raw.hpp"

#include <arpa/inet.h>
#include <librdkafka/rdkafka.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <stdexcept>

namespace sagapool::test {
namespace {

struct RkDeleter {
  void operator()(rd_kafka_t* rk) const { rd_kafka_destroy(rk); }
};

std::atomic<int> g_raw_failed{0};
void count_raw_failures(rd_kafka_t*, const rd_kafka_message_t* m, void*) {
  if (m->err) ++g_raw_failed;
}

}  // namespace

void produce_raw(const std::string& brokers, const std::string& topic,
                 const std::vector<RawMessage>& messages) {
  char err[512];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  const std::pair<const char*, std::string> props[] = {
      {"bootstrap.servers", brokers}, {"linger.ms", "5"}, {"message.max.bytes", "2000000"}};
  for (const auto& [k, v] : props) {
    if (rd_kafka_conf_set(conf, k, v.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK) {
      rd_kafka_conf_destroy(conf);
      throw std::runtime_error(err);
    }
  }
  rd_kafka_conf_set_dr_msg_cb(conf, &count_raw_failures);
  std::unique_ptr<rd_kafka_t, RkDeleter> rk(rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err));
  if (!rk) {
    rd_kafka_conf_destroy(conf);
    throw std::runtime_error(err);
  }
  g_raw_failed = 0;
  for (const RawMessage& m : messages) {
    rd_kafka_headers_t* headers = rd_kafka_headers_new(m.headers.size());
    for (const auto& [name, value] : m.headers) {
      rd_kafka_header_add(headers, name.data(), static_cast<ssize_t>(name.size()),
                          value ? value->data() : nullptr, value ? static_cast<ssize_t>(value->size()) : 0);
    }
    const void* key = m.key ? m.key->data() : nullptr;
    const std::size_t key_len = m.key ? m.key->size() : 0;
    void* value = m.value ? const_cast<char*>(m.value->data()) : nullptr;
    const std::size_t value_len = m.value ? m.value->size() : 0;
    rd_kafka_resp_err_t e = RD_KAFKA_RESP_ERR__QUEUE_FULL;
    while (e == RD_KAFKA_RESP_ERR__QUEUE_FULL) {
      e = rd_kafka_producev(rk.get(), RD_KAFKA_V_TOPIC(topic.c_str()), RD_KAFKA_V_KEY(key, key_len),
                            RD_KAFKA_V_VALUE(value, value_len), RD_KAFKA_V_HEADERS(headers),
                            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
      if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL) rd_kafka_poll(rk.get(), 100);
    }
    if (e) {
      rd_kafka_headers_destroy(headers);  // not taken over on failure
      throw std::runtime_error(std::string("produce: ") + rd_kafka_err2str(e));
    }
    rd_kafka_poll(rk.get(), 0);
  }
  if (rd_kafka_flush(rk.get(), 60'000) != RD_KAFKA_RESP_ERR_NO_ERROR || g_raw_failed > 0) {
    throw std::runtime_error("produce: not every message was delivered");
  }
}

std::string http_get_body(const std::string& host, int port, const std::string& path, int timeout_ms) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return "";
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1 ||
      ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return "";
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: " + host + "\r\nConnection: close\r\n\r\n";
  if (::send(fd, request.data(), request.size(), 0) != static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return "";
  }
  std::string response;
  char buf[8192];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    response.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  const std::size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

double metric_value(const std::string& exposition, const std::string& name, const std::string& labels) {
  const std::string needle = labels.empty() ? name + " " : name + "{" + labels + "} ";
  std::size_t at = 0;
  while ((at = exposition.find(needle, at)) != std::string::npos) {
    if (at == 0 || exposition[at - 1] == '\n') {
      return std::strtod(exposition.c_str() + at + needle.size(), nullptr);
    }
    at += needle.size();
  }
  return -1;
}

}  // namespace sagapool::test
