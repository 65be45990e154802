// saga-producer: publish transfer requests from a JSON-lines file, stdin, or
// a seeded generator (DESIGN.md, "Programs and their flags").
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <thread>

#include "sagapool/config.hpp"
#include "sagapool/generator.hpp"
#include "sagapool/kafka.hpp"
#include "sagapool/log.hpp"
#include "sagapool/producer.hpp"
#include "sagapool/request.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using sagapool::Status;

volatile std::sig_atomic_t g_interrupted = 0;
extern "C" void on_signal(int) { g_interrupted = 1; }

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Redraws one status line on stderr at most 5 times a second, and only when
// stderr is a terminal (logs and pipes never see it).
class Progress {
 public:
  Progress(std::uint64_t total, Clock::time_point start)
      : enabled_(::isatty(STDERR_FILENO) == 1), total_(total), start_(start) {}

  void update(std::uint64_t sent, const sagapool::TransferProducer& p, bool force = false) {
    if (!enabled_) return;
    const auto now = Clock::now();
    if (!force && now - last_ < std::chrono::milliseconds(200)) return;
    last_ = now;
    const double elapsed = seconds_since(start_);
    const double rate = elapsed > 0 ? static_cast<double>(sent) / elapsed : 0.0;
    constexpr int kWidth = 30;
    std::string bar;
    if (total_ > 0) {
      const auto filled = static_cast<int>(static_cast<double>(p.delivered() + p.failed()) /
                                           static_cast<double>(total_) * kWidth);
      bar = "[" + std::string(static_cast<std::size_t>(filled), '#') +
            std::string(static_cast<std::size_t>(kWidth - filled), '.') + "] ";
    }
    std::fprintf(stderr, "\r%ssent %llu, delivered %llu, failed %llu, %.0f msgs/s   ", bar.c_str(),
                 static_cast<unsigned long long>(sent),
                 static_cast<unsigned long long>(p.delivered()),
                 static_cast<unsigned long long>(p.failed()), rate);
    std::fflush(stderr);
    drawn_ = true;
  }
  void finish() {
    if (drawn_) std::fputc('\n', stderr);
  }

 private:
  bool enabled_;
  bool drawn_ = false;
  std::uint64_t total_;
  Clock::time_point start_;
  Clock::time_point last_{};
};

// Keeps the send rate at `rate` msgs/s (0 = unlimited) by sleeping until the
// n-th message is due, serving delivery reports meanwhile.
class Pacer {
 public:
  Pacer(double rate, Clock::time_point start, std::chrono::milliseconds first_wait)
      : rate_(rate), start_(start), first_wait_(first_wait) {}
  // After the n-th send. The first request goes out alone and the pace
  // starts from its delivery: a new client's first requests can wait up to
  // a second before the broker appends them (its connection, the topic's
  // metadata, its idempotent id), each stamped with the time it was given,
  // so a paced run would start with a held-back burst (bench/REPORT.md,
  // "The thirty-fourth session").
  void sent(std::uint64_t n, sagapool::TransferProducer& p) {
    if (n != 1) return;
    const auto deadline = Clock::now() + first_wait_;
    while (p.in_flight() > 0 && g_interrupted == 0 && Clock::now() < deadline) {
      (void)p.flush(std::chrono::milliseconds(100));
    }
    start_ = Clock::now();
  }
  // Before the send that follows the n-th. The first goes at once, the
  // second as soon as the first is delivered (sent() restarted the pace),
  // the n+1-th n - 1 intervals after that.
  void wait_for(std::uint64_t n, sagapool::TransferProducer& p) {
    if (rate_ <= 0) return;
    const auto due = start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                                  static_cast<double>(n > 0 ? n - 1 : 0) / rate_));
    for (auto now = Clock::now(); now < due && g_interrupted == 0; now = Clock::now()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(due - now);
      if (left.count() >= 1) {
        (void)p.poll(left);
      } else {
        std::this_thread::sleep_until(due);
      }
    }
  }

 private:
  double rate_;
  Clock::time_point start_;
  std::chrono::milliseconds first_wait_;  // bounds the first request's delivery
};

