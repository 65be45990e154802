#include "sagapool/worker.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "sagapool/failpoints.hpp"
#include "sagapool/log.hpp"

namespace sagapool {
namespace {

// Outcome delivery reports carry this tag; dead letters carry their batch's
// PendingOffsets.
char kOutcomeTag;

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

Worker::Worker(const WorkerOptions& options, Ledger& ledger, WorkerProbe& probe, WorkerIo io)
    : options_(options),
      ledger_(ledger),
      probe_(probe),
      engine_(ledger, {options.worker_id, options.lease_ms, 5}, &probe),
      source_(std::move(io.source)),
      output_(std::move(io.output)),
      clock_(*io.clock),
      next_recovery_(clock_.now()) {
  output_->set_listener(this);
  batch_.reserve(options.batch_size);
  new_.reserve(options.batch_size);
  items_.reserve(options.batch_size);
  if (TwoPhaseBatch::possible(ledger_)) {
    two_phase_ = std::make_unique<TwoPhaseBatch>(ledger_, options.worker_id);
    spdlog::info("{} stores: each batch in one transaction on each, committed by two-phase commit",
                 ledger_.shard_count());
  } else if (ledger_.shard_count() > 1) {
    spdlog::info("{} stores: batches across them commit stage by stage (a store cannot prepare "
                 "transactions; on PostgreSQL, max_prepared_transactions is 0)",
                 ledger_.shard_count());
  }
  lane_ledgers_ = std::move(io.lane_ledgers);
  if (!lane_ledgers_.empty()) {
    lanes_.resize(lane_ledgers_.size() + 1);
    lanes_[0].ledger = &ledger_;
    lanes_[0].engine = &engine_;
    for (std::size_t i = 1; i < lanes_.size(); ++i) {
      Lane& lane = lanes_[i];
      lane.ledger = lane_ledgers_[i - 1].get();
      lane.own_engine = std::make_unique<SagaEngine>(
          *lane.ledger, SagaEngine::Options{options.worker_id, options.lease_ms, 5}, &probe);
      lane.engine = lane.own_engine.get();
    }
  }
}

// The output goes first: closing it serves the last delivery reports, which
// still reach offsets_ and the notified buffer.
Worker::~Worker() {
  output_.reset();
  source_.reset();
}

Status Worker::run(const std::atomic<bool>& stop) {
  Status result;
  while (!stop.load(std::memory_order_relaxed) && (result = step(stop))) {
  }
  drain();
  return result;
}

Status Worker::step(const std::atomic<bool>& stop) {
  last_loop_.store(clock_.now().time_since_epoch().count(), std::memory_order_relaxed);
  // A short wait: under load, what arrived while the last batch ran fills
  // the next one (batches grow with the backlog); when idle, a request
  // waits at most this long for company.
  constexpr std::chrono::milliseconds kBatchWait{5};
  if (Status s = source_->poll_batch(options_.batch_size, kBatchWait, batch_); !s) return s;
  if (!batch_.empty()) {
    if (Status s = ingest_batch(stop); !s) return s;
  }
  output_->poll(std::chrono::milliseconds(0));
  if (batch_.empty()) {
    if (Status s = mark_notified(); !s) return s;  // otherwise done inside the next batch's transaction
  }
  if (Status s = store_ready_offsets(); !s) return s;
  if (Status s = output_->keep_usable(); !s) return s;
  if (!write_refused_.empty()) return Status::fatal(write_refused_);
  if (clock_.now() >= next_recovery_) {
    if (Status s = recover(); !s) return s;
    next_recovery_ = clock_.now() + options_.recovery_interval;
  }
  return Status::ok();
}

void Worker::drain() {
  batch_.clear();
  const auto half = options_.drain_timeout / 2;
  if (!output_->flush(half)) {
    spdlog::warn("drain: {} outcome/dead-letter message(s) not delivered in time; recovery will "
                 "publish the outcomes again", output_->outq_len());
  }
  mark_notified().ignore();
  store_ready_offsets().ignore();
  if (!offsets_.empty()) {
    spdlog::warn("drain: {} batch(es) with undelivered dead letters keep their offsets "
                 "uncommitted; they will be consumed again", offsets_.size());
  }
  source_->close();
  output_->close(half);
  spdlog::info("drained and stopped");
}

void Worker::offsets_of(const std::vector<ConsumedMessage>& batch, std::vector<PartitionOffset>& out) {
  // One past the highest offset per partition; batches hold few partitions.
  out.clear();
  for (const ConsumedMessage& m : batch) {
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const PartitionOffset& p) { return p.partition == m.partition; });
    if (it == out.end()) it = out.insert(out.end(), {m.partition, m.offset + 1});
    it->offset = std::max(it->offset, m.offset + 1);
  }
}

