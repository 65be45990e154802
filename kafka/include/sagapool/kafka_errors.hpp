#pragma once
// Kafka errors as ErrorKind, on their own (librdkafka and Status only): the
// installed producer library and the kafka component share this one table.
#include <librdkafka/rdkafka.h>

#include "sagapool/status.hpp"

namespace sagapool {

// The one place Kafka errors meet the taxonomy: librdkafka's fatal flag (or
// err == _FATAL) -> fatal; configuration, authorization, size and unknown
// topic/partition errors -> fatal; everything else (transport, timeouts,
// leader changes, queue full, coordinator moves, librdkafka's retriable flag)
// -> retry_call.
ErrorKind classify_kafka_error(rd_kafka_resp_err_t err, bool is_fatal = false,
                               bool is_retriable = false) noexcept;

}  // namespace sagapool
