#include "sagapool/http_server.hpp"

#include <CivetServer.h>
#include <arpa/inet.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <sstream>
#include <string_view>

namespace sagapool {
namespace {

constexpr const char* kTextPlain = "text/plain; charset=utf-8";
constexpr const char* kPrometheusText = "text/plain; version=0.0.4; charset=utf-8";

void respond(mg_connection* conn, int status, const char* content_type, std::string_view body) {
  const char* reason = status == 200 ? "OK" : status == 503 ? "Service Unavailable" : "Internal Server Error";
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Cache-Control: no-store\r\nConnection: close\r\n\r\n",
            status, reason, content_type, body.size());
  mg_write(conn, body.data(), body.size());
}

void respond_health(mg_connection* conn, const std::function<HealthCheck()>& check) {
  HealthCheck h;
  try {
    h = check();
  } catch (const std::exception& e) {
    h = {false, std::string("check failed: ") + e.what()};
  }
  const std::string body = (h.ok ? "ok" : "not ok") + (h.detail.empty() ? "" : ": " + h.detail) + "\n";
  respond(conn, h.ok ? 200 : 503, kTextPlain, body);
}

// civetweb parses "listening_ports" loosely: "999.1.1.1:9464" binds
// 231.1.1.1 (each octet taken mod 256) instead of failing. So the address is
// checked here first: HOST:PORT with HOST an IPv4 address, a [IPv6] address
// or a host name, and PORT 1..65535. Returns why it is malformed, or "".
std::string malformed_address(const std::string& address) {
  const std::size_t colon = address.rfind(':');
  if (colon == std::string::npos) return "expected HOST:PORT, e.g. 127.0.0.1:9464 or 0.0.0.0:9464";
  const std::string host = address.substr(0, colon);
  const std::string port = address.substr(colon + 1);
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](unsigned char c) { return std::isdigit(c) != 0; }) ||
      std::stoi(port) < 1 || std::stoi(port) > 65535) {
    return "the port must be a number from 1 to 65535";
  }
  if (host.empty()) return "no host: give one, e.g. 127.0.0.1:" + port + " or 0.0.0.0:" + port;
  unsigned char buf[sizeof(in6_addr)];
  if (host.front() == '[') {
    if (host.back() != ']' || inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), buf) != 1) {
      return "'" + host + "' is not an IPv6 address in brackets";
    }
    return "";
  }
  const bool dotted = std::all_of(host.begin(), host.end(),
                                  [](unsigned char c) { return std::isdigit(c) != 0 || c == '.'; });
  if (dotted) {
    if (inet_pton(AF_INET, host.c_str(), buf) != 1) return "'" + host + "' is not an IPv4 address";
    return "";
  }
  const bool name = std::all_of(host.begin(), host.end(), [](unsigned char c) {
    return std::isalnum(c) != 0 || c == '-' || c == '.';
  });
  if (!name) return "'" + host + "' is neither an IP address nor a host name";
  return "";
}

}  // namespace

class HttpServer::Handler final : public CivetHandler {
 public:
  Handler(HttpServer& server, void (*fn)(HttpServer&, mg_connection*)) : server_(server), fn_(fn) {}
  using CivetHandler::handleGet;
  bool handleGet(CivetServer*, mg_connection* conn) override {
    fn_(server_, conn);
    return true;
  }

 private:
  HttpServer& server_;
  void (*fn_)(HttpServer&, mg_connection*);
};

Status HttpServer::start(const std::string& address, HttpRoutes routes, std::unique_ptr<HttpServer>& out) {
  if (const std::string why = malformed_address(address); !why.empty()) {
    return Status::fatal("malformed address '" + address + "': " + why);
  }
  auto server = std::unique_ptr<HttpServer>(new HttpServer());
  server->routes_ = std::move(routes);
  // Scrapes and probes are few and short: a handful of threads is plenty.
  const std::vector<std::string> options = {"listening_ports", address,     "num_threads",
                                            "4",               "request_timeout_ms", "10000"};
  try {
    server->server_ = std::make_unique<CivetServer>(options);
  } catch (const CivetException& e) {
    return Status::fatal("cannot listen on " + address +
                         " (port in use, or the address is not one of this host's): " + e.what());
  }
  auto add = [&](const char* uri, void (*fn)(HttpServer&, mg_connection*)) {
    server->handlers_.push_back(std::make_unique<Handler>(*server, fn));
    server->server_->addHandler(uri, server->handlers_.back().get());
  };
  // A trailing '$' makes civetweb match the path exactly.
  add("/metrics$", [](HttpServer& self, mg_connection* conn) {
    std::vector<prometheus::MetricFamily> families;
    try {
      for (const auto& weak : self.routes_.collectables) {
        if (auto c = weak.lock()) {
          auto f = c->Collect();
          families.insert(families.end(), std::make_move_iterator(f.begin()), std::make_move_iterator(f.end()));
        }
      }
      std::ostringstream body;
      prometheus::TextSerializer().Serialize(body, families);
      respond(conn, 200, kPrometheusText, body.str());
    } catch (const std::exception& e) {
      spdlog::warn("metrics: scrape failed: {}", e.what());
      respond(conn, 500, kTextPlain, std::string("scrape failed: ") + e.what() + "\n");
    }
  });
  add("/livez$", [](HttpServer& self, mg_connection* conn) { respond_health(conn, self.routes_.live); });
  add("/readyz$", [](HttpServer& self, mg_connection* conn) { respond_health(conn, self.routes_.ready); });
  out = std::move(server);
  return Status::ok();
}

HttpServer::~HttpServer() {
  if (server_) server_->close();  // joins the request threads before handlers_ go
}

}  // namespace sagapool