Status Worker::ingest_batch(const std::atomic<bool>& stop) {
  const auto started = clock_.now();
  probe_.on_batch(batch_.size());
  PendingOffsets& entry = offsets_.emplace_back();
  offsets_of(batch_, entry.offsets);
  new_.clear();
  new_message_.clear();
  for (std::size_t i = 0; i < batch_.size(); ++i) {
    const ConsumedMessage& m = batch_[i];
    NewTransfer t;
    const RequestError e = parse_request(m.value, t.request);
    if (e != RequestError::ok) {
      probe_.on_request(RequestResult::invalid);
      if (Status s = dead_letter(entry, m, Reason::invalid, error_code(e), error_message(e), t.request.id); !s) {
        if (s.kind() != ErrorKind::fatal) {
          consume_again(entry, s);
          return Status::ok();
        }
        entry.store = false;  // not written: consumed again (see below)
        return s;
      }
      continue;
    }
    t.payload_hash = payload_hash(t.request);
    t.requested_at_ms = m.timestamp_ms;
    t.origin_topic = m.topic;
    t.origin_partition = m.partition;
    t.origin_offset = m.offset;
    new_.push_back(t);
    new_message_.push_back(i);
  }

  if (!lanes_.empty()) split_into_lanes();
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
      entry.store = false;
      return s.kind() == ErrorKind::fatal ? s : Status::ok();
    }
    clock_.sleep_for(backoff(attempt));
    // A batch left prepared may hold what this one needs: recovery does
    // not run while this loop does.
    if (Status r = resolve_prepared_batches(); !r) {
      entry.store = false;
      return r;
    }
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
    if (Status s = dead_letter(entry, batch_[new_message_[i]], Reason::conflict, "conflict", msg,
                               new_[i].request.id);
        !s) {
      // Never store offsets past a conflict not dead-lettered. The batch is
      // durable: consuming it again finds duplicates and the conflicts.
      if (s.kind() == ErrorKind::fatal) {
        entry.store = false;
        return s;
      }
      consume_again(entry, s);
      break;
    }
  }
  probe_.on_request(RequestResult::accepted, accepted);
  probe_.on_request(RequestResult::duplicate, duplicates);
  probe_.on_stage("ingest", clock_.now() - started);
  publish_finished(true);
  return Status::ok();
}

namespace {

// The saga of a request just inserted.
void start_item(SagaItem& it, const NewTransfer& t, bool fresh) {
  const RequestView& r = t.request;
  it.id.assign(r.id);
  it.source.assign(r.from);
  it.destination.assign(r.to);
  it.currency.assign(r.currency);
  it.requested_currency.assign(r.currency);
  it.metadata.assign(r.metadata);
  it.amount = r.amount;
  it.epoch = 1;
  it.requested_at_ms = t.requested_at_ms;
  it.state = TransferState::initial;
  it.reason = Reason::none;
  it.dropped = false;
  it.fresh = fresh;
}

}  // namespace

