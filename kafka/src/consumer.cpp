#include "sagapool/consumer.hpp"

#include <spdlog/spdlog.h>

#include <atomic>
#include <cstring>
#include <vector>

namespace sagapool {
namespace {

std::atomic<ConsumerStatsListener*> g_stats_listener{nullptr};

}  // namespace

void Consumer::set_stats_listener(ConsumerStatsListener* listener) noexcept {
  g_stats_listener.store(listener, std::memory_order_release);
}

int Consumer::stats_cb(rd_kafka_t*, char* json, std::size_t json_len, void*) {
  if (ConsumerStatsListener* l = g_stats_listener.load(std::memory_order_acquire)) {
    l->on_consumer_stats(std::string_view(json, json_len));
  }
  return 0;  // librdkafka frees `json`
}

Status Consumer::create(const ConsumerOptions& options, std::unique_ptr<Consumer>& out) {
  std::vector<KeyValue> opts = {
      {"bootstrap.servers", options.brokers},
      {"group.id", options.group},
      {"client.id", options.client_id},
      {"partition.assignment.strategy", "cooperative-sticky"},
      {"enable.auto.offset.store", "false"},
      {"enable.auto.commit", "true"},
      {"auto.commit.interval.ms", "500"},
      {"auto.offset.reset", "earliest"},
      {"session.timeout.ms", "10000"},
      {"heartbeat.interval.ms", "1000"},
      {"max.poll.interval.ms", "300000"},
      // A fetch waits for 64 KiB or 50 ms: under moderate load the broker
      // answers fewer, fuller fetches, and spends less CPU on them
      // (bench/REPORT.md, "The thirteenth session").
      {"fetch.wait.max.ms", "50"},
      {"fetch.min.bytes", "65536"},
      // Prefetch per partition, each read from its own queue (librdkafka
      // counts a forwarded queue's whole length, so while the partitions
      // shared the consumer queue 4 MiB bounded their sum). A message holds
      // its whole fetch response, which oldest-first consumption keeps alive
      // until its slowest partition's share is taken: small fetches per
      // partition bound that. A worker holding all 12 partitions of a
      // 1,000,000-request backlog peaked at 257-270 MiB RSS with 1 MiB
      // queues and librdkafka's 1 MiB fetches, 171 MiB with these, at the
      // same rate (docs/kafka.md). A larger message is still fetched whole.
      {"queued.max.messages.kbytes", "512"},
      {"max.partition.fetch.bytes", "131072"},
  };
  const bool stats = g_stats_listener.load(std::memory_order_acquire) != nullptr;
  if (stats) opts.push_back({"statistics.interval.ms", kConsumerStatsIntervalMs});
  opts.insert(opts.end(), options.kafka_opts.begin(), options.kafka_opts.end());
  ConfPtr conf;
  if (Status s = make_conf(opts, conf); !s) return s;
  install_log_callbacks(*conf);
  if (stats) rd_kafka_conf_set_stats_cb(conf.get(), &Consumer::stats_cb);
  auto consumer = std::unique_ptr<Consumer>(new Consumer());
  consumer->topic_ = options.topic;
  consumer->group_ = options.group;
  rd_kafka_conf_set_rebalance_cb(conf.get(), &Consumer::rebalance_cb);
  rd_kafka_conf_set_opaque(conf.get(), consumer.get());
  char err[512];
  rd_kafka_t* rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf.get(), err, sizeof err);
  if (rk == nullptr) return Status::fatal(std::string("cannot create Kafka consumer: ") + err);
  (void)conf.release();  // owned by rk now
  consumer->rk_.reset(rk);
  rd_kafka_poll_set_consumer(rk);
  consumer->queue_.reset(rd_kafka_queue_get_consumer(rk));

  TopicPartitionListPtr topics(rd_kafka_topic_partition_list_new(1));
  rd_kafka_topic_partition_list_add(topics.get(), options.topic.c_str(), RD_KAFKA_PARTITION_UA);
  if (Status s = kafka_status(rd_kafka_subscribe(rk, topics.get()), "subscribe to " + options.topic); !s) {
    return s;
  }
  out = std::move(consumer);
  return Status::ok();
}

Consumer::~Consumer() { close(); }

