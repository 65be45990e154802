#include "kafka_client.hpp"

#include <librdkafka/rdkafka.h>

#include <signal.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

namespace sagapool::test {
namespace {

struct RkDeleter {
  void operator()(rd_kafka_t* rk) const { rd_kafka_destroy(rk); }
};
using Rk = std::unique_ptr<rd_kafka_t, RkDeleter>;

Rk make_client(rd_kafka_type_t type, const std::vector<std::pair<std::string, std::string>>& props,
               void (*dr)(rd_kafka_t*, const rd_kafka_message_t*, void*) = nullptr,
               void* opaque = nullptr) {
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  char err[512];
  for (const auto& [k, v] : props) {
    if (rd_kafka_conf_set(conf, k.c_str(), v.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK) {
      rd_kafka_conf_destroy(conf);
      throw std::runtime_error(err);
    }
  }
  if (dr) rd_kafka_conf_set_dr_msg_cb(conf, dr);
  if (opaque) rd_kafka_conf_set_opaque(conf, opaque);
  rd_kafka_t* rk = rd_kafka_new(type, conf, err, sizeof err);
  if (!rk) {
    rd_kafka_conf_destroy(conf);
    throw std::runtime_error(err);
  }
  return Rk(rk);
}

std::size_t count_occurrences(const std::string& haystack, const std::string& needle) {
  std::size_t n = 0;
  for (auto at = haystack.find(needle); at != std::string::npos; at = haystack.find(needle, at + 1)) ++n;
  return n;
}

// Delivery reports run on the thread that polls: the count is its caller's.
void count_failures(rd_kafka_t*, const rd_kafka_message_t* m, void* failed) {
  if (m->err) ++*static_cast<int*>(failed);
}

}  // namespace

Broker Broker::kafka(const TempDir& dir, int partitions,
                     const std::vector<std::pair<std::string, std::string>>& requests_configs) {
  Broker b;
  b.kafka_ = std::make_unique<KafkaCluster>(dir, 1);
  b.kafka_->create_topic("transfers.requests", partitions, 1, requests_configs);
  for (const char* topic : {"transfers.results", "transfers.dlq"}) b.kafka_->create_topic(topic, partitions, 1);
  b.bootstrap_ = b.kafka_->bootstrap();
  return b;
}

void Broker::kill() {
  if (kafka_) {
    kafka_->kill(1);
    return;
  }
  process_.signal(SIGKILL);
  (void)process_.wait(std::chrono::seconds(10));
}

Broker Broker::start(const TempDir& dir, int partitions, int brokers) {
  Broker b;
  const auto file = dir / "bootstrap";
  b.control_ = dir / "broker.control";
  b.log_ = dir / "broker.log";
  b.process_ = Process::start({bin("saga-broker").string(), "--partitions", std::to_string(partitions),
                               "--brokers", std::to_string(brokers), "--bootstrap-file", file.string(),
                               "--control-fifo", b.control_.string()},
                              b.log_, {}, /*die_with_parent=*/true);
  if (!eventually([&] { return !read_file(file).empty() && std::filesystem::exists(b.control_); },
                  std::chrono::seconds(20))) {
    throw std::runtime_error("saga-broker did not start: " + read_file(dir / "broker.log"));
  }
  b.bootstrap_ = read_file(file);
  while (!b.bootstrap_.empty() && (b.bootstrap_.back() == '\n' || b.bootstrap_.back() == ' ')) {
    b.bootstrap_.pop_back();
  }
  return b;
}

void Broker::control(const std::string& command) {
  if (kafka_) throw std::logic_error("control('" + command + "'): a real Kafka has no control channel");
  const std::string logged = "control: " + command + " -> ";
  const std::size_t seen = count_occurrences(read_file(log_), logged);
  {
    std::ofstream fifo(control_);
    fifo << command << '\n';
  }
  std::string log;
  if (!eventually([&] { return count_occurrences(log = read_file(log_), logged) > seen; },
                  std::chrono::seconds(10))) {
    throw std::runtime_error("saga-broker did not answer '" + command + "': " + log);
  }
  const std::size_t at = log.rfind(logged) + logged.size();
  if (log.compare(at, 2, "ok") != 0) {
    throw std::runtime_error("saga-broker refused '" + command + "': " + log.substr(at, log.find('\n', at) - at));
  }
}

void produce(const std::string& brokers, const std::string& topic,
             const std::vector<std::pair<std::string, std::string>>& messages,
             const std::vector<std::pair<std::string, std::string>>& config) {
  int failed = 0;
  std::vector<std::pair<std::string, std::string>> props = {
      {"bootstrap.servers", brokers}, {"linger.ms", "1"}, {"message.timeout.ms", "30000"}};
  props.insert(props.end(), config.begin(), config.end());
  // Every message is delivered or has failed once its delivery timeout passed.
  long long timeout_ms = 0;
  for (const auto& [k, v] : props) {
    if (k == "message.timeout.ms") timeout_ms = std::stoll(v);
  }
  Rk rk = make_client(RD_KAFKA_PRODUCER, props, &count_failures, &failed);
  for (const auto& [key, value] : messages) {
    const rd_kafka_resp_err_t err = rd_kafka_producev(
        rk.get(), RD_KAFKA_V_TOPIC(topic.c_str()),
        RD_KAFKA_V_KEY(key.empty() ? nullptr : key.data(), key.size()),
        RD_KAFKA_V_VALUE(const_cast<char*>(value.data()), value.size()),
        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
    if (err) throw std::runtime_error(std::string("produce: ") + rd_kafka_err2str(err));
    rd_kafka_poll(rk.get(), 0);
  }
  if (rd_kafka_flush(rk.get(), static_cast<int>(timeout_ms) + 5'000) != RD_KAFKA_RESP_ERR_NO_ERROR ||
      failed > 0) {
    throw std::runtime_error("produce: not every message was delivered");
  }
}

std::vector<Record> consume(const std::string& brokers, const std::string& topic, std::size_t at_least,
                            std::chrono::milliseconds timeout, std::chrono::milliseconds settle,
                            const std::vector<std::pair<std::string, std::string>>& config) {
  std::random_device rd;
  std::vector<std::pair<std::string, std::string>> props = {
      {"bootstrap.servers", brokers},
      {"group.id", "test-reader-" + std::to_string(rd())},
      {"auto.offset.reset", "earliest"},
      {"enable.auto.commit", "false"}};
  props.insert(props.end(), config.begin(), config.end());
  Rk rk = make_client(RD_KAFKA_CONSUMER, props);
  rd_kafka_poll_set_consumer(rk.get());
  rd_kafka_topic_partition_list_t* topics = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(topics, topic.c_str(), RD_KAFKA_PARTITION_UA);
  rd_kafka_subscribe(rk.get(), topics);
  rd_kafka_topic_partition_list_destroy(topics);
  std::vector<Record> out;
  const auto start = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point reached{};
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    if (out.size() >= at_least && reached == std::chrono::steady_clock::time_point{}) reached = now;
    if (reached != std::chrono::steady_clock::time_point{} && now - reached >= settle) break;
    if (reached == std::chrono::steady_clock::time_point{} && now - start >= timeout) break;
    rd_kafka_message_t* m = rd_kafka_consumer_poll(rk.get(), 100);
    if (!m) continue;
    if (!m->err) {
      Record r;
      if (m->key) r.key.assign(static_cast<const char*>(m->key), m->key_len);
      if (m->payload) r.value.assign(static_cast<const char*>(m->payload), m->len);
      r.partition = m->partition;
      r.offset = m->offset;
      rd_kafka_timestamp_type_t type;
      r.timestamp_ms = rd_kafka_message_timestamp(m, &type);
      rd_kafka_headers_t* hdrs = nullptr;
      if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        const char* name;
        const void* val;
        size_t size;
        for (size_t i = 0; rd_kafka_header_get_all(hdrs, i, &name, &val, &size) == RD_KAFKA_RESP_ERR_NO_ERROR; ++i) {
          r.headers[name] = val ? std::string(static_cast<const char*>(val), size) : "";
          r.header_list.emplace_back(name, val ? std::optional<std::string>(std::string(static_cast<const char*>(val), size))
                                               : std::nullopt);
        }
      }
      out.push_back(std::move(r));
    }
    rd_kafka_message_destroy(m);
  }
  rd_kafka_consumer_close(rk.get());
  return out;
}

namespace {

// Reads until every one of `wanted` is the `name` of some record.
std::vector<Record> consume_covering(const std::string& brokers, const std::string& topic,
                                     const std::set<std::string>& wanted,
                                     const std::function<const std::string&(const Record&)>& name,
                                     std::chrono::milliseconds timeout,
                                     const std::vector<std::pair<std::string, std::string>>& config) {
  using namespace std::chrono;
  const auto deadline = steady_clock::now() + timeout;
  std::size_t at_least = wanted.size();
  auto settle = milliseconds(500);
  for (;;) {
    const auto left = duration_cast<milliseconds>(deadline - steady_clock::now());
    std::vector<Record> out = consume(brokers, topic, at_least, std::max(left, milliseconds(0)), settle, config);
    std::set<std::string> seen;
    for (const Record& r : out) {
      if (wanted.contains(name(r))) seen.insert(name(r));
    }
    // Fewer records than asked for: the timeout passed, nothing more to wait for.
    if (seen.size() == wanted.size() || out.size() < at_least || steady_clock::now() >= deadline) return out;
    // One missing among more records than wanted: read again, for longer
    // once the count is reached, and past what this read saw.
    at_least = out.size() + 1;
    settle = std::min(settle * 2, milliseconds(4000));
  }
}

}  // namespace

std::vector<Record> consume_keys(const std::string& brokers, const std::string& topic,
                                 const std::set<std::string>& keys, std::chrono::milliseconds timeout,
                                 const std::vector<std::pair<std::string, std::string>>& config) {
  return consume_covering(brokers, topic, keys, [](const Record& r) -> const std::string& { return r.key; },
                          timeout, config);
}

std::vector<Record> consume_values(const std::string& brokers, const std::string& topic,
                                   const std::set<std::string>& values, std::chrono::milliseconds timeout) {
  return consume_covering(brokers, topic, values,
                          [](const Record& r) -> const std::string& { return r.value; }, timeout, {});
}

}  // namespace sagapool::test
