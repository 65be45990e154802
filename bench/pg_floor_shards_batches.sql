-- The two-shard floor's setup (bench/pg_floor.sql, (gf)), on a copy of a
-- ledger (one store's, or one shard's: accounts acct-0 .. acct-(naccounts-1)
-- or the share of them that lives there): 50 batches of `batch` transfers,
-- the accounts drawn uniformly by hash, so every server draws the same
-- batches; src_here / dst_here say which legs' accounts live on this one.
-- psql -v naccounts=100000 -v batch=2500 -f bench/pg_floor_shards_batches.sql.
DROP TABLE IF EXISTS floor_batches;
CREATE TABLE floor_batches (k integer, n integer, src text, dst text, amount bigint,
  src_here boolean, dst_here boolean, PRIMARY KEY (k, n));
INSERT INTO floor_batches
  SELECT k, n, 'acct-' || s, 'acct-' || CASE WHEN d = s THEN (d + 1) % :naccounts ELSE d END,
      1 + abs(hashint4(k * 1000003 + n + 7)) % 10000, false, false
    FROM (SELECT k, n, abs(hashint4(k * 1000003 + n)) % :naccounts AS s,
              abs(hashint4(k * 1000003 + n + 500000)) % :naccounts AS d
            FROM generate_series(1, 50) k, generate_series(1, :batch) n) draws;
UPDATE floor_batches f SET src_here = EXISTS (SELECT 1 FROM saga_accounts a WHERE a.id = f.src),
                           dst_here = EXISTS (SELECT 1 FROM saga_accounts a WHERE a.id = f.dst);
VACUUM ANALYZE floor_batches;
