#pragma once
// One saga worker: consume a batch of requests, ingest it (validate, dead-
// letter what is invalid, insert the rest durably, then store the offsets),
// run the batch through the saga engine, publish outcomes with an outbox
// flag, and periodically recover transfers whose lease expired.
#include <atomic>
#include <chrono>
#include <deque>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "sagapool/kafka.hpp"
#include "sagapool/ledger.hpp"
#include "sagapool/outcome.hpp"
#include "sagapool/probe.hpp"
#include "sagapool/request.hpp"
#include "sagapool/saga_engine.hpp"
#include "sagapool/two_phase.hpp"
#include "sagapool/worker_io.hpp"

namespace sagapool {

struct WorkerOptions {
  std::string worker_id;
  std::string brokers;
  std::string group;
  std::string requests_topic = "transfers.requests";
  std::string results_topic = "transfers.results";
  std::string dlq_topic = "transfers.dlq";
  std::vector<KeyValue> kafka_opts;
  std::int64_t lease_ms = 30'000;
  std::size_t batch_size = 5000;
  std::chrono::milliseconds recovery_interval{1000};
  std::chrono::milliseconds drain_timeout{20'000};
};

// The worker's connections to the outside (worker_io.hpp).
struct WorkerIo {
  std::unique_ptr<RequestSource> source;
  std::unique_ptr<MessageOutput> output;
  WorkerClock* clock = nullptr;  // outlives the worker
  // More connections to the same single store (Ledger::open of the same
  // URL), one per extra lane: a batch is then split by partition and its
  // parts run as concurrent transactions (worker.cpp, write_lanes). Only
  // for a store that takes concurrent writers (PostgreSQL).
  std::vector<std::unique_ptr<Ledger>> lane_ledgers;
};

class Worker final : private DeliveryListener {
 public:
  Worker(const WorkerOptions& options, Ledger& ledger, WorkerProbe& probe, WorkerIo io);
  ~Worker() override;

  // Runs step() until `stop` is set or a step fails, then drains. Returns
  // non-ok only for fatal errors (the process should exit non-zero).
  Status run(const std::atomic<bool>& stop);
  // One turn of the loop: a batch, if one arrived, ingested and run through
  // the saga; delivery reports served; ready offsets stored; recovery when
  // it is due. Non-ok only for fatal errors.
  Status step(const std::atomic<bool>& stop);
  // Everything ingested is durable: publishes what is queued, records it,
  // stores the offsets whose dead letters arrived, and leaves the group.
  void drain();

  std::chrono::steady_clock::time_point last_loop() const noexcept {
    return std::chrono::steady_clock::time_point(
        std::chrono::steady_clock::duration(last_loop_.load(std::memory_order_relaxed)));
  }

 private:
  struct PendingOffsets;
  // One message for the dead-letter topic, until it is delivered or given up.
  // Its delivery report points at it (a deque element never moves). It holds
  // a copy of the original: the batch's messages are gone by the time a
  // failed delivery is sent again.
  struct DeadLetter {
    // given_up: refused even truncated, so logged, counted and passed.
    enum class State : std::uint8_t { to_send, queued, delivered, given_up };
    PendingOffsets* entry = nullptr;  // the batch it came in
    std::string topic;
    std::int32_t partition = 0;
    std::int64_t offset = 0;
    std::string key;
    std::string value;
    std::int64_t timestamp_ms = 0;
    std::vector<CopiedHeader> headers;  // the original's, saga.* left out
    std::string why;         // reason, code and message, '\n'-separated
    bool truncated = false;  // too large whole: sent cut (worker.cpp, kDeadLetterKeep*)
    std::uint8_t refused_whole = 0;  // times the broker found it too large uncut
    State state = State::to_send;
    // The `rejected` outcome answering the request on the results topic, when
    // its id could be read (none: answer_id empty, answer_state delivered).
    // The batch's offsets wait for it as for the dead letter.
    std::string answer_id;
    std::string answer;
    State answer_state = State::delivered;
    // What a delivery report's opaque points at: which of the two it is for.
    struct Part {
      DeadLetter* letter;
      bool answer;
    };
    Part letter_part{this, false};
    Part answer_part{this, true};
  };
  // A batch's offsets wait here until its dead letters are delivered, in
  // consumption order, so invalid input is never committed past unseen.
  struct PendingOffsets {
    std::vector<PartitionOffset> offsets;
    bool store = true;              // false: not to be stored (consumed again)
    std::size_t outstanding = 0;    // dead letters queued, not yet reported
    bool failed = false;            // some are to be sent (again)
    std::deque<DeadLetter> dead;
  };