void Consumer::rebalance_cb(rd_kafka_t* rk, rd_kafka_resp_err_t err,
                            rd_kafka_topic_partition_list_t* partitions, void* opaque) {
  auto* self = static_cast<Consumer*>(opaque);
  const bool cooperative = std::strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE") == 0;
  const bool assign = err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS;
  KafkaErrorPtr error;
  rd_kafka_resp_err_t rerr = RD_KAFKA_RESP_ERR_NO_ERROR;
  if (!assign) {
    // Hand over what we ingested: commit the stored offsets now, so the
    // partitions' next owner does not consume them again.
    const rd_kafka_resp_err_t c = rd_kafka_commit(rk, nullptr, 0);
    if (c && c != RD_KAFKA_RESP_ERR__NO_OFFSET) {
      spdlog::warn("rebalance: commit before revoke failed: {}", rd_kafka_err2str(c));
    }
  } else {
    self->on_assigned(rk, *partitions);  // before fetching starts, see on_assigned
  }
  if (cooperative) {
    error.reset(assign ? rd_kafka_incremental_assign(rk, partitions)
                       : rd_kafka_incremental_unassign(rk, partitions));
  } else {
    rerr = rd_kafka_assign(rk, assign ? partitions : nullptr);
  }
  if (error || rerr) {
    spdlog::error("rebalance: {} failed: {}", assign ? "assign" : "revoke",
                  error ? rd_kafka_error_string(error.get()) : rd_kafka_err2str(rerr));
    if (assign) self->on_revoked(partitions);
    return;
  }
  if (!assign) self->on_revoked(cooperative ? partitions : nullptr);
  self->ever_assigned_ |= assign;
  spdlog::info("rebalance: {} {} partition(s), {} assigned now", assign ? "assigned" : "revoked",
               partitions->cnt, self->partitions_.size());
}

// librdkafka forwards each partition's queue to the consumer queue when it
// starts fetching, unless the application took the queue over before: an
// unforwarded queue stays so (librdkafka 2.0, rd_kafka_toppar_op_fetch_start).
void Consumer::on_assigned(rd_kafka_t* rk, const rd_kafka_topic_partition_list_t& partitions) {
  for (int i = 0; i < partitions.cnt; ++i) {
    const rd_kafka_topic_partition_t& tp = partitions.elems[i];
    std::erase_if(partitions_, [&](const Partition& p) { return p.id == tp.partition; });
    QueuePtr queue(rd_kafka_queue_get_partition(rk, tp.topic, tp.partition));
    if (queue) {
      rd_kafka_queue_forward(queue.get(), nullptr);
    } else {  // its messages then come on the consumer queue, in librdkafka's order
      spdlog::warn("rebalance: no queue of its own for {} [{}]", tp.topic, tp.partition);
    }
    partitions_.push_back({tp.partition, std::move(queue), nullptr});
  }
}

void Consumer::on_revoked(const rd_kafka_topic_partition_list_t* partitions) {
  if (partitions == nullptr) {
    partitions_.clear();
    return;
  }
  for (int i = 0; i < partitions->cnt; ++i) {
    std::erase_if(partitions_, [&](const Partition& p) { return p.id == partitions->elems[i].partition; });
  }
}

Status Consumer::check(const rd_kafka_message_t& m) const {
  if (m.err == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED ||
      m.err == RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED) {
    return Status::fatal("Kafka refused to let this principal consume (" +
                         std::string(rd_kafka_message_errstr(&m)) + "): it needs Read on topic " +
                         topic_ + " and on group " + group_ + " (docs/kafka.md)");
  }
  if (m.err && m.err != RD_KAFKA_RESP_ERR__PARTITION_EOF) {
    spdlog::warn("consumer: {}", rd_kafka_message_errstr(&m));
  }
  return Status::ok();
}

Status Consumer::serve_events(int wait_ms, std::size_t max, std::vector<MessagePtr>& out) {
  for (;; wait_ms = 0) {
    MessagePtr m(rd_kafka_consume_queue(queue_.get(), wait_ms));
    if (!m) return Status::ok();
    if (Status s = check(*m); !s) return s;
    if (m->err) continue;
    out.push_back(std::move(m));
    if (out.size() >= max) return Status::ok();
  }
}

