-- The statements the SQLite store prepares (once per connection, on first
-- use), by name: sqlite_store.cpp asks for them as sql("NAME"). Unfinished
-- work is spelled as in the transfers_open index (schema.sql), so that the
-- planner uses it.

-- Schema and topology ---------------------------------------------------------

-- name: has_table
SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?1;

-- name: has_reserved_column
SELECT 1 FROM pragma_table_info('accounts') WHERE name = 'reserved';

-- name: has_chain_columns
SELECT 1 FROM pragma_table_info('accounts') WHERE name = 'last_transfer';

-- name: has_index
SELECT 1 FROM sqlite_master WHERE type = 'index' AND name = ?1;

-- name: read_meta
SELECT key, value FROM meta;

-- name: write_meta
INSERT INTO meta(key, value) VALUES (?1, ?2)
  ON CONFLICT(key) DO UPDATE SET value = excluded.value;

-- Transfers -------------------------------------------------------------------

-- name: insert_transfer
INSERT INTO transfers(id, source, destination, amount, currency, metadata,
    payload_hash, state, owner, epoch, lease_until, reason, created_at, last_modified,
    requested_at, finished_at, attempts, notified, origin_topic, origin_partition,
    origin_offset)
  VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'initial', ?8, 1, ?9, 'none',
    ?10, ?10, ?11, 0, 0, 0, ?12, ?13, ?14)
  ON CONFLICT(id) DO NOTHING;

-- What a repeated id is compared with.
-- name: transfer_payload
SELECT payload_hash, source, destination, amount, currency, metadata FROM transfers WHERE id = ?1;

-- A transition is fenced by (state, owner, epoch): a zombie's changes nothing.
-- name: transition
UPDATE OR FAIL transfers SET state = ?1, reason = ?2, last_modified = ?3, lease_until = ?4,
    finished_at = CASE WHEN ?7 THEN ?3 ELSE finished_at END,
    notified = CASE WHEN ?7 THEN 0 ELSE notified END
  WHERE id = ?5 AND state = ?6 AND owner = ?8 AND epoch = ?9;

-- name: claim_expired
UPDATE OR FAIL transfers SET owner = ?1, epoch = epoch + 1,
    attempts = attempts + 1, lease_until = ?2 + ?3
  WHERE id IN (SELECT id FROM transfers
                 WHERE ((state <> 'done' AND state <> 'canceled') OR notified = 0)
                   AND lease_until < ?2
                 ORDER BY lease_until LIMIT ?4)
  RETURNING id, source, destination, amount, currency, metadata, payload_hash, state, owner,
    epoch, lease_until, reason, created_at, last_modified, requested_at, finished_at, attempts,
    notified, origin_topic, origin_partition, origin_offset;

-- name: take_over
UPDATE OR FAIL transfers SET owner = ?1, epoch = epoch + 1,
    attempts = attempts + 1, lease_until = ?2
  WHERE id = ?3 AND state <> 'done' AND state <> 'canceled'
  RETURNING id, source, destination, amount, currency, metadata, payload_hash, state, owner,
    epoch, lease_until, reason, created_at, last_modified, requested_at, finished_at, attempts,
    notified, origin_topic, origin_partition, origin_offset;

-- name: mark_notified
UPDATE OR FAIL transfers SET notified = 1
  WHERE id = ?1 AND notified = 0 AND (state = 'done' OR state = 'canceled');

-- name: load_transfer
SELECT id, source, destination, amount, currency, metadata, payload_hash, state, owner,
    epoch, lease_until, reason, created_at, last_modified, requested_at, finished_at, attempts,
    notified, origin_topic, origin_partition, origin_offset
  FROM transfers WHERE id = ?1;

-- name: list_stale
SELECT id, source, destination, amount, currency, metadata, payload_hash, state, owner,
    epoch, lease_until, reason, created_at, last_modified, requested_at, finished_at, attempts,
    notified, origin_topic, origin_partition, origin_offset
  FROM transfers WHERE state IN ('initial','pending','applied','canceling')
    AND last_modified < ?1 ORDER BY last_modified LIMIT ?2;

