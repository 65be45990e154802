// Log lines with fields (log_event): in JSON one object per line whose
// fields sit beside "msg"; in text ` key=value` after the message; plain
// lines unchanged in both.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "sagapool/log.hpp"

namespace sagapool {
namespace {

class LogTest : public ::testing::Test {
 protected:
  void use(LogFormat format) {
    auto logger = std::make_shared<spdlog::logger>(
        "saga-test", std::make_shared<spdlog::sinks::ostream_sink_st>(out_));
    logger->set_formatter(make_log_formatter(format));
    spdlog::set_default_logger(logger);
  }
  void TearDown() override { spdlog::set_default_logger(before_); }

  std::string line() {
    std::string l;
    std::getline(out_, l);
    return l;
  }

  std::shared_ptr<spdlog::logger> before_ = spdlog::default_logger();
  std::stringstream out_;
};

TEST_F(LogTest, JsonFieldsSitBesideTheMessage) {
  use(LogFormat::json);
  log_event(spdlog::level::warn, "dead-lettered \"x\"",
            {{"transfer_id", "t-1"}, {"partition", std::int64_t{3}}, {"offset", std::int64_t{1207}},
             {"error", "quote\"and\\back"}});
  spdlog::info("plain {}", 5);
  const auto j = nlohmann::json::parse(line());
  EXPECT_EQ(j.at("level"), "warning");
  EXPECT_EQ(j.at("msg"), "dead-lettered \"x\"");
  EXPECT_EQ(j.at("transfer_id"), "t-1");
  EXPECT_EQ(j.at("partition"), 3);
  EXPECT_EQ(j.at("offset"), 1207);
  EXPECT_EQ(j.at("error"), "quote\"and\\back");
  const auto plain = nlohmann::json::parse(line());
  EXPECT_EQ(plain.at("msg"), "plain 5");
  EXPECT_FALSE(plain.contains("transfer_id")) << "fields belong to their own line only";
}

TEST_F(LogTest, TextFieldsFollowTheMessage) {
  use(LogFormat::text);
  log_event(spdlog::level::info, "recovered", {{"transfer_id", "t-1"}, {"offset", std::int64_t{-1}},
                                               {"state", "two words"}, {"owner", ""}});
  const std::string l = line();
  EXPECT_NE(l.find("saga-test: recovered transfer_id=t-1 offset=-1 state=\"two words\" owner=\"\""),
            std::string::npos) << l;
}

}  // namespace
}  // namespace sagapool
