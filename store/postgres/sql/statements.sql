-- The statements the PostgreSQL store prepares on every connection, one per
-- `-- name:` line (pg_schema.cpp reads them by name, in the order of its Sql
-- enum). Tables are named unqualified, so that a URL's search_path
-- (options=-csearch_path=...) picks the schema. Times come from
-- saga_now_ms(), the server's clock.

-- name: saga_now
SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint;

-- name: saga_read_meta
-- Through jsonb: a store from before version 3 has no schema_expanded yet.
SELECT schema_version, ledger_id, shard_index, shard_count,
       coalesce((to_jsonb(m) ->> 'schema_expanded')::integer, schema_version)
  FROM saga_meta m;

-- name: saga_write_topology
UPDATE saga_meta SET ledger_id = $1, shard_index = $2, shard_count = $3;

-- name: saga_insert_transfers
SELECT r
  FROM saga_insert_transfers($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::bigint[], $8::bigint[], $9::text[], $10::integer[], $11::bigint[], $12, $13) AS r;

-- Inside a batch transaction, transfers are written behind (pg_store.cpp,
-- "Transfers written behind"): this checks a batch against what is stored,
-- one row per record in input order (0 new, 1 duplicate, 2 conflict, as
-- saga_insert_transfers answers), with the server's time once.
-- name: saga_check_transfers
SELECT CASE
    WHEN t.id IS NULL THEN 0::smallint
    WHEN t.payload_hash = u.hash AND t.source = u.source AND t.destination = u.destination
        AND t.amount = u.amount AND t.currency = u.currency AND t.metadata = u.metadata
      THEN 1::smallint
    ELSE 2::smallint END,
  (SELECT saga_now_ms())
  FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::bigint[]) WITH ORDINALITY
    AS u(id, source, destination, amount, currency, metadata, hash, n)
  LEFT JOIN saga_transfers t ON t.id = u.id
  ORDER BY u.n;

-- ... and this writes them, once, in the state the batch left them in (a
-- terminal one gets its finish time), owned at epoch 1; one still
-- `initial` as saga_insert_transfers would have stored it when checked. With
-- $18 (the store's floor is 6), the finished ones are listed in one outbox
-- row (migrations/0006_outbox.sql) and their own flags say true; without
-- it, each flag says false. One row: the time written ($17, or now) and the
-- number of rows. No ON CONFLICT: an id a concurrent batch committed
-- meanwhile fails the batch, which runs again and finds it a duplicate.
-- name: saga_insert_fresh
WITH now AS (SELECT coalesce($17::bigint, saga_now_ms()) AS v),
u AS (
  SELECT x.*, x.state IN ('done', 'canceled') AS finished,
      CASE WHEN x.state = 'initial' THEN x.created ELSE now.v END AS at
    FROM now, unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[],
        $6::text[], $7::bigint[], $8::bigint[], $9::text[], $10::integer[], $11::bigint[],
        $12::text[], $13::text[], $14::text[], $15::bigint[], $16::bigint[]) WITH ORDINALITY
      AS x(id, source, destination, amount, currency, metadata, hash, requested, topic,
        part, off, state, reason, owner, lease, created, n)),
ins AS (
  INSERT INTO saga_transfers (id, source, destination, amount, currency, metadata,
      payload_hash, state, owner, epoch, lease_until_ms, reason, created_at_ms,
      last_modified_ms, requested_at_ms, finished_at_ms, attempts, notified, origin_topic,
      origin_partition, origin_offset)
    SELECT u.id, u.source, u.destination, u.amount, u.currency, u.metadata, u.hash, u.state,
        u.owner, 1, u.at + u.lease, NULLIF(u.reason, 'none'), u.created, u.at, u.requested,
        CASE WHEN u.finished THEN u.at END, 0, u.finished AND $18::boolean, u.topic, u.part, u.off
      FROM u
      ORDER BY u.n
    RETURNING 1),
box AS (
  INSERT INTO saga_outbox (lease_until_ms, finished_at_ms, done, canceled)
    SELECT max(u.at + u.lease), max(u.at),
        coalesce(array_agg(u.id) FILTER (WHERE u.state = 'done'), '{}'),
        coalesce(array_agg(u.id) FILTER (WHERE u.state = 'canceled'), '{}')
      FROM u
      WHERE u.finished AND $18::boolean
      HAVING count(*) > 0)
SELECT (SELECT v FROM now), (SELECT count(*) FROM ins);

-- name: saga_transition
SELECT r
  FROM saga_transition_at($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::bigint[], $7, $8) AS r;

