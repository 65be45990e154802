-- The PostgreSQL floors: what a batch of finished transfers writes, in bare
-- SQL with no saga logic, as the saga's batch transaction writes it on one
-- store: the batch's accounts locked in id order, two postings a transfer
-- (in batch order, under those locks, with the batch's number), each
-- account's balance once with its batch link and the batch's one link row
-- (store/postgres/sql/migrations/0009_batch_links.sql), and the transfers'
-- rows in their final state, listed in one outbox row. No checks, no
-- outcomes to decide.
-- On shards (the two-shard floor, (gf)) each server writes the legs whose
-- accounts live there (src_here, dst_here), and the transfers' and outbox
-- rows only where :home = 1 (the first shard holds every transfer
-- document), with no cross-shard protocol; a batch is done when every
-- server has committed it. On one store every leg is here and home = 1.
-- One pgbench transaction = one batch of floor_batches (setup:
-- bench/pg_floor_batches.sql for (h), bench/pg_floor_shards_batches.sql for
-- (gf)); transfers/s = tps x batch.
\set r random(1, 2000000000)
\set k random(1, 50)
BEGIN;
-- A join: written as `id = ANY (<the batch's ids from a subquery>)` the
-- lock pass ran ten times slower with two transactions in flight, on CPU
-- while waiting (bench/REPORT.md, "The sixteenth session"); the saga's own
-- lock pass gives a constant list (saga_accounts_locked).
SELECT count(*) FROM (SELECT a.id FROM saga_accounts a
    JOIN (SELECT src AS id FROM floor_batches WHERE k = :k AND src_here
          UNION SELECT dst FROM floor_batches WHERE k = :k AND dst_here) batch ON a.id = batch.id
    ORDER BY a.id FOR UPDATE OF a) locked;
-- (SELECT saga_batch_id()): one call a statement, not one a row.
INSERT INTO saga_postings (transfer_id, account_id, kind, amount, at_ms, batch)
  SELECT 'floor-' || :r || '-' || n, CASE WHEN j = 1 THEN src ELSE dst END,
      CASE WHEN j = 1 THEN 'debit' ELSE 'credit' END, amount, 1700000000000, (SELECT saga_batch_id())
    FROM floor_batches, generate_series(1, 2) j
    WHERE k = :k AND ((j = 1 AND src_here) OR (j = 2 AND dst_here)) ORDER BY n, j;
WITH moved AS (
  UPDATE saga_accounts a SET balance = a.balance + d.delta, prev_batch = a.last_batch,
      last_batch = (SELECT saga_batch_id())
    FROM (SELECT acc, sum(delta) AS delta
            FROM (SELECT src AS acc, -amount AS delta FROM floor_batches WHERE k = :k AND src_here
                  UNION ALL SELECT dst, amount FROM floor_batches WHERE k = :k AND dst_here) x
            GROUP BY acc) d
    WHERE a.id = d.acc
    RETURNING a.id, a.prev_batch)
INSERT INTO saga_batch_links (batch, accounts, prevs)
  SELECT (SELECT saga_batch_id()), array_agg(m.id), array_agg(m.prev_batch) FROM moved m;
INSERT INTO saga_transfers (id, source, destination, amount, currency, metadata, payload_hash, state,
    owner, epoch, lease_until_ms, reason, created_at_ms, last_modified_ms, requested_at_ms,
    finished_at_ms, attempts, notified, origin_topic, origin_partition, origin_offset)
  SELECT 'floor-' || :r || '-' || n, src, dst, amount, '', '{}', n, 'done', 'floor', 1,
      1700000030000, NULL, 1700000000000, 1700000000000, 1700000000000, 1700000000000, 0, true,
      'transfers', n % 12, n
    FROM floor_batches WHERE k = :k AND :home = 1;
INSERT INTO saga_outbox (lease_until_ms, finished_at_ms, done, canceled)
  SELECT 1700000030000, 1700000000000, array_agg('floor-' || :r || '-' || n), '{}'
    FROM floor_batches WHERE k = :k HAVING :home = 1;
COMMIT;