Status Worker::write_batch() {
  // One store: delivered-outcome flags, the inserts and every stage of the
  // batch commit together (per lane, with lanes). Several stores that can
  // prepare: all of it in one transaction on each, committed together.
  // Several stores otherwise: the flags, the inserts and the transfers with
  // both accounts on the first store commit together there, and the others
  // run after, each stage committing on its own. Without scopes (MongoDB)
  // each step commits on its own.
  Store& transfers = ledger_.transfers();
  inserted_.resize(new_.size());
  if (transfers.supports_scope() && ledger_.shard_count() == 1) {
    if (!lanes_.empty()) return write_lanes();
    return write_part(ledger_, engine_, new_, inserted_, items_, true);
  }
  if (two_phase_) return write_across();
  if (transfers.supports_scope()) {
    if (Status s = write_part(ledger_, engine_, new_, inserted_, items_, true); !s) return s;
    for (SagaItem& it : rest_) it.fresh = false;  // committed, as `initial`
    Status s = engine_.run(rest_);  // transient errors leave items to recovery
    items_.insert(items_.end(), std::make_move_iterator(rest_.begin()), std::make_move_iterator(rest_.end()));
    rest_.clear();
    return s;
  }
  items_.clear();
  if (!new_.empty()) {
    if (Status s = transfers.insert_transfers(new_, options_.worker_id, options_.lease_ms, inserted_); !s) {
      return s;
    }
  }
  if (Status fp = SAGA_FAILPOINT("after_insert"); !fp) return fp;
  for (std::size_t i = 0; i < new_.size(); ++i) {
    if (inserted_[i] == InsertResult::inserted) start_item(items_.emplace_back(), new_[i], false);
  }
  if (Status s = engine_.run(items_); !s) return s;  // transient errors leave items to recovery
  return mark_notified();
}

Status Worker::write_part(Ledger& ledger, SagaEngine& engine, std::span<const NewTransfer> requests,
                          std::vector<InsertResult>& inserted, std::vector<SagaItem>& items,
                          bool with_notified) {
  Store& transfers = ledger.transfers();
  items.clear();
  if (Status s = transfers.begin_scope(); !s) return s;
  auto fail = [&](Status s) {
    transfers.end_scope(false).ignore();
    return s;
  };
  if (with_notified && !notified_ends_.empty()) {
    if (Status s = mark_notified_in_store(); !s) return fail(s);
  }
  inserted.resize(requests.size());
  if (!requests.empty()) {
    if (Status s = transfers.insert_transfers(requests, options_.worker_id, options_.lease_ms, inserted); !s) {
      return fail(s);
    }
  }
  if (Status fp = SAGA_FAILPOINT("after_insert"); !fp) return fail(fp);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (inserted[i] == InsertResult::inserted) start_item(items.emplace_back(), requests[i], true);
  }
  if (ledger.shard_count() > 1) engine.split_first_store(items, rest_);  // rest_: run after the commit
  if (Status s = engine.run_in_scope(items); !s) return fail(s);
  if (Status s = transfers.end_scope(true); !s) return fail(s);
  return Status::ok();
}

Status Worker::write_across() {
  items_.clear();
  if (Status s = two_phase_->begin(); !s) return s;
  auto fail = [&](Status s) {
    two_phase_->rollback();
    engine_.lock_next_walk();  // the accounts may have moved under its walk: not again
    return s;
  };
  if (!notified_ends_.empty()) {
    if (Status s = mark_notified_in_store(); !s) return fail(s);
  }
  if (!new_.empty()) {
    if (Status s = ledger_.transfers().insert_transfers(new_, options_.worker_id, options_.lease_ms, inserted_); !s) {
      return fail(s);
    }
  }
  if (Status fp = SAGA_FAILPOINT("after_insert"); !fp) return fail(fp);
  for (std::size_t i = 0; i < new_.size(); ++i) {
    if (inserted_[i] == InsertResult::inserted) start_item(items_.emplace_back(), new_[i], true);
  }
  if (Status s = engine_.run_across(items_); !s) return fail(s);
  Status s = two_phase_->commit();
  if (!s) engine_.lock_next_walk();
  return s;
}