-- name: saga_claim_expired
SELECT id, source, destination, amount, currency, metadata, payload_hash, state, owner, epoch, lease_until_ms, reason, created_at_ms, last_modified_ms, requested_at_ms, finished_at_ms, attempts, notified, origin_topic, origin_partition, origin_offset
  FROM saga_claim_expired($1, $2, $3);

-- name: saga_take_over
UPDATE saga_transfers SET owner = $2, epoch = epoch + 1, attempts = attempts + 1, lease_until_ms = (SELECT saga_now_ms()) + $3
  WHERE id = $1 AND state IN ('initial', 'pending', 'applied', 'canceling')
  RETURNING id, source, destination, amount, currency, metadata, payload_hash, state, owner, epoch, lease_until_ms, reason, created_at_ms, last_modified_ms, requested_at_ms, finished_at_ms, attempts, notified, origin_topic, origin_partition, origin_offset;

-- name: saga_mark_notified
SELECT saga_mark_notified($1::text[]);

-- name: saga_load_transfer
-- A flag that says true is false while the id is in the outbox.
SELECT t.id, t.source, t.destination, t.amount, t.currency, t.metadata, t.payload_hash, t.state, t.owner, t.epoch, t.lease_until_ms, t.reason, t.created_at_ms, t.last_modified_ms, t.requested_at_ms, t.finished_at_ms, t.attempts,
    t.notified AND NOT EXISTS (SELECT 1 FROM saga_outbox o WHERE t.id = ANY (o.done) OR t.id = ANY (o.canceled)),
    t.origin_topic, t.origin_partition, t.origin_offset
  FROM saga_transfers t
  WHERE t.id = $1;

-- name: saga_list_stale
SELECT id, source, destination, amount, currency, metadata, payload_hash, state, owner, epoch, lease_until_ms, reason, created_at_ms, last_modified_ms, requested_at_ms, finished_at_ms, attempts, notified, origin_topic, origin_partition, origin_offset
  FROM saga_transfers
  WHERE state IN ('initial', 'pending', 'applied', 'canceling') AND last_modified_ms < $1
  ORDER BY last_modified_ms, id
  LIMIT $2;

-- Unfinished transfers by creation; finished ones whose outcome is not yet
-- published by finish time, from their flags and from the outbox. Read
-- every scrape, so one pass over the partial index saga_transfers_recovery,
-- whose predicate the WHERE repeats verbatim, and one over the (small)
-- outbox; the store runs it with sequential and bitmap scans off
-- (pg_store.cpp, state_stats).
-- name: saga_state_stats
WITH now AS (SELECT saga_now_ms() AS v)
SELECT s.state, sum(s.n)::bigint, min(s.oldest), sum(s.stuck)::bigint
  FROM (SELECT state, count(*) AS n,
            min(CASE WHEN state IN ('done', 'canceled') THEN finished_at_ms ELSE created_at_ms END) AS oldest,
            count(*) FILTER (WHERE lease_until_ms < (SELECT v FROM now)) AS stuck
          FROM saga_transfers
          WHERE state IN ('initial', 'pending', 'applied', 'canceling') OR NOT notified
          GROUP BY state
        UNION ALL
        SELECT b.state, b.n, o.finished_at_ms,
            CASE WHEN o.lease_until_ms < (SELECT v FROM now) THEN b.n ELSE 0 END
          FROM saga_outbox o
          CROSS JOIN LATERAL (VALUES ('done', cardinality(o.done)),
                                     ('canceled', cardinality(o.canceled))) AS b(state, n)
          WHERE b.n > 0) s
  GROUP BY s.state;

-- name: saga_scan_transfer_states
SELECT t.id, t.state, t.notified AND b.id IS NULL
  FROM saga_transfers t
  LEFT JOIN (SELECT unnest(o.done || o.canceled) AS id FROM saga_outbox o) b ON b.id = t.id;

-- name: saga_apply_legs
SELECT o_status, o_reason, o_currency
  FROM saga_apply_legs($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[]);

-- name: saga_settle
SELECT o_outcome, o_reason, o_currency
  FROM saga_settle_batch($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::boolean);

-- name: saga_settle_apply
SELECT saga_settle_apply();

-- name: saga_create_accounts
SELECT saga_create_accounts($1::text[], $2::bigint[], $3::bigint[], $4::text[], $5::boolean[]);

-- name: saga_load_account
SELECT id, balance, opening_balance, min_balance, currency, locked, reserved
  FROM saga_accounts
  WHERE id = $1;

