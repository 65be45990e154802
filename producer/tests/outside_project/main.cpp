// Upstream code using the installed producer library: it builds a request,
// checks it with the worker's own rules, publishes it to a broker that is
// not there and checks the failure is reported, then prints the request.
// Exit 0 only when every check held; producer_package_test.sh compares the
// printed bytes with expected_output.txt.
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "sagapool/generator.hpp"
#include "sagapool/json_text.hpp"
#include "sagapool/producer.hpp"
#include "sagapool/request.hpp"
#include "sagapool/status.hpp"
#include "sagapool/transfer_request.hpp"

namespace {

int failures = 0;

void check(bool ok, const std::string& what) {
  if (ok) return;
  std::cerr << "publish_one: FAILED: " << what << '\n';
  ++failures;
}

}  // namespace

int main() {
  const sagapool::TransferRequest request{"order-42:refund", "acct-1", "acct-2", 2500, "EUR",
                                          R"({"ref": "invoice \"9\""})"};
  const std::string json = sagapool::to_json(request);
  sagapool::RequestView view;
  check(sagapool::parse_request(json, view) == sagapool::RequestError::ok,
        "parse_request accepts the request");
  check(view.from == "acct-1" && view.amount == 2500, "parse_request reads the fields back");

  std::string escaped;
  sagapool::append_json_escaped(escaped, "a\"b");
  check(escaped == R"(a\"b)", "append_json_escaped escapes a quote");

  sagapool::GeneratorOptions generator;
  generator.count = 1;
  generator.accounts = 2;
  check(sagapool::Generator::validate(generator).is_ok(), "the generator's options are valid");

  // Port 1 on loopback refuses at once: the delivery fails within 300 ms.
  sagapool::TransferProducerOptions options;
  options.brokers = "127.0.0.1:1";
  options.kafka_opts = {{"message.timeout.ms", "300"}, {"log_level", "0"}};
  std::vector<sagapool::TransferDelivery> reports;
  std::unique_ptr<sagapool::TransferProducer> producer;
  const sagapool::Status created = sagapool::TransferProducer::create(
      options, producer, [&](const sagapool::TransferDelivery& d) { reports.push_back(d); });
  check(created.is_ok(), "create: " + created.message());
  if (!producer) return 1;

  const sagapool::Status refused = producer->publish({"t-1", "acct-1", "acct-1", 5, "", ""});
  check(refused.kind() == sagapool::ErrorKind::fatal &&
            refused.message().find("same_account") != std::string::npos,
        "an invalid request is refused: " + refused.message());
  int tag = 0;
  check(producer->publish(request, &tag).is_ok(), "the valid request is queued");
  check(producer->flush(std::chrono::seconds(10)), "flush reports every message");
  check(reports.size() == 1 && reports[0].opaque == &tag, "one report, with its opaque");
  check(!reports.empty() && reports[0].status.kind() == sagapool::ErrorKind::retry_call,
        "the undelivered message is retry_call (" +
            std::string(reports.empty() ? "none"
                                        : sagapool::to_string(reports[0].status.kind())) +
            ")");
  check(producer->close(std::chrono::seconds(1)) == 0, "nothing left to purge");

  std::cout << json << '\n';
  return failures == 0 ? 0 : 1;
}