// A batch's partitions, the busiest first, each to the lane with the fewest
// requests so far. A partition's requests stay in one lane, in order: per
// partition (so per source account) the batch runs as it would in one
// transaction. Rows lock in id order inside each statement, so two lanes
// wait on each other's hot accounts but cannot deadlock on them; a request
// id in two lanes is caught by the second insert, whose transaction fails
// (on the key, or, when the other holds its accounts, through the server's
// deadlock check) and, run again, finds the duplicate or the conflict.
void Worker::split_into_lanes() {
  partition_lane_.clear();
  for (const NewTransfer& t : new_) {
    auto it = std::find_if(partition_lane_.begin(), partition_lane_.end(),
                           [&](const auto& p) { return p.first == t.origin_partition; });
    if (it == partition_lane_.end()) it = partition_lane_.insert(partition_lane_.end(), {t.origin_partition, 0});
    ++it->second;
  }
  std::sort(partition_lane_.begin(), partition_lane_.end(),
            [](const auto& a, const auto& b) { return a.second > b.second; });
  for (Lane& lane : lanes_) {
    lane.load = 0;
    lane.committed = false;
    lane.requests.clear();
    lane.index.clear();
    lane.items.clear();
  }
  for (auto& [partition, count] : partition_lane_) {
    Lane* least = &lanes_[0];
    for (Lane& lane : lanes_) {
      if (lane.load < least->load) least = &lane;
    }
    least->load += count;
    count = static_cast<std::size_t>(least - lanes_.data());  // now the lane
  }
  for (std::size_t i = 0; i < new_.size(); ++i) {
    const auto it = std::find_if(partition_lane_.begin(), partition_lane_.end(),
                                 [&](const auto& p) { return p.first == new_[i].origin_partition; });
    Lane& lane = lanes_[it->second];
    lane.requests.push_back(new_[i]);
    lane.index.push_back(i);
  }
}

// The parts not yet committed, side by side: the first lane on this thread
// (with the delivered-outcome flags), the others on their own.
Status Worker::write_lanes() {
  for (std::size_t i = 1; i < lanes_.size(); ++i) {
    Lane& lane = lanes_[i];
    if (lane.committed || lane.requests.empty()) continue;
    lane.running = std::async(std::launch::async, [this, &lane] {
      return write_part(*lane.ledger, *lane.engine, lane.requests, lane.inserted, lane.items, false);
    });
  }
  Status result;
  for (Lane& lane : lanes_) {
    if (lane.committed) continue;
    Status s = &lane == &lanes_[0]
                   ? write_part(ledger_, engine_, lane.requests, lane.inserted, lane.items, true)
                   : lane.running.valid() ? lane.running.get() : Status::ok();
    if (s) {
      lane.committed = true;
    } else if (result || s.kind() == ErrorKind::fatal) {
      result = s;
    }
  }
  if (!result) return result;
  items_.clear();
  for (Lane& lane : lanes_) {
    for (std::size_t j = 0; j < lane.index.size(); ++j) inserted_[lane.index[j]] = lane.inserted[j];
    items_.insert(items_.end(), std::make_move_iterator(lane.items.begin()),
                  std::make_move_iterator(lane.items.end()));
  }
  return Status::ok();
}

void Worker::publish_finished(bool count_finished) {
  SAGA_FAILPOINT("before_publish").ignore();  // crash or pause only
  const auto started = clock_.now();
  const std::int64_t now = clock_.wall_ms();
  for (const SagaItem& it : items_) {
    if (it.dropped || !is_terminal(it.state)) continue;
    if (count_finished) {
      probe_.on_finished(it.state, it.reason,
                         it.requested_at_ms > 0 ? static_cast<double>(now - it.requested_at_ms) / 1000.0 : -1.0);
    }
    publish_outcome({it.id, it.state, it.reason, it.source, it.destination, it.amount, it.finished_at_ms,
                     it.requested_currency, it.metadata});
  }
  probe_.on_stage("publish", clock_.now() - started);
}