struct Options {
  std::string brokers;
  std::string topic = std::string(sagapool::kDefaultRequestsTopic);
  std::string file;
  std::string input;  // positional: "-" = stdin
  std::uint64_t generate = 0;
  std::uint64_t accounts = 0;
  std::uint64_t seed = 1;
  double rate = 0;
  double invalid_ratio = 0.01;
  double overdraw_ratio = 0.02;
  double unknown_ratio = 0.01;
  std::string id_prefix = "g";
  std::string delivery_timeout = "30s";
  std::vector<std::string> kafka_opts;
};

struct Totals {
  std::uint64_t sent = 0;
  std::uint64_t expected = 0;  // what should have been sent
  std::string send_error;      // why sending stopped early
};

// Paces and sends one message; false (the error in `t`) if it was refused.
bool send_one(sagapool::TransferProducer& producer, Pacer& pacer, Progress& progress,
              std::string_view key, std::string_view value, Totals& t) {
  pacer.wait_for(t.sent, producer);
  if (Status s = producer.publish_raw(key, value); !s) {
    t.send_error = s.message();
    return false;
  }
  ++t.sent;
  pacer.sent(t.sent, producer);
  if ((t.sent & 1023U) == 0) {
    (void)producer.poll(std::chrono::milliseconds(0));
    progress.update(t.sent, producer);
  }
  return true;
}

// Sends every generated message; returns per-kind counts in the summary.
Totals send_generated(sagapool::Generator& gen, sagapool::TransferProducer& producer,
                      Pacer& pacer, Progress& progress) {
  Totals t;
  t.expected = gen.options().count;
  sagapool::GeneratedMessage m;
  while (g_interrupted == 0 && gen.next(m)) {
    if (!send_one(producer, pacer, progress, m.key, m.value, t)) return t;
  }
  return t;
}