-- Unfinished transfers by creation; finished ones whose outcome is not yet
-- published by finish time, from their flags (one pass over the
-- transfers_open index) and from the outbox.
-- name: state_stats
SELECT state, sum(n), min(oldest), sum(stuck) FROM (
  SELECT state, count(*) AS n,
         min(CASE WHEN state = 'done' OR state = 'canceled' THEN finished_at ELSE created_at END)
           AS oldest,
         sum(lease_until < ?1) AS stuck
    FROM transfers
    WHERE ((state <> 'done' AND state <> 'canceled') OR notified = 0)
    GROUP BY state
  UNION ALL
  SELECT 'done', json_array_length(done), finished_at,
         CASE WHEN lease_until < ?1 THEN json_array_length(done) ELSE 0 END
    FROM outbox WHERE done <> '[]'
  UNION ALL
  SELECT 'canceled', json_array_length(canceled), finished_at,
         CASE WHEN lease_until < ?1 THEN json_array_length(canceled) ELSE 0 END
    FROM outbox WHERE canceled <> '[]')
  GROUP BY state;

-- name: scan_transfer_states
SELECT id, state, notified FROM transfers;

-- A transfer created and finished inside one batch transaction, written once
-- in its last state when the batch ends; ?20: listed in the batch's outbox
-- row, so its flag says published (schema.sql, the outbox).
-- name: insert_fresh_transfer
INSERT OR FAIL INTO transfers(id, source, destination, amount, currency, metadata,
    payload_hash, state, owner, epoch, lease_until, reason, created_at, last_modified,
    requested_at, finished_at, attempts, notified, origin_topic, origin_partition,
    origin_offset)
  VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14,
    ?15, ?16, 0, ?20, ?17, ?18, ?19);

-- The outbox (schema.sql) ------------------------------------------------------

-- name: insert_outbox
INSERT INTO outbox(lease_until, finished_at, done, canceled) VALUES (?1, ?2, ?3, ?4);

-- name: rewrite_outbox
UPDATE outbox SET done = ?2, canceled = ?3 WHERE seq = ?1;

-- name: delete_outbox
DELETE FROM outbox WHERE seq = ?1;

-- name: expired_outbox
SELECT seq, lease_until FROM outbox WHERE lease_until < ?1 ORDER BY seq LIMIT 8;

-- An expired row's transfers flagged unpublished again, under its lease, for
-- claim_expired to find.
-- name: release_outbox
UPDATE transfers SET notified = 0, lease_until = ?2
  WHERE id IN (SELECT j.value FROM outbox o, json_each(o.done) j WHERE o.seq = ?1
               UNION ALL
               SELECT j.value FROM outbox o, json_each(o.canceled) j WHERE o.seq = ?1);

-- name: outbox_ids
SELECT j.value FROM outbox o, json_each(o.done) j
UNION ALL
SELECT j.value FROM outbox o, json_each(o.canceled) j;

-- name: outbox_lists
SELECT EXISTS (SELECT 1 FROM outbox o, json_each(o.done) j WHERE j.value = ?1)
    OR EXISTS (SELECT 1 FROM outbox o, json_each(o.canceled) j WHERE j.value = ?1);

-- Accounts --------------------------------------------------------------------

-- name: create_account
INSERT INTO accounts(id, balance, opening_balance, min_balance, currency, locked)
  VALUES (?1, ?2, ?2, ?3, ?4, ?5)
  ON CONFLICT(id) DO NOTHING;

-- The row, then the head of its postings' chain.
-- name: load_account
SELECT id, balance, opening_balance, min_balance, currency, locked, reserved,
    last_transfer, last_kind
  FROM accounts WHERE id = ?1;

-- name: set_locked
UPDATE OR FAIL accounts SET locked = ?1 WHERE id = ?2;

-- name: write_account
UPDATE OR FAIL accounts SET balance = ?1, reserved = ?3, last_transfer = ?4, last_kind = ?5
  WHERE id = ?2;

-- name: postings_for_transfer
SELECT transfer_id, account_id, kind, amount, at FROM postings
  WHERE transfer_id = ?1 ORDER BY at, kind;

-- Newest first: the account's head, then each posting's previous one.
-- name: postings_for_account
WITH RECURSIVE chain(transfer_id, kind, n) AS (
    SELECT last_transfer, last_kind, 1 FROM accounts
      WHERE id = ?1 AND last_transfer <> '' AND ?2 > 0
    UNION ALL
    SELECT p.prev_transfer, p.prev_kind, c.n + 1 FROM chain c JOIN postings p
      ON p.transfer_id = c.transfer_id AND p.account_id = ?1 AND p.kind = c.kind
      WHERE p.prev_transfer <> '' AND c.n < ?2)