void Worker::publish_outcome(const OutcomeFields& f) {
  format_outcome(f, outcome_json_);
  Status s = output_->produce(options_.results_topic, f.id, outcome_json_, {}, &kOutcomeTag, nullptr, 0);
  if (!s) {
    // Not queued: the outbox flag stays false and recovery publishes it.
    if (outcome_failures_++ % 1000 == 0) spdlog::warn("outcome not queued: {}", s.message());
  }
}

Status Worker::dead_letter(PendingOffsets& entry, const ConsumedMessage& m, Reason reason,
                           std::string_view code, std::string_view message, std::string_view answer_id) {
  probe_.on_dead_letter(reason);
  DeadLetter& d = entry.dead.emplace_back();
  d.entry = &entry;
  d.topic.assign(m.topic);
  d.partition = m.partition;
  d.offset = m.offset;
  d.key.assign(m.key);
  d.value.assign(m.value);
  d.timestamp_ms = std::max<std::int64_t>(m.timestamp_ms, 0);
  // The original's headers travel on (tracing, ...), after ours; an
  // upstream saga.* header would pass for ours, so it is left out.
  source_->headers_of(m, d.headers);
  std::erase_if(d.headers, [](const CopiedHeader& h) { return h.name.starts_with("saga."); });
  d.why.append(to_string(reason)).append(1, '\n').append(code).append(1, '\n').append(message);
  log_event(spdlog::level::info, "dead-lettered",
            {{"transfer_id", answer_id}, {"reason", to_string(reason)}, {"error", code},
             {"topic", m.topic}, {"partition", std::int64_t{m.partition}}, {"offset", m.offset},
             {"worker", options_.worker_id}});
  if (!answer_id.empty()) {
    d.answer_id.assign(answer_id);
    format_rejection({answer_id, reason, code, message, m.topic, m.partition, m.offset, clock_.wall_ms()},
                     d.answer);
    d.answer_state = DeadLetter::State::to_send;
  }
  return produce_dead_letter(d);
}

Status Worker::produce_dead_letter(DeadLetter& d) {
  if (Status fp = SAGA_FAILPOINT("before_dead_letter"); !fp) return fp;
  if (d.state == DeadLetter::State::to_send) {
    if (Status s = produce_letter(d); !s) return s;
  }
  if (d.answer_state == DeadLetter::State::to_send) return produce_answer(d);
  return Status::ok();
}

// Small (an id, a code, a sentence), so never cut; a refusal of it is final
// like a dead letter's.
Status Worker::produce_answer(DeadLetter& d) {
  rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;
  const Status s = output_->produce(options_.results_topic, d.answer_id, d.answer, {}, &d.answer_part, &err, 0);
  if (s) {
    d.answer_state = DeadLetter::State::queued;
    ++d.entry->outstanding;
    return Status::ok();
  }
  if (refused_for_the_message(err)) {
    d.answer_state = DeadLetter::State::given_up;
    probe_.on_dead_letter_undeliverable();
    spdlog::error("the rejected outcome for {} partition {} offset {} cannot be written to {} ({}); "
                  "going on without it, its dead letter stands", d.topic, d.partition, d.offset,
                  options_.results_topic, rd_kafka_err2name(err));
    return Status::ok();
  }
  return s;
}

