#include "workload.hpp"

#include <chrono>
#include <cstdint>
#include <deque>
#include <random>

#include "sagapool/kafka.hpp"

namespace sagapool::chaos {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::int64_t kOrdinaryAmountMax = 25;
// Percent of requests of each kind; the rest are ordinary.
constexpr std::uint64_t kInvalidPercent = 2;
constexpr std::uint64_t kOverdraftPercent = 3;
constexpr std::uint64_t kUnknownPercent = 2;
constexpr std::uint64_t kResendPercent = 4;

std::string request_json(const PlannedRequest& r) {
  return R"({"id":")" + r.id + R"(","from":")" + r.from + R"(","to":")" + r.to +
         R"(","amount":)" + std::to_string(r.amount) + "}";
}

// Invalid bytes that still carry the request's id, so each dead letter can
// be matched to the message that caused it.
std::string invalid_json(const PlannedRequest& r, std::uint64_t variant) {
  const std::string head = R"({"id":")" + r.id + R"(","from":")" + r.from + R"(","to":)";
  switch (variant % 5) {
    case 0: return head + R"(")" + r.to + R"(","amount":0})";
    case 1: return head + R"(")" + r.from + R"(","amount":5})";
    case 2: return head + R"(")" + r.to + R"(","amount":1.5})";
    case 3: return head + R"(")" + r.to + R"(","amount":5,"colour":"red"})";
    default: return head;  // truncated
  }
}

}  // namespace

std::string account_id(int i) { return "acct-" + std::to_string(i); }

Workload plan_workload(std::uint64_t seed, int count, int accounts, std::int64_t opening) {
  std::mt19937_64 rng(seed);
  auto below = [&](std::uint64_t n) { return rng() % n; };
  Workload w;
  std::vector<std::size_t> valid_indexes;
  for (int n = 0; n < count; ++n) {
    PlannedRequest r;
    r.id = "c" + std::to_string(seed) + "-" + std::to_string(n);
    const auto accounts_u = static_cast<std::uint64_t>(accounts);
    const auto from = below(accounts_u);
    const auto to = (from + 1 + below(accounts_u - 1)) % accounts_u;
    r.from = account_id(static_cast<int>(from));
    r.to = account_id(static_cast<int>(to));
    r.amount = 1 + static_cast<std::int64_t>(below(kOrdinaryAmountMax));
    const auto dice = below(100);
    if (dice < kInvalidPercent) {
      r.kind = PlannedRequest::Kind::invalid;
      r.bytes = invalid_json(r, below(5));
    } else if (dice < kInvalidPercent + kOverdraftPercent) {
      r.kind = PlannedRequest::Kind::overdraft;
      r.amount = opening * accounts + 1;
    } else if (dice < kInvalidPercent + kOverdraftPercent + kUnknownPercent) {
      r.kind = PlannedRequest::Kind::unknown_account;
      (below(2) == 0 ? r.from : r.to) = "ghost-" + std::to_string(n);
    }
    if (r.kind != PlannedRequest::Kind::invalid) r.bytes = request_json(r);
    const std::size_t index = w.requests.size();
    w.requests.push_back(std::move(r));
    w.sends.push_back(index);
    if (w.requests[index].kind == PlannedRequest::Kind::invalid) {
      ++w.invalid;
      continue;
    }
    ++w.valid;
    valid_indexes.push_back(index);
    if (below(100) < kResendPercent) w.sends.push_back(valid_indexes[below(valid_indexes.size())]);
  }
  return w;
}

// Failed deliveries, by position in Workload::sends, to be sent again.
class FailedDeliveries final : public DeliveryHandler {
 public:
  void on_delivery(const rd_kafka_message_t& m) override {
    const auto send = reinterpret_cast<std::uintptr_t>(m._private);
    if (m.err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      failed.push_back(send);
    } else {
      ++delivered;
    }
    --outstanding;
  }
  std::deque<std::size_t> failed;
  std::uint64_t delivered = 0;
  std::uint64_t outstanding = 0;
};

Publisher::Publisher(std::string brokers, const Workload& workload, double rate)
    : brokers_(std::move(brokers)), workload_(workload), rate_(rate), thread_([this] { run(); }) {}

Publisher::~Publisher() {
  stop();
  thread_.join();
}

void Publisher::stop() { stop_ = true; }

std::string Publisher::error() const {
  std::lock_guard lock(error_mutex_);
  return error_;
}

void Publisher::run() {
  FailedDeliveries reports;
  KafkaProducerOptions options;
  options.brokers = brokers_;
  options.client_id = "saga-chaos";
  // Not idempotent: a message is simply sent again when its delivery fails,
  // and the workers recognise the copy.
  options.kafka_opts = {{"enable.idempotence", "false"}, {"message.timeout.ms", "10000"}};
  options.close_flush_timeout = std::chrono::seconds(1);
  std::unique_ptr<KafkaProducer> producer;
  if (Status s = KafkaProducer::create(options, &reports, producer); !s) {
    std::lock_guard lock(error_mutex_);
    error_ = s.message();
    return;
  }
  const auto started = Clock::now();
  std::size_t next = 0;
  auto send = [&](std::size_t position) {
    const PlannedRequest& r = workload_.requests[workload_.sends[position]];
    ++reports.outstanding;
    const Status s = producer->produce("transfers.requests", r.from, r.bytes, {},
                                       reinterpret_cast<void*>(std::uintptr_t{position}));
    if (!s) {
      --reports.outstanding;
      reports.failed.push_back(position);
    }
  };
  while (!stop_) {
    const double elapsed_s = std::chrono::duration<double>(Clock::now() - started).count();
    const auto due = std::min(workload_.sends.size(), static_cast<std::size_t>(elapsed_s * rate_));
    for (; next < due; ++next) send(next);
    for (std::size_t n = reports.failed.size(); n > 0; --n) {
      const std::size_t position = reports.failed.front();
      reports.failed.pop_front();
      ++resent_;
      send(position);
    }
    producer->poll(std::chrono::milliseconds(20));
    delivered_ = reports.delivered;
    if (next == workload_.sends.size() && reports.outstanding == 0 && reports.failed.empty()) {
      finished_ = true;
      break;
    }
  }
  (void)producer->close(std::chrono::seconds(1));  // after stop(): undelivered messages are dropped
  delivered_ = reports.delivered;
}

}  // namespace sagapool::chaos