-- name: saga_load_accounts
SELECT id, balance, opening_balance, min_balance, currency, locked, reserved
  FROM saga_accounts
  WHERE id = ANY (SELECT unnest($1::text[]));

-- Inside a batch transaction (a scope) the planning read also locks the
-- batch's accounts (saga_load_accounts_locked), so the plan sees the
-- balances the legs will.
-- name: saga_load_accounts_locked
SELECT id, balance, opening_balance, min_balance, currency, locked, reserved
  FROM saga_load_accounts_locked($1::text[]);

-- name: saga_set_locked
UPDATE saga_accounts SET locked = $2 WHERE id = $1;

-- name: saga_postings_for_transfer
SELECT transfer_id, account_id, kind, amount, at_ms
  FROM saga_postings
  WHERE transfer_id = $1
  ORDER BY seq;

-- Newest first, through the account's batches (functions.sql).
-- name: saga_postings_for_account
SELECT * FROM saga_account_postings($1::text, $2::bigint);

-- name: saga_pending_for_account
SELECT transfer_id FROM saga_pending WHERE account_id = $1 ORDER BY transfer_id;

-- name: saga_scan_accounts
SELECT id, balance, opening_balance, min_balance, currency, locked, reserved
  FROM saga_accounts;

-- name: saga_scan_postings
SELECT transfer_id, account_id, kind, amount, at_ms FROM saga_postings;

-- name: saga_scan_pending
SELECT account_id, transfer_id FROM saga_pending;

-- name: saga_register_worker
INSERT INTO saga_workers (worker_id, build_version, git_revision, schema_version, lease_ms,
                          heartbeat_ms)
  VALUES ($1, $2, $3, $4, $5, saga_now_ms())
  ON CONFLICT (worker_id) DO UPDATE SET build_version = EXCLUDED.build_version,
    git_revision = EXCLUDED.git_revision, schema_version = EXCLUDED.schema_version,
    lease_ms = EXCLUDED.lease_ms, heartbeat_ms = EXCLUDED.heartbeat_ms;

-- name: saga_deregister_worker
DELETE FROM saga_workers WHERE worker_id = $1;

-- name: saga_list_workers
SELECT worker_id, build_version, git_revision, schema_version, lease_ms, heartbeat_ms
  FROM saga_workers ORDER BY worker_id;

-- name: saga_recent_owners
-- An operator's command, once per upgrade: it may scan the table.
SELECT owner FROM saga_transfers WHERE lease_until_ms >= $1
UNION SELECT owner FROM saga_owners_seen WHERE seen_ms >= $1
ORDER BY 1;

-- ---- batches across stores (store.hpp, TwoPhaseStore) ----------------------

-- A walk's postings and voids (Store::write_walk), at $1 or now. Queued
-- inside a scope (rides with the next statement waited for, or with
-- PREPARE / COMMIT).
-- name: saga_write_walk
SELECT saga_write_walk(coalesce($1::bigint, saga_now_ms()), $2::text[], $3::text[], $4::text[],
    $5::bigint[], $6::text[], $7::text[], $8::text[]);

-- Sent with PREPARE or COMMIT (or before a statement that reads balances).
-- name: saga_walk_move
SELECT saga_walk_move($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::text[],
    $7::boolean[], $8::bigint[], $9::bigint[], $10::bigint[], $11::boolean[]);

-- The first store's scope: its COMMIT commits the batch. No ON CONFLICT: a
-- row already there (saga_decide recorded an abort) fails the scope.
-- name: saga_record_decision
INSERT INTO saga_decisions (gid, committed, at_ms) VALUES ($1, true, saga_now_ms());

-- name: saga_decide
SELECT saga_decide($1);

-- name: saga_list_decisions
SELECT gid FROM saga_decisions
  WHERE at_ms <= (SELECT saga_now_ms()) - $1::bigint
  ORDER BY at_ms, gid
  LIMIT $2;

-- name: saga_forget_decisions
DELETE FROM saga_decisions WHERE gid = ANY ($1::text[]);

-- This database's only (the view lists the whole server's), by the
-- server's clock; starts_with, not LIKE: a prefix is no pattern.
-- name: saga_list_prepared
SELECT gid FROM pg_prepared_xacts
  WHERE database = current_database() AND starts_with(gid, $1)
    AND prepared <= clock_timestamp() - $2::bigint * interval '1 millisecond'
  ORDER BY prepared, gid;

-- name: saga_prepared_stats
SELECT count(*), coalesce(floor(extract(epoch FROM min(prepared)) * 1000), 0)::bigint
  FROM pg_prepared_xacts
  WHERE database = current_database() AND starts_with(gid, $1);