// Sends each non-empty line as it is; the key is the request's "from" when
// the line is a valid request, else none (invalid input must still reach
// the dead-letter topic through the workers).
Totals send_lines(std::istream& in, sagapool::TransferProducer& producer, Pacer& pacer,
                  Progress& progress, std::uint64_t& valid, std::uint64_t& invalid) {
  Totals t;
  std::string line;
  while (g_interrupted == 0 && std::getline(in, line)) {
    if (line.empty() || line == "\r") continue;
    ++t.expected;
    sagapool::RequestView view;
    std::string_view key;
    if (sagapool::parse_request(line, view) == sagapool::RequestError::ok) {
      key = view.from;
      ++valid;
    } else {
      ++invalid;
    }
    if (!send_one(producer, pacer, progress, key, line, t)) return t;
  }
  if (in.bad()) t.send_error = "read error on input";
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  std::ios::sync_with_stdio(false);
  Options o;
  CLI::App app{"saga-producer: publish transfer requests to Kafka (key = source account)"};
  app.add_option("--brokers", o.brokers, "Kafka bootstrap servers (host:port,...)")->required();
  app.add_option("--topic", o.topic, "topic to publish to")->capture_default_str();
  auto* file = app.add_option("--file", o.file,
                              "send each non-empty line of this JSON-lines file as it is "
                              "('-' = stdin)");
  auto* input = app.add_option("input", o.input, "'-': read JSON lines from stdin")
                    ->check(CLI::IsMember({"-"}));
  auto* generate = app.add_option("--generate", o.generate, "generate N requests")
                       ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1'000'000'000'000}));
  auto* accounts = app.add_option("--accounts", o.accounts,
                                  "generated requests use accounts acct-0 .. acct-<M-1> "
                                  "(Zipf-skewed, s=1.1)")
                       ->check(CLI::Range(std::uint64_t{2}, std::uint64_t{1'000'000'000}));
  app.add_option("--seed", o.seed, "generator seed (same seed, same messages)")
      ->capture_default_str();
  app.add_option("--rate", o.rate, "messages per second, 0 = unlimited")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--invalid-ratio", o.invalid_ratio,
                 "share of generated requests that break a validation rule")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--overdraw-ratio", o.overdraw_ratio,
                 "share of generated requests with an amount above 10^9")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--unknown-ratio", o.unknown_ratio,
                 "share of generated requests naming an unknown account")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  app.add_option("--id-prefix", o.id_prefix, "generated ids are <prefix>-<seed>-<n>")
      ->capture_default_str();
  app.add_option("--delivery-timeout", o.delivery_timeout,
                 "give up on a message not acknowledged within this time (sets "
                 "message.timeout.ms unless --kafka-opt does)")
      ->capture_default_str();
  app.add_option("--kafka-opt", o.kafka_opts, "librdkafka property key=value (repeatable); "
                                             "SASL credentials: SAGA_KAFKA_SASL_USERNAME/PASSWORD");
  file->excludes(input)->excludes(generate);
  input->excludes(generate);
  generate->needs(accounts);
  accounts->needs(generate);
  sagapool::finish_cli(app);
  if (auto code = sagapool::parse_cli(app, argc, argv)) return *code;

  const char* prog = "saga-producer";
  if (o.file.empty() && o.input.empty() && o.generate == 0) {
    std::cerr << prog << ": give one of --file F, - (stdin), or --generate N --accounts M\n";
    return 2;
  }
  const auto timeout_ms = sagapool::parse_duration_ms(o.delivery_timeout);
  if (!timeout_ms || *timeout_ms < 1 || *timeout_ms > INT32_MAX) {
    std::cerr << prog << ": --delivery-timeout: expected a duration like 30s or 500ms\n";
    return 2;
  }
  std::string kv_error;
  auto kafka_opts = sagapool::parse_key_values(o.kafka_opts, kv_error);
  if (!kafka_opts) {
    std::cerr << prog << ": --kafka-opt: " << kv_error << '\n';
    return 2;
  }
  std::int64_t message_timeout_ms = *timeout_ms;
  for (const auto& kv : *kafka_opts) {
    if (kv.key == "message.timeout.ms" || kv.key == "delivery.timeout.ms") {
      // A malformed value is left for librdkafka to reject with a clear message.
      std::int64_t v = 0;
      const char* end = kv.value.data() + kv.value.size();
      if (auto [ptr, ec] = std::from_chars(kv.value.data(), end, v); ec == std::errc() && ptr == end) {
        message_timeout_ms = v;
      }
    }
  }
  kafka_opts->insert(kafka_opts->begin(), {"message.timeout.ms", std::to_string(*timeout_ms)});
  sagapool::add_kafka_sasl_from_env(*kafka_opts);

  sagapool::GeneratorOptions gopts;
  if (o.generate > 0) {
    gopts.count = o.generate;
    gopts.accounts = o.accounts;
    gopts.seed = o.seed;
    gopts.invalid_ratio = o.invalid_ratio;
    gopts.overdraw_ratio = o.overdraw_ratio;
    gopts.unknown_ratio = o.unknown_ratio;
    gopts.id_prefix = o.id_prefix;
    if (Status s = sagapool::Generator::validate(gopts); !s) {
      std::cerr << prog << ": " << s.message() << '\n';
      return 2;
    }
  }

  std::ifstream in_file;
  const bool from_stdin = o.input == "-" || o.file == "-";
  if (!o.file.empty() && !from_stdin) {
    in_file.open(o.file, std::ios::binary);
    if (!in_file) {
      std::cerr << prog << ": cannot open " << o.file << '\n';
      return 2;
    }
  }

  sagapool::init_logging(prog, sagapool::LogFormat::text);
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);

  // A bad option is a usage error (2), found before anything connects.
  {
    sagapool::ConfPtr conf;
    if (Status s = sagapool::make_conf(*kafka_opts, conf); !s) {
      std::cerr << prog << ": " << s.message() << '\n';
      return 2;
    }
  }
  // One clear line, before anything is sent, when no broker answers, the
  // credentials or the CA are wrong, or the topic is missing or hidden.
  if (Status s = sagapool::check_kafka(o.brokers, *kafka_opts, {o.topic},
                                       std::chrono::milliseconds(message_timeout_ms));
      !s) {
    std::cerr << prog << ": " << s.message() << '\n';
    return 3;
  }

  sagapool::TransferProducerOptions popts;
  popts.brokers = o.brokers;
  popts.topic = o.topic;
  for (auto& kv : *kafka_opts) {
    popts.kafka_opts.emplace_back(std::move(kv.key), std::move(kv.value));
  }
  // librdkafka's lines go to our log, in its format, as the worker's do.
  popts.configure = [](rd_kafka_conf_t& conf) { sagapool::install_log_callbacks(conf); };
  std::unique_ptr<sagapool::TransferProducer> producer;
  if (Status s = sagapool::TransferProducer::create(std::move(popts), producer); !s) {
    std::cerr << prog << ": " << s.message() << '\n';
    return 2;
  }

  const auto start = Clock::now();
  Progress progress(o.generate, start);
  Pacer pacer(o.rate, start, std::chrono::milliseconds(message_timeout_ms));
  Totals totals;
  std::uint64_t lines_valid = 0;
  std::uint64_t lines_invalid = 0;
  std::optional<sagapool::Generator> gen;
  if (o.generate > 0) {
    gen.emplace(gopts);
    totals = send_generated(*gen, *producer, pacer, progress);
  } else {
    totals = send_lines(from_stdin ? std::cin : in_file, *producer, pacer, progress, lines_valid,
                        lines_invalid);
  }

  // Wait for every report: the delivery timeout bounds each message, so
  // this deadline only guards against a stuck client.
  const auto flush_deadline =
      Clock::now() + std::chrono::milliseconds(message_timeout_ms) + std::chrono::seconds(5);
  while (producer->in_flight() > 0 && Clock::now() < flush_deadline) {
    (void)producer->flush(std::chrono::milliseconds(200));
    progress.update(totals.sent, *producer);
  }
  const int left = producer->close(std::chrono::seconds(1));
  progress.update(totals.sent, *producer, true);
  progress.finish();

  const double elapsed = seconds_since(start);
  std::string kinds;
  if (gen) {
    using sagapool::GeneratedKind;
    for (auto k : {GeneratedKind::valid, GeneratedKind::overdraw, GeneratedKind::unknown_account,
                   GeneratedKind::invalid}) {
      kinds += ", " + std::string(to_string(k)) + ' ' + std::to_string(gen->count(k));
    }
  } else {
    kinds = ", valid " + std::to_string(lines_valid) + ", invalid " + std::to_string(lines_invalid);
  }
  std::printf("%s: sent %llu, delivered %llu, failed %llu in %.2f s (%.0f msgs/s)%s\n", prog,
              static_cast<unsigned long long>(totals.sent),
              static_cast<unsigned long long>(producer->delivered()),
              static_cast<unsigned long long>(producer->failed()), elapsed,
              elapsed > 0 ? static_cast<double>(totals.sent) / elapsed : 0.0, kinds.c_str());
  std::fflush(stdout);

  const std::uint64_t missing = totals.expected - producer->delivered();
  if (missing == 0 && left == 0 && totals.send_error.empty()) return 0;
  std::cerr << prog << ": " << missing << " of " << totals.expected
            << " message(s) were not delivered to " << o.brokers;
  if (!totals.send_error.empty()) {
    std::cerr << " (sending stopped: " << totals.send_error << ')';
  } else if (!producer->first_error().empty()) {
    std::cerr << " (first error: " << producer->first_error() << ')';
  } else if (g_interrupted != 0) {
    std::cerr << " (interrupted)";
  }
  std::cerr << '\n';
  return 1;
}
