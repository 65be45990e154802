#include "sagapool/kafka_base.hpp"

#include <array>
#include <string>

namespace sagapool {

// ---- Handles --------------------------------------------------------------

void KafkaDeleter::operator()(rd_kafka_t* p) const noexcept { rd_kafka_destroy(p); }
void ConfDeleter::operator()(rd_kafka_conf_t* p) const noexcept { rd_kafka_conf_destroy(p); }
void TopicPartitionListDeleter::operator()(rd_kafka_topic_partition_list_t* p) const noexcept {
  rd_kafka_topic_partition_list_destroy(p);
}
void MessageDeleter::operator()(rd_kafka_message_t* p) const noexcept {
  rd_kafka_message_destroy(p);
}
void HeadersDeleter::operator()(rd_kafka_headers_t* p) const noexcept {
  rd_kafka_headers_destroy(p);
}
void QueueDeleter::operator()(rd_kafka_queue_t* p) const noexcept { rd_kafka_queue_destroy(p); }
void KafkaErrorDeleter::operator()(rd_kafka_error_t* p) const noexcept {
  rd_kafka_error_destroy(p);
}
void MetadataDeleter::operator()(const rd_kafka_metadata_t* p) const noexcept {
  rd_kafka_metadata_destroy(p);
}

// ---- Errors ---------------------------------------------------------------

namespace {

std::string describe(rd_kafka_resp_err_t err, std::string_view what) {
  std::string m(what);
  m += ": ";
  m += rd_kafka_err2str(err);
  m += " (";
  m += rd_kafka_err2name(err);
  m += ')';
  return m;
}

}  // namespace

Status kafka_status(rd_kafka_resp_err_t err, std::string_view what) {
  const ErrorKind kind = classify_kafka_error(err);
  if (kind == ErrorKind::ok) return Status::ok();
  return Status::error(kind, describe(err, what));
}

Status kafka_status(const rd_kafka_error_t* error, std::string_view what) {
  if (error == nullptr) return Status::ok();
  const rd_kafka_resp_err_t err = rd_kafka_error_code(error);
  const ErrorKind kind = classify_kafka_error(err, rd_kafka_error_is_fatal(error) != 0,
                                              rd_kafka_error_is_retriable(error) != 0);
  if (kind == ErrorKind::ok) return Status::ok();
  std::string m(what);
  m += ": ";
  m += rd_kafka_error_string(error);
  m += " (";
  m += rd_kafka_error_name(error);
  m += ')';
  return Status::error(kind, std::move(m));
}


ErrorKind classify_kafka_error(rd_kafka_resp_err_t err, bool is_fatal,
                               bool is_retriable) noexcept {
  if (err == RD_KAFKA_RESP_ERR_NO_ERROR) return ErrorKind::ok;
  if (is_fatal || err == RD_KAFKA_RESP_ERR__FATAL) return ErrorKind::fatal;
  if (is_retriable) return ErrorKind::retry_call;
  switch (err) {
    // Wrong configuration or usage: retrying the same call cannot help.
    case RD_KAFKA_RESP_ERR__INVALID_ARG:
    case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
    case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
    case RD_KAFKA_RESP_ERR__NOT_CONFIGURED:
    case RD_KAFKA_RESP_ERR__UNSUPPORTED_FEATURE:
    case RD_KAFKA_RESP_ERR__NOT_IMPLEMENTED:
    case RD_KAFKA_RESP_ERR__SSL:
    case RD_KAFKA_RESP_ERR__AUTHENTICATION:
    case RD_KAFKA_RESP_ERR__FENCED:
    case RD_KAFKA_RESP_ERR__INCONSISTENT:
    case RD_KAFKA_RESP_ERR__GAPLESS_GUARANTEE:
    case RD_KAFKA_RESP_ERR__DESTROY:
    case RD_KAFKA_RESP_ERR__CONFLICT:
    case RD_KAFKA_RESP_ERR__STATE:
    case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE:
    case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_INVALID_REQUIRED_ACKS:
    case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED:
    case RD_KAFKA_RESP_ERR_UNSUPPORTED_SASL_MECHANISM:
    case RD_KAFKA_RESP_ERR_ILLEGAL_SASL_STATE:
    case RD_KAFKA_RESP_ERR_UNSUPPORTED_VERSION:
    case RD_KAFKA_RESP_ERR_UNSUPPORTED_COMPRESSION_TYPE:
    case RD_KAFKA_RESP_ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT:
    case RD_KAFKA_RESP_ERR_INVALID_CONFIG:
    case RD_KAFKA_RESP_ERR_INVALID_REQUEST:
    case RD_KAFKA_RESP_ERR_INVALID_GROUP_ID:
    case RD_KAFKA_RESP_ERR_INVALID_SESSION_TIMEOUT:
    case RD_KAFKA_RESP_ERR_POLICY_VIOLATION:
    case RD_KAFKA_RESP_ERR_SECURITY_DISABLED:
    case RD_KAFKA_RESP_ERR_PRODUCER_FENCED:
    case RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH:
    case RD_KAFKA_RESP_ERR_FENCED_INSTANCE_ID:
      return ErrorKind::fatal;
    // Everything else is transport, timeouts, leadership or coordinator
    // movement, queue full, rebalances: the same call can succeed later.
    default:
      return ErrorKind::retry_call;
  }
}

bool cured_by_new_producer(rd_kafka_resp_err_t fatal_err) noexcept {
  switch (fatal_err) {
    case RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER:
    case RD_KAFKA_RESP_ERR_DUPLICATE_SEQUENCE_NUMBER:
    case RD_KAFKA_RESP_ERR_UNKNOWN_PRODUCER_ID:
    case RD_KAFKA_RESP_ERR_INVALID_PRODUCER_EPOCH:
    case RD_KAFKA_RESP_ERR__INCONSISTENT:
      return true;
    default:
      return false;
  }
}

bool flush_producer(rd_kafka_t* rk, std::chrono::milliseconds timeout) {
  (void)rd_kafka_flush(rk, static_cast<int>(timeout.count()));
  return rd_kafka_outq_len(rk) == 0;
}

int flush_or_purge(rd_kafka_t* rk, std::chrono::milliseconds timeout, rd_kafka_resp_err_t& purge_error) {
  purge_error = RD_KAFKA_RESP_ERR_NO_ERROR;
  if (flush_producer(rk, timeout)) return 0;
  const int left = rd_kafka_outq_len(rk);
  // Purged messages get a failed delivery report, served by the polls below.
  purge_error = rd_kafka_purge(rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
  // Bounded: purged messages are reported promptly; give up after ~1 s.
  for (int i = 0; i < 100 && rd_kafka_outq_len(rk) > 0; ++i) (void)rd_kafka_poll(rk, 10);
  (void)rd_kafka_poll(rk, 0);
  return left;
}

// ---- Producing ------------------------------------------------------------

Status produce_copy(rd_kafka_t* rk, const std::string& topic, std::string_view key, std::string_view value,
                    const MessageHeader* headers, std::size_t header_count, void* opaque,
                    std::int64_t timestamp_ms, rd_kafka_resp_err_t& err) {
  // Fixed-size argument list on the stack: topic, flags, value, opaque, and
  // optionally key, headers and timestamp.
  std::array<rd_kafka_vu_t, 7> vus{};
  std::size_t n = 0;
  vus[n].vtype = RD_KAFKA_VTYPE_TOPIC;
  vus[n++].u.cstr = topic.c_str();
  vus[n].vtype = RD_KAFKA_VTYPE_MSGFLAGS;
  vus[n++].u.i = RD_KAFKA_MSG_F_COPY;
  vus[n].vtype = RD_KAFKA_VTYPE_VALUE;
  // F_COPY: librdkafka copies and never writes through this pointer.
  vus[n].u.mem.ptr = const_cast<char*>(value.data());
  vus[n++].u.mem.size = value.size();
  vus[n].vtype = RD_KAFKA_VTYPE_OPAQUE;
  vus[n++].u.ptr = opaque;
  if (!key.empty()) {
    vus[n].vtype = RD_KAFKA_VTYPE_KEY;
    vus[n].u.mem.ptr = const_cast<char*>(key.data());
    vus[n++].u.mem.size = key.size();
  }
  HeadersPtr hdrs;
  if (header_count > 0) {
    // Only dead letters carry headers; the list is librdkafka's allocation
    // and becomes the message's on success.
    hdrs.reset(rd_kafka_headers_new(header_count));
    for (const MessageHeader* h = headers; h != headers + header_count; ++h) {
      const rd_kafka_resp_err_t herr = rd_kafka_header_add(
          hdrs.get(), h->name.data(), static_cast<ssize_t>(h->name.size()), h->value.data(),
          static_cast<ssize_t>(h->value.size()));
      if (herr != RD_KAFKA_RESP_ERR_NO_ERROR) {
        err = herr;
        return kafka_status(herr, "kafka produce: header");
      }
    }
    vus[n].vtype = RD_KAFKA_VTYPE_HEADERS;
    vus[n++].u.headers = hdrs.get();
  }
  if (timestamp_ms > 0) {
    vus[n].vtype = RD_KAFKA_VTYPE_TIMESTAMP;
    vus[n++].u.i64 = timestamp_ms;
  }
  KafkaErrorPtr error(rd_kafka_produceva(rk, vus.data(), n));
  if (!error) {
    (void)hdrs.release();  // owned by the queued message now
    err = RD_KAFKA_RESP_ERR_NO_ERROR;
    return Status::ok();
  }
  err = rd_kafka_error_code(error.get());
  return kafka_status(error.get(), "kafka produce to " + topic);
}

}  // namespace sagapool