// One message at a time, not rd_kafka_consume_batch_queue: in librdkafka 2.0
// the batch call can return messages fetched before a rebalance (its "known
// issues"); storing their offsets after the partition came back would skip
// what another member had not yet ingested (the likely cause of two requests
// the chaos test found skipped, committed past but never ingested).
Status Consumer::take_next(Partition& p) {
  while (!p.next && p.queue) {
    MessagePtr m(rd_kafka_consume_queue(p.queue.get(), 0));
    if (!m) break;
    if (Status s = check(*m); !s) return s;
    if (m->err) continue;
    rd_kafka_timestamp_type_t type;
    p.next_timestamp = rd_kafka_message_timestamp(m.get(), &type);
    p.next = std::move(m);
  }
  return Status::ok();
}

Status Consumer::poll_batch(std::size_t max, std::chrono::milliseconds timeout,
                            std::vector<MessagePtr>& out) {
  out.clear();
  // With nothing at hand, the second round waits on the consumer queue (a
  // rebalance or an error wakes it), then looks at the partitions again.
  for (int wait_ms : {0, static_cast<int>(timeout.count())}) {
    if (Status s = serve_events(wait_ms, max, out); !s) return s;
    bool any = !out.empty();
    for (Partition& p : partitions_) {
      if (Status s = take_next(p); !s) return s;
      any |= p.next != nullptr;
    }
    if (any) break;
  }
  while (out.size() < max) {
    Partition* oldest = nullptr;
    for (Partition& p : partitions_) {
      if (p.next && (oldest == nullptr || p.next_timestamp < oldest->next_timestamp)) oldest = &p;
    }
    if (oldest == nullptr) break;
    out.push_back(std::move(oldest->next));
    if (Status s = take_next(*oldest); !s) return s;
  }
  return Status::ok();
}

std::size_t Consumer::prefetched() const noexcept {
  std::size_t n = 0;
  for (const Partition& p : partitions_) n += (p.next ? 1 : 0) + (p.queue ? rd_kafka_queue_length(p.queue.get()) : 0);
  return n;
}

Status Consumer::store_offsets(rd_kafka_topic_partition_list_t& offsets) {
  if (offsets.cnt == 0) return Status::ok();
  const rd_kafka_resp_err_t err = rd_kafka_offsets_store(rk_.get(), &offsets);
  // _STATE means the partition was revoked meanwhile: its new owner will see
  // the messages again and find them already ingested (duplicates).
  if (err == RD_KAFKA_RESP_ERR__STATE) return Status::ok();
  return kafka_status(err, "store offsets");
}

Status Consumer::seek(rd_kafka_topic_partition_list_t& offsets) {
  constexpr int kSeekTimeoutMs = 5000;
  if (KafkaErrorPtr error{rd_kafka_seek_partitions(rk_.get(), &offsets, kSeekTimeoutMs)}) {
    return kafka_status(error.get(), "seek");
  }
  Status status = Status::ok();
  for (int i = 0; i < offsets.cnt; ++i) {
    const rd_kafka_topic_partition_t& tp = offsets.elems[i];
    if (tp.err) {  // not sought: what we hold of it is still its next message
      if (status) status = kafka_status(tp.err, "seek");
      continue;
    }
    for (Partition& p : partitions_) {
      if (p.id == tp.partition) p.next.reset();
    }
  }
  return status;
}

void Consumer::close() {
  if (closed_ || !rk_) return;
  closed_ = true;
  partitions_.clear();
  queue_.reset();
  if (rd_kafka_resp_err_t err = rd_kafka_consumer_close(rk_.get())) {
    spdlog::warn("consumer close: {}", rd_kafka_err2str(err));
  }
  // librdkafka before 2.3 aborts in rd_kafka_destroy when a cooperative-sticky
  // member joined but never received an assignment (its issue #4312;
  // Debian 12 ships 2.0.2): a worker stopped during a long rebalance died
  // with SIGABRT after draining. Closed, the handle holds nothing the
  // process still needs, so such a handle is left to the process exit.
  if (!ever_assigned_) (void)rk_.release();
}

}  // namespace sagapool
