-- The two-shard floor: bench/pg_floor.sql's rows (read it first), written
-- where a shard holds them, in bare SQL with no saga logic and no
-- cross-shard protocol: on each server the batch's legs whose accounts live
-- there (locked in id order, posted, each balance once); the transfers'
-- rows and the outbox row only on the server with :home = 1 (the first
-- shard holds every transfer document). Run at once on every server, a
-- batch is done when every server has committed it. With one server and
-- every leg here, it is pg_floor.sql on uniform batches.
-- One pgbench transaction = one batch of floor_batches (setup:
-- bench/pg_floor_shards_batches.sql).
\set r random(1, 2000000000)
\set k random(1, 50)
BEGIN;
SELECT count(*) FROM (SELECT a.id FROM saga_accounts a
    JOIN (SELECT src AS id FROM floor_batches WHERE k = :k AND src_here
          UNION SELECT dst FROM floor_batches WHERE k = :k AND dst_here) batch ON a.id = batch.id
    ORDER BY a.id FOR UPDATE OF a) locked;
INSERT INTO saga_postings (transfer_id, account_id, kind, amount, at_ms)
  SELECT 'floor-' || :r || '-' || n, CASE WHEN j = 1 THEN src ELSE dst END,
      CASE WHEN j = 1 THEN 'debit' ELSE 'credit' END, amount, 1700000000000
    FROM floor_batches, generate_series(1, 2) j
    WHERE k = :k AND ((j = 1 AND src_here) OR (j = 2 AND dst_here)) ORDER BY n, j;
UPDATE saga_accounts a SET balance = a.balance + d.delta
  FROM (SELECT acc, sum(delta) AS delta
          FROM (SELECT src AS acc, -amount AS delta FROM floor_batches WHERE k = :k AND src_here
                UNION ALL SELECT dst, amount FROM floor_batches WHERE k = :k AND dst_here) x
          GROUP BY acc) d
  WHERE a.id = d.acc AND d.delta <> 0;
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