  // One part of a batch, its own transaction on its own connection.
  struct Lane {
    Ledger* ledger = nullptr;
    SagaEngine* engine = nullptr;
    std::unique_ptr<SagaEngine> own_engine;  // lanes after the first
    std::vector<NewTransfer> requests;
    std::vector<std::size_t> index;  // requests[j] is new_[index[j]]
    std::vector<InsertResult> inserted;
    std::vector<SagaItem> items;
    std::size_t load = 0;
    bool committed = false;  // this batch's part: not run again on a retry
    std::future<Status> running;  // lanes after the first, while they run
  };

  Status ingest_batch(const std::atomic<bool>& stop);
  Status write_batch();  // inserts and runs the batch; one transaction on one store
  // Inserts `requests` and runs them in one scope (transaction) of `ledger`,
  // with the delivered-outcome flags when `with_notified`. On several stores
  // it runs only those whose accounts are all on the first, and leaves the
  // others in rest_ (SagaEngine::split_first_store).
  Status write_part(Ledger& ledger, SagaEngine& engine, std::span<const NewTransfer> requests,
                    std::vector<InsertResult>& inserted, std::vector<SagaItem>& items,
                    bool with_notified);
  // Several stores that can prepare: the flags, the inserts and every
  // transfer's whole saga in one transaction on each store, committed
  // together (TwoPhaseBatch).
  Status write_across();
  void split_into_lanes();
  Status write_lanes();
  Status recover();
  Status resolve_prepared_batches();
  void publish_finished(bool count_finished);
  void publish_outcome(const OutcomeFields& f);
  // Dead-letters `m`, and answers it with a `rejected` outcome when
  // `answer_id` (the id read from it) is not empty.
  Status dead_letter(PendingOffsets& entry, const ConsumedMessage& m, Reason reason,
                     std::string_view code, std::string_view message, std::string_view answer_id);
  Status produce_dead_letter(DeadLetter& d);  // what of it is still to send
  Status produce_letter(DeadLetter& d);
  Status produce_answer(DeadLetter& d);
  void give_up_dead_letter(DeadLetter& d, rd_kafka_resp_err_t err);
  void on_letter_delivery(DeadLetter& d, const DeliveryReport& r);
  void on_answer_delivery(DeadLetter& d, const DeliveryReport& r);
  void consume_again(PendingOffsets& entry, const Status& why);
  static void offsets_of(const std::vector<ConsumedMessage>& batch, std::vector<PartitionOffset>& out);
  Status store_ready_offsets();
  Status mark_notified();           // in its own transaction
  Status mark_notified_in_store();  // inside the caller's
  void on_delivery(const DeliveryReport& r) override;

  WorkerOptions options_;
  Ledger& ledger_;
  WorkerProbe& probe_;
  SagaEngine engine_;
  std::unique_ptr<TwoPhaseBatch> two_phase_;  // null: not every store can prepare
  std::unique_ptr<RequestSource> source_;
  std::unique_ptr<MessageOutput> output_;
  WorkerClock& clock_;
  std::chrono::steady_clock::time_point next_recovery_{};
  std::atomic<std::int64_t> last_loop_{0};

  // Per-batch buffers, reused so the hot path does not allocate per message.
  std::vector<ConsumedMessage> batch_;
  std::vector<NewTransfer> new_;
  std::vector<std::size_t> new_message_;  // new_[i] came from batch_[new_message_[i]]
  std::vector<InsertResult> inserted_;
  std::vector<SagaItem> items_;
  std::vector<SagaItem> rest_;  // several stores: the items that run after the insert's commit
  std::vector<TransferDoc> claimed_;
  std::vector<std::unique_ptr<Ledger>> lane_ledgers_;
  std::vector<Lane> lanes_;  // empty: one transaction per batch
  std::vector<std::pair<std::int32_t, std::size_t>> partition_lane_;
  std::string outcome_json_;
  RequestView invalid_;  // what parse_request could read of an invalid request
  std::string notified_ids_;           // delivered outcome ids, back to back
  std::vector<std::size_t> notified_ends_;
  std::vector<std::string_view> notified_views_;
  std::deque<PendingOffsets> offsets_;
  std::uint64_t outcome_failures_ = 0;
  std::string write_refused_;  // set by a delivery the ACLs refused: fatal
};

}  // namespace sagapool
