#pragma once
// The worker's one HTTP listener (civetweb), on --metrics-addr:
//   GET /metrics  Prometheus text format: every registered Collectable
//   GET /livez    200 while the worker's loop is alive, 503 otherwise
//   GET /readyz   200 when the worker can do work (partitions assigned, store
//                 reachable), 503 otherwise
// The probes answer with one line of plain text saying why.
#include <prometheus/collectable.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "sagapool/status.hpp"

class CivetServer;

namespace sagapool {

struct HealthCheck {
  bool ok = false;
  std::string detail;  // one line, shown in the response body
};

struct HttpRoutes {
  std::vector<std::weak_ptr<prometheus::Collectable>> collectables;
  std::function<HealthCheck()> live;
  std::function<HealthCheck()> ready;
};

class HttpServer {
 public:
  // Listens on `address` only (host:port, e.g. 0.0.0.0:9464 or 127.0.0.1:9464;
  // a host name or [IPv6] also works). Fails, saying why, when the address is
  // malformed (checked here: civetweb accepts 999.1.1.1) or cannot be bound.
  static Status start(const std::string& address, HttpRoutes routes, std::unique_ptr<HttpServer>& out);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

 private:
  class Handler;
  HttpServer() = default;

  HttpRoutes routes_;
  std::vector<std::unique_ptr<Handler>> handlers_;  // outlive server_
  std::unique_ptr<CivetServer> server_;
};

}  // namespace sagapool