SELECT p.transfer_id, p.account_id, p.kind, p.amount, p.at FROM chain c JOIN postings p
    ON p.transfer_id = c.transfer_id AND p.account_id = ?1 AND p.kind = c.kind
  ORDER BY c.n;

-- The same, on a store not yet contracted to version 4 (its postings are
-- not all linked, and postings_account is still there).
-- name: postings_for_account_by_time
SELECT transfer_id, account_id, kind, amount, at FROM postings
  WHERE account_id = ?1 ORDER BY at DESC LIMIT ?2;

-- name: pending_for_account
SELECT transfer_id FROM pending WHERE account_id = ?1;

-- name: scan_accounts
SELECT id, balance, opening_balance, min_balance, currency, locked, reserved FROM accounts;

-- name: scan_postings
SELECT transfer_id, account_id, kind, amount, at FROM postings;

-- name: scan_pending
SELECT account_id, transfer_id FROM pending;

-- Legs ------------------------------------------------------------------------

-- One read per leg: voided?, posted?, and the account's row.
-- name: leg_probe
SELECT EXISTS(SELECT 1 FROM leg_voids WHERE transfer_id = ?1 AND account_id = ?2 AND kind = ?3),
    EXISTS(SELECT 1 FROM postings WHERE transfer_id = ?1 AND account_id = ?2 AND kind = ?3),
    a.id IS NOT NULL, a.balance, a.min_balance, a.currency, a.locked, a.reserved,
    a.last_transfer, a.last_kind
  FROM (SELECT 1) LEFT JOIN accounts a ON a.id = ?2;

-- name: leg_voided
SELECT 1 FROM leg_voids WHERE transfer_id = ?1 AND account_id = ?2 AND kind = ?3;

-- ?6, ?7: the account's head before this posting.
-- name: insert_posting
INSERT OR FAIL INTO postings(transfer_id, account_id, kind, amount, at, prev_transfer, prev_kind)
  VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7);

-- name: posting_amount
SELECT amount FROM postings WHERE transfer_id = ?1 AND account_id = ?2 AND kind = ?3;

-- ?4, ?5: the posting just made, the account's new head.
-- name: set_balance
UPDATE OR FAIL accounts SET balance = ?1, reserved = reserved + ?3, last_transfer = ?4,
    last_kind = ?5
  WHERE id = ?2;

-- A pending entry added again (a debit and a credit of one transfer on one
-- account; the engine never sends that) holds both reservations.
-- name: add_pending
INSERT OR FAIL INTO pending(account_id, transfer_id, reserved) VALUES (?1, ?2, ?3)
  ON CONFLICT(account_id, transfer_id) DO UPDATE SET reserved = reserved + excluded.reserved;

-- Returns what the entry reserved.
-- name: drop_pending
DELETE FROM pending WHERE account_id = ?1 AND transfer_id = ?2 RETURNING reserved;

-- name: unreserve
UPDATE OR FAIL accounts SET reserved = reserved - ?1 WHERE id = ?2;

-- name: insert_void
INSERT OR FAIL INTO leg_voids(transfer_id, account_id, kind) VALUES (?1, ?2, ?3)
  ON CONFLICT DO NOTHING;

-- The worker registry (schema version 3) -------------------------------------

-- name: register_worker
INSERT INTO workers(worker_id, build_version, git_revision, schema_version, lease_ms,
    heartbeat_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
  ON CONFLICT(worker_id) DO UPDATE SET build_version = excluded.build_version,
    git_revision = excluded.git_revision, schema_version = excluded.schema_version,
    lease_ms = excluded.lease_ms, heartbeat_ms = excluded.heartbeat_ms;

-- name: deregister_worker
DELETE FROM workers WHERE worker_id = ?1;

-- name: list_workers
SELECT worker_id, build_version, git_revision, schema_version, lease_ms, heartbeat_ms
  FROM workers ORDER BY worker_id;

-- name: recent_owners
SELECT DISTINCT owner FROM transfers WHERE lease_until >= ?1 ORDER BY owner;