// The original bytes unchanged, or cut when they are refused as too large.
// A refusal of the message itself is final for it (give_up_dead_letter);
// anything else is the caller's to handle.
Status Worker::produce_letter(DeadLetter& d) {
  const std::string_view why = d.why;
  const std::size_t a = why.find('\n');
  const std::size_t b = why.find('\n', a + 1);
  const std::string partition = std::to_string(d.partition);
  const std::string offset = std::to_string(d.offset);
  const std::string original_size = std::to_string(d.value.size());
  const std::string_view key = d.key;
  const std::string_view value = d.value;
  for (;;) {
    std::vector<MessageHeader> headers = {
        {"saga.reason", why.substr(0, a)},
        {"saga.error", why.substr(a + 1, b - a - 1)},
        {"saga.message", why.substr(b + 1)},
        {"saga.source.topic", d.topic},
        {"saga.source.partition", partition},
        {"saga.source.offset", offset},
    };
    if (d.truncated) {
      // Cut to what any valid request fits in: the original headers stay out.
      headers.push_back({"saga.truncated", "true"});
      headers.push_back({"saga.original.size", original_size});
    } else {
      for (const CopiedHeader& h : d.headers) {
        headers.push_back({h.name, h.value ? std::string_view(*h.value) : std::string_view()});
      }
    }
    rd_kafka_resp_err_t err = RD_KAFKA_RESP_ERR_NO_ERROR;
    const Status s = output_->produce(
        options_.dlq_topic, d.truncated ? key.substr(0, kDeadLetterKeyKeepBytes) : key,
        d.truncated ? value.substr(0, kDeadLetterKeepBytes) : value, headers, &d.letter_part, &err,
        d.timestamp_ms);
    if (s) {
      d.state = DeadLetter::State::queued;
      ++d.entry->outstanding;
      return Status::ok();
    }
    if (too_large(err) && !d.truncated) {
      spdlog::warn("dead letter for {} partition {} offset {} is too large ({} bytes); sending it "
                   "truncated", d.topic, d.partition, d.offset, original_size);
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
  d.state = DeadLetter::State::given_up;
  probe_.on_dead_letter_undeliverable();
  spdlog::error("dead letter for {} partition {} offset {} ({} bytes) cannot be written to {} even "
                "truncated ({}); going on without it, its offset will be committed",
                d.topic, d.partition, d.offset, d.value.size(),
                options_.dlq_topic, rd_kafka_err2name(err));
}

// A dead letter could not be queued for now (the local queue stayed full):
// rather than stopping the worker, the batch is consumed again from its
// first message. None of its offsets is stored; what it wrote is found again
// as duplicates, and its dead letters are sent again.
void Worker::consume_again(PendingOffsets& entry, const Status& why) {
  entry.store = false;
  std::vector<PartitionOffset> first;  // the lowest offset per partition
  for (const ConsumedMessage& m : batch_) {
    auto it = std::find_if(first.begin(), first.end(),
                           [&](const PartitionOffset& p) { return p.partition == m.partition; });
    if (it == first.end()) it = first.insert(first.end(), {m.partition, m.offset});
    it->offset = std::min(it->offset, m.offset);
  }
  spdlog::warn("{}; consuming the batch again from its first message", why.message());
  if (Status s = source_->seek(first); !s) {
    // A partition revoked meanwhile: its next owner starts from the last
    // committed offset, which is not past this batch either.
    spdlog::warn("{}", s.message());
  }
}

Status Worker::store_ready_offsets() {
  while (!offsets_.empty() && offsets_.front().outstanding == 0) {
    PendingOffsets& front = offsets_.front();
    if (!front.store) {  // a batch given up unwritten or consumed again
      offsets_.pop_front();
      continue;
    }
    if (front.failed) {
      // Later batches were consumed after this one, so it cannot be consumed
      // again: its dead letters are retried until delivered or given up.
      front.failed = false;
      for (DeadLetter& d : front.dead) {
        if (d.state != DeadLetter::State::to_send && d.answer_state != DeadLetter::State::to_send) continue;
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
    if (Status s = source_->store_offsets(front.offsets); !s) {
      spdlog::warn("{}", s.message());  // redelivery is harmless: ingest is idempotent
    }
    offsets_.pop_front();
  }
  return Status::ok();
}

void Worker::on_delivery(const DeliveryReport& m) {
  if ((m.err == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED ||
       m.err == RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED) &&
      write_refused_.empty()) {
    // No retry helps: the loop stops with this line. What was not delivered
    // is safe: outcomes are published again by recovery, and a batch whose
    // dead letter failed is consumed again.
    write_refused_ = "Kafka refused to let this principal write to " +
                     std::string(m.topic) + " (" + rd_kafka_err2str(m.err) +
                     "): it needs Write on topics " + options_.results_topic + " and " +
                     options_.dlq_topic + " (docs/kafka.md)";
  }
  if (m.opaque != &kOutcomeTag) {
    const auto& part = *static_cast<const DeadLetter::Part*>(m.opaque);
    --part.letter->entry->outstanding;
    if (part.answer) {
      on_answer_delivery(*part.letter, m);
    } else {
      on_letter_delivery(*part.letter, m);
    }
    return;
  }
  if (m.err) {
    if (outcome_failures_++ % 1000 == 0) {
      spdlog::warn("outcome not delivered ({}); recovery will publish it again", rd_kafka_err2str(m.err));
    }
    return;
  }
  notified_ids_.append(m.key);
  notified_ends_.push_back(notified_ids_.size());
}

void Worker::on_letter_delivery(DeadLetter& d, const DeliveryReport& m) {
  if (!m.err) {
    d.state = DeadLetter::State::delivered;
  } else if (refused_for_the_message(m.err) && d.truncated) {
    give_up_dead_letter(d, m.err);
  } else {
    // Sent again by store_ready_offsets once the batch's other reports are
    // in. Cut if the broker found it too large, but a letter that fits the
    // cut size may only have shared a refused request with a large one: it
    // goes whole once more before it is cut.
    if (too_large(m.err) && !d.truncated) {
      d.truncated = d.value.size() > kDeadLetterKeepBytes || d.key.size() > kDeadLetterKeyKeepBytes ||
                    ++d.refused_whole > 1;
    }
    d.state = DeadLetter::State::to_send;
    d.entry->failed = true;
    spdlog::warn("dead letter not delivered ({}); sending it again", rd_kafka_err2name(m.err));
  }
}

void Worker::on_answer_delivery(DeadLetter& d, const DeliveryReport& m) {
  if (!m.err) {
    d.answer_state = DeadLetter::State::delivered;
  } else if (refused_for_the_message(m.err)) {
    d.answer_state = DeadLetter::State::given_up;
    probe_.on_dead_letter_undeliverable();
    spdlog::error("the rejected outcome for {} partition {} offset {} was refused by {} ({}); going on "
                  "without it, its dead letter stands", d.topic, d.partition, d.offset,
                  options_.results_topic, rd_kafka_err2name(m.err));
  } else {
    d.answer_state = DeadLetter::State::to_send;  // sent again, as a dead letter is
    d.entry->failed = true;
    spdlog::warn("rejected outcome not delivered ({}); sending it again", rd_kafka_err2name(m.err));
  }
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

// Batches across stores that a worker left prepared (a crash or a pause
// between prepare and finish), once a lease old: their prepared
// transactions hold their accounts' rows locked until finished.
Status Worker::resolve_prepared_batches() {
  if (!two_phase_) return Status::ok();
  ResolveCounts counts;
  Status s = resolve_prepared(ledger_, options_.lease_ms, counts);
  if (!s) probe_.on_store_error("resolve", s);
  return s.kind() == ErrorKind::fatal ? s : Status::ok();
}

Status Worker::recover() {
  const auto started = clock_.now();
  if (Status s = resolve_prepared_batches(); !s) return s;
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
      log_event(spdlog::level::info, "recovered: its lease had expired",
                {{"transfer_id", d.id}, {"state", to_string(d.state)}, {"epoch", d.epoch},
                 {"partition", std::int64_t{d.origin.partition}}, {"offset", d.origin.offset},
                 {"attempts", std::int64_t{d.attempts}}, {"worker", options_.worker_id}});
      if (is_terminal(d.state)) {
        publish_outcome({d.id, d.state, d.reason, d.source, d.destination, d.amount, d.finished_at_ms,
                         d.currency, d.metadata});
      } else {
        items_.emplace_back().assign(d);
      }
    }
    if (Status r = engine_.run(items_); !r) return r;
    publish_finished(true);
    if (claimed_.size() < options_.batch_size) break;
  }
  probe_.on_stage("recovery", clock_.now() - started);
  return Status::ok();
}

}  // namespace sagapool
