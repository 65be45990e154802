#include "worker.hpp"
#include "sagapool/failpoints.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <thread>

namespace sagapool {
namespace {

using Clock = std::chrono::steady_clock;

// Outcome delivery reports carry this tag; dead letters carry their batch's
// PendingOffsets.
char kOutcomeTag;

std::int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A dead letter librdkafka or the broker refuses as too large is sent again
// cut to these sizes (any valid request is smaller), with headers that say
// so and give the original size.
constexpr std::size_t kDeadLetterKeepBytes = 64 * 1024;
constexpr std::size_t kDeadLetterKeyKeepBytes = 1024;

bool too_large(rd_kafka_resp_err_t err) {
  return err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE ||
         err == RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE ||
         err == RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE;
}

// Refusals of this one message, not of the topic or the client: final for
// the message, never for the worker.
bool refused_for_the_message(rd_kafka_resp_err_t err) {
  return too_large(err) || err == RD_KAFKA_RESP_ERR_INVALID_RECORD;
}

std::chrono::milliseconds backoff(int attempt) {
  return std::chrono::milliseconds(std::min<std::int64_t>(5000, 50LL << std::min(attempt, 7)));
}

}  // namespace

Worker::Worker(const WorkerOptions& options, Ledger& ledger, WorkerProbe& probe)
    : options_(options),
      ledger_(ledger),
      probe_(probe),
      engine_(ledger, {options.worker_id, options.lease_ms, 5}, &probe) {}

// The producer goes first: closing it serves the last delivery reports,
// which still reach offsets_ and the notified buffer.
Worker::~Worker() {
  producer_.reset();
  consumer_.reset();
}

Status Worker::create(const WorkerOptions& options, Ledger& ledger, WorkerProbe& probe,
                      std::unique_ptr<Worker>& out) {
  auto w = std::unique_ptr<Worker>(new Worker(options, ledger, probe));
  if (Status s = failpoints::init_from_env(); !s) return s;  // SAGA_FAILPOINTS, once
  KafkaProducerOptions popts;
  popts.brokers = options.brokers;
  popts.kafka_opts = options.kafka_opts;
  popts.client_id = options.worker_id;
  if (Status s = KafkaProducer::create(popts, w.get(), w->producer_); !s) return s;
  ConsumerOptions copts{options.brokers, options.group, options.requests_topic, options.worker_id,
                        options.kafka_opts};
  if (Status s = Consumer::create(copts, w->consumer_); !s) return s;
  w->batch_.reserve(options.batch_size);
  w->new_.reserve(options.batch_size);
  w->items_.reserve(options.batch_size);
  out = std::move(w);
  return Status::ok();
}

Status Worker::run(const std::atomic<bool>& stop) {
  auto next_recovery = Clock::now();
  Status result;
  while (!stop.load(std::memory_order_relaxed)) {
    last_loop_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    // A short wait: under load, what arrived while the last batch ran fills
    // the next one (batches grow with the backlog); when idle, a request
    // waits at most this long for company.
    constexpr std::chrono::milliseconds kBatchWait{5};
    result = consumer_->poll_batch(options_.batch_size, kBatchWait, batch_);
    if (!result) break;
    if (!batch_.empty()) {
      result = ingest_batch(stop);
      if (!result) break;
    }
    producer_->poll(std::chrono::milliseconds(0));
    if (batch_.empty()) {
      result = mark_notified();  // otherwise done inside the next batch's transaction
      if (!result) break;
    }
    result = store_ready_offsets();
    if (!result) break;
    if (producer_->has_fatal_error()) {
      result = producer_->fatal_error();
      break;
    }
    if (!write_refused_.empty()) {
      result = Status::fatal(write_refused_);
      break;
    }
    if (Clock::now() >= next_recovery) {
      result = recover();
      if (!result) break;
      next_recovery = Clock::now() + options_.recovery_interval;
    }
  }
  // Drain: everything ingested is durable; publish what is queued, record
  // it, store the offsets whose dead letters arrived, then leave the group
  // (committing offsets).
  batch_.clear();
  const auto half = options_.drain_timeout / 2;
  if (!producer_->flush(half)) {
    spdlog::warn("drain: {} outcome/dead-letter message(s) not delivered in time; recovery will "
                 "publish the outcomes again", producer_->outq_len());
  }
  mark_notified().ignore();
  store_ready_offsets().ignore();
  if (!offsets_.empty()) {
    spdlog::warn("drain: {} batch(es) with undelivered dead letters keep their offsets "
                 "uncommitted; they will be consumed again", offsets_.size());
  }
  consumer_->close();
  producer_->close(half);
  spdlog::info("drained and stopped");
  return result;
}

Status Worker::ingest_batch(const std::atomic<bool>& stop) {
  const auto started = Clock::now();
  probe_.on_batch(batch_.size());
  PendingOffsets& entry = offsets_.emplace_back();
  entry.offsets = Consumer::offsets_of(batch_);
  new_.clear();
  new_message_.clear();
  for (std::size_t i = 0; i < batch_.size(); ++i) {
    const rd_kafka_message_t& m = *batch_[i];
    const std::string_view bytes(static_cast<const char*>(m.payload), m.payload ? m.len : 0);
    NewTransfer t;
    const RequestError e = parse_request(bytes, t.request);
    if (e != RequestError::ok) {
      probe_.on_request(RequestResult::invalid);
      if (Status s = dead_letter(entry, std::move(batch_[i]), Reason::invalid, error_code(e),
                                 error_message(e));
          !s) {
        if (s.kind() != ErrorKind::fatal) {
          consume_again(entry, s);
          return Status::ok();
        }
        entry.offsets.reset();  // not written: consumed again (see below)
        return s;
      }
      continue;
    }
    rd_kafka_timestamp_type_t type;
    t.payload_hash = payload_hash(t.request);
    t.requested_at_ms = rd_kafka_message_timestamp(&m, &type);
    t.origin_topic = rd_kafka_topic_name(m.rkt);
    t.origin_partition = m.partition;
    t.origin_offset = m.offset;
    new_.push_back(t);
    new_message_.push_back(i);
  }

  // The store may be unavailable: keep the batch (its offsets unstored, and
  // no later batch consumed) and retry until it is written or we stop.
  for (int attempt = 0;; ++attempt) {
    Status s = write_batch();
    if (s) break;
    probe_.on_store_error("ingest", s);
    if (s.kind() == ErrorKind::fatal || stop.load(std::memory_order_relaxed)) {
      // The batch is not known to be written, so its offsets must not be
      // stored (the drain would commit them and the requests would be
      // lost): it is consumed again, and what was written is found as
      // duplicates. The entry stays until the delivery reports of its dead
      // letters, which point at it, have arrived.
      entry.offsets.reset();
      return s.kind() == ErrorKind::fatal ? s : Status::ok();
    }
    std::this_thread::sleep_for(backoff(attempt));
  }
  notified_ids_.clear();
  notified_ends_.clear();

  std::size_t accepted = 0;
  std::size_t duplicates = 0;
  for (std::size_t i = 0; i < new_.size(); ++i) {
    if (inserted_[i] == InsertResult::inserted) ++accepted;
    if (inserted_[i] == InsertResult::duplicate) ++duplicates;
    if (inserted_[i] != InsertResult::conflict) continue;
    probe_.on_request(RequestResult::conflict);
    const std::string msg = "transfer id " + std::string(new_[i].request.id) +
                            " was already used with a different payload; the first one stands";
    if (Status s = dead_letter(entry, std::move(batch_[new_message_[i]]), Reason::conflict,
                               "conflict", msg);
        !s) {
      // Never store offsets past a conflict not dead-lettered. The batch is
      // durable: consuming it again finds duplicates and the conflicts.
      if (s.kind() == ErrorKind::fatal) {
        entry.offsets.reset();
        return s;
      }
      consume_again(entry, s);
      break;
    }
  }
  probe_.on_request(RequestResult::accepted, accepted);
  probe_.on_request(RequestResult::duplicate, duplicates);
  probe_.on_stage("ingest", Clock::now() - started);
  publish_finished(true);
  return Status::ok();
}

Status Worker::write_batch() {
  // One store: delivered-outcome flags, the inserts and every stage of the
  // batch commit together. Several stores: each step commits on its own.
  Store& transfers = ledger_.transfers();
  const bool scoped = ledger_.shard_count() == 1 && transfers.supports_scope();
  items_.clear();
  if (scoped) {
    if (Status s = transfers.begin_scope(); !s) return s;
  }
  auto fail = [&](Status s) {
    if (scoped) transfers.end_scope(false).ignore();
    return s;
  };
  if (scoped && !notified_ends_.empty()) {
    if (Status s = mark_notified_in_store(); !s) return fail(s);
  }
  inserted_.resize(new_.size());
  if (!new_.empty()) {
    if (Status s = transfers.insert_transfers(new_, options_.worker_id, options_.lease_ms, inserted_); !s) {
      return fail(s);
    }
  }
  if (Status fp = SAGA_FAILPOINT("after_insert"); !fp) return fail(fp);
  for (std::size_t i = 0; i < new_.size(); ++i) {
    if (inserted_[i] != InsertResult::inserted) continue;
    const RequestView& r = new_[i].request;
    SagaItem& it = items_.emplace_back();
    it.id.assign(r.id);
    it.source.assign(r.from);
    it.destination.assign(r.to);
    it.currency.assign(r.currency);
    it.amount = r.amount;
    it.epoch = 1;
    it.requested_at_ms = new_[i].requested_at_ms;
    it.state = TransferState::initial;
    it.reason = Reason::none;
    it.dropped = false;
    it.fresh = scoped;
  }
  if (!scoped) {
    if (Status s = engine_.run(items_); !s) return s;  // transient errors leave items to recovery
    return mark_notified();
  }
  if (Status s = engine_.run_in_scope(items_); !s) return fail(s);
  if (Status s = transfers.end_scope(true); !s) return fail(s);
  return Status::ok();
}

void Worker::publish_finished(bool count_finished) {
  SAGA_FAILPOINT("before_publish").ignore();  // crash or pause only
  const auto started = Clock::now();
  const std::int64_t now = wall_ms();
  for (const SagaItem& it : items_) {
    if (it.dropped || !is_terminal(it.state)) continue;
    if (count_finished) {
      probe_.on_finished(it.state, it.reason,
                         it.requested_at_ms > 0 ? static_cast<double>(now - it.requested_at_ms) / 1000.0 : -1.0);
    }
    publish_outcome({it.id, it.state, it.reason, it.source, it.destination, it.amount, it.finished_at_ms});
  }
  probe_.on_stage("publish", Clock::now() - started);
}

void Worker::publish_outcome(const OutcomeFields& f) {
  format_outcome(f, outcome_json_);
  Status s = producer_->produce(options_.results_topic, f.id, outcome_json_, {}, &kOutcomeTag);
  if (!s) {
    // Not queued: the outbox flag stays false and recovery publishes it.
    if (outcome_failures_++ % 1000 == 0) spdlog::warn("outcome not queued: {}", s.message());
  }
}

Status Worker::dead_letter(PendingOffsets& entry, MessagePtr m, Reason reason, std::string_view code,
                           std::string_view message) {
  probe_.on_dead_letter(reason);
  DeadLetter& d = entry.dead.emplace_back();
  d.entry = &entry;
  d.original = std::move(m);
  d.why.append(to_string(reason)).append(1, '\n').append(code).append(1, '\n').append(message);
  return produce_dead_letter(d);
}

// The original bytes unchanged, or cut when they are refused as too large.
// A refusal of the message itself is final for it (give_up_dead_letter);
// anything else is the caller's to handle.
Status Worker::produce_dead_letter(DeadLetter& d) {
  const rd_kafka_message_t& m = *d.original;
  const std::string_view why = d.why;
  const std::size_t a = why.find('\n');
  const std::size_t b = why.find('\n', a + 1);
  const std::string partition = std::to_string(m.partition);
  const std::string offset = std::to_string(m.offset);
  const std::string original_size = std::to_string(m.payload ? m.len : 0);
  const std::string_view key(static_cast<const char*>(m.key), m.key ? m.key_len : 0);
  const std::string_view value(static_cast<const char*>(m.payload), m.payload ? m.len : 0);
  if (Status fp = SAGA_FAILPOINT("before_dead_letter"); !fp) return fp;
  for (;;) {
    const MessageHeader headers[] = {
        {"saga.reason", why.substr(0, a)},
        {"saga.error", why.substr(a + 1, b - a - 1)},
        {"saga.message", why.substr(b + 1)},
        {"saga.source.topic", rd_kafka_topic_name(m.rkt)},
        {"saga.source.partition", partition},
        {"saga.source.offset", offset},
        {"saga.truncated", "true"},
        {"saga.original.size", original_size},
    };
    const std::size_t n = d.truncated ? std::size(headers) : std::size(headers) - 2;
    rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;
    const Status s = producer_->produce(
        options_.dlq_topic, d.truncated ? key.substr(0, kDeadLetterKeyKeepBytes) : key,
        d.truncated ? value.substr(0, kDeadLetterKeepBytes) : value, std::span(headers, n), &d, &err);
    if (s) {
      d.state = DeadLetter::State::queued;
      ++d.entry->outstanding;
      return Status::ok();
    }
    if (too_large(err) && !d.truncated) {
      spdlog::warn("dead letter for {} partition {} offset {} is too large ({} bytes); sending it "
                   "truncated", rd_kafka_topic_name(m.rkt), m.partition, m.offset, original_size);
      d.truncated = true;
      continue;
    }
    if (refused_for_the_message(err)) {
      give_up_dead_letter(d, err);
      return Status::ok();
    }
    return s;
  }
}

void Worker::give_up_dead_letter(DeadLetter& d, rd_kafka_resp_err_t err) {
  const rd_kafka_message_t& m = *d.original;
  d.state = DeadLetter::State::given_up;
  probe_.on_dead_letter_undeliverable();
  spdlog::error("dead letter for {} partition {} offset {} ({} bytes) cannot be written to {} even "
                "truncated ({}); going on without it, its offset will be committed",
                rd_kafka_topic_name(m.rkt), m.partition, m.offset, m.payload ? m.len : 0,
                options_.dlq_topic, rd_kafka_err2name(err));
}

// A dead letter could not be queued for now (the local queue stayed full):
// rather than stopping the worker, the batch is consumed again from its
// first message. None of its offsets is stored; what it wrote is found again
// as duplicates, and its dead letters are sent again.
void Worker::consume_again(PendingOffsets& entry, const Status& why) {
  entry.offsets.reset();
  TopicPartitionListPtr first(rd_kafka_topic_partition_list_new(16));
  auto add = [&](const rd_kafka_message_t& m) {
    const char* topic = rd_kafka_topic_name(m.rkt);
    rd_kafka_topic_partition_t* tp = rd_kafka_topic_partition_list_find(first.get(), topic, m.partition);
    if (tp == nullptr) tp = rd_kafka_topic_partition_list_add(first.get(), topic, m.partition);
    if (tp->offset < 0 || m.offset < tp->offset) tp->offset = m.offset;
  };
  for (const MessagePtr& m : batch_) {
    if (m) add(*m);
  }
  for (const DeadLetter& d : entry.dead) add(*d.original);
  spdlog::warn("{}; consuming the batch again from its first message", why.message());
  if (Status s = consumer_->seek(*first); !s) {
    // A partition revoked meanwhile: its next owner starts from the last
    // committed offset, which is not past this batch either.
    spdlog::warn("{}", s.message());
  }
}

Status Worker::store_ready_offsets() {
  while (!offsets_.empty() && offsets_.front().outstanding == 0) {
    PendingOffsets& front = offsets_.front();
    if (!front.offsets) {  // a batch given up unwritten (ingest_batch)
      offsets_.pop_front();
      continue;
    }
    if (front.failed) {
      // Later batches were consumed after this one, so it cannot be consumed
      // again: its dead letters are retried until delivered or given up.
      front.failed = false;
      for (DeadLetter& d : front.dead) {
        if (d.state != DeadLetter::State::to_send) continue;
        if (Status s = produce_dead_letter(d); !s) {
          if (s.kind() == ErrorKind::fatal) return s;
          spdlog::warn("dead letter not queued again: {}", s.message());
          front.failed = true;
          break;
        }
      }
      return Status::ok();
    }
    SAGA_FAILPOINT("before_store_offsets").ignore();  // crash or pause only
    if (Status s = consumer_->store_offsets(*front.offsets); !s) {
      spdlog::warn("{}", s.message());  // redelivery is harmless: ingest is idempotent
    }
    offsets_.pop_front();
  }
  return Status::ok();
}

void Worker::on_delivery(const rd_kafka_message_t& m) {
  if ((m.err == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED ||
       m.err == RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED) &&
      write_refused_.empty()) {
    // No retry helps: the loop stops with this line. What was not delivered
    // is safe: outcomes are published again by recovery, and a batch whose
    // dead letter failed is consumed again.
    write_refused_ = "Kafka refused to let this principal write to " +
                     std::string(rd_kafka_topic_name(m.rkt)) + " (" + rd_kafka_err2str(m.err) +
                     "): it needs Write on topics " + options_.results_topic + " and " +
                     options_.dlq_topic + " (docs/kafka.md)";
  }
  if (m._private != &kOutcomeTag) {
    auto& d = *static_cast<DeadLetter*>(m._private);
    --d.entry->outstanding;
    if (!m.err) {
      d.state = DeadLetter::State::delivered;
    } else if (refused_for_the_message(m.err) && d.truncated) {
      give_up_dead_letter(d, m.err);
    } else {
      // Sent again (truncated, if the broker found it too large) by
      // store_ready_offsets once the batch's other reports are in.
      d.truncated = d.truncated || too_large(m.err);
      d.state = DeadLetter::State::to_send;
      d.entry->failed = true;
      spdlog::warn("dead letter not delivered ({}); sending it again", rd_kafka_err2name(m.err));
    }
    return;
  }
  if (m.err) {
    if (outcome_failures_++ % 1000 == 0) {
      spdlog::warn("outcome not delivered ({}); recovery will publish it again", rd_kafka_err2str(m.err));
    }
    return;
  }
  notified_ids_.append(static_cast<const char*>(m.key), m.key_len);
  notified_ends_.push_back(notified_ids_.size());
}

Status Worker::mark_notified_in_store() {
  notified_views_.clear();
  std::size_t begin = 0;
  for (std::size_t end : notified_ends_) {
    notified_views_.emplace_back(notified_ids_.data() + begin, end - begin);
    begin = end;
  }
  return ledger_.transfers().mark_notified(notified_views_);
}

Status Worker::mark_notified() {
  if (notified_ends_.empty()) return Status::ok();
  Status s = mark_notified_in_store();
  if (!s) {
    // Left unmarked, the outcomes are published again after their lease:
    // at least once, never lost.
    probe_.on_store_error("notify", s);
    if (s.kind() == ErrorKind::fatal) return s;
  }
  notified_ids_.clear();
  notified_ends_.clear();
  return Status::ok();
}

Status Worker::recover() {
  const auto started = Clock::now();
  // Bounded per tick so consumption keeps going while a backlog drains.
  for (int round = 0; round < 8; ++round) {
    Status s = ledger_.transfers().claim_expired(options_.worker_id, options_.lease_ms,
                                                 options_.batch_size, claimed_);
    if (!s) {
      probe_.on_store_error("claim", s);
      return s.kind() == ErrorKind::fatal ? s : Status::ok();
    }
    if (claimed_.empty()) break;
    if (Status fp = SAGA_FAILPOINT("after_recovery_claim"); !fp) return Status::ok();  // left to the next lease
    items_.clear();
    for (const TransferDoc& d : claimed_) {
      probe_.on_recovered(d.state);
      if (is_terminal(d.state)) {
        publish_outcome({d.id, d.state, d.reason, d.source, d.destination, d.amount, d.finished_at_ms});
      } else {
        items_.emplace_back().assign(d);
      }
    }
    spdlog::info("recovery: claimed {} transfer(s) whose lease expired", claimed_.size());
    if (Status r = engine_.run(items_); !r) return r;
    publish_finished(true);
    if (claimed_.size() < options_.batch_size) break;
  }
  probe_.on_stage("recovery", Clock::now() - started);
  return Status::ok();
}

}  // namespace sagapool
