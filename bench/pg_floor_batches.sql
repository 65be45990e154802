-- The PostgreSQL floor's setup (bench/pg_floor.sql, (h)), on a copy of the
-- ledger (accounts acct-0 .. acct-(naccounts-1)): 50 batches of `batch`
-- transfers, the accounts drawn as saga-producer draws them (Zipf, s = 1.1),
-- source and destination different. As `./dev bench` runs it:
-- psql -v naccounts=100000 -v batch=2500 -f bench/pg_floor_batches.sql.
DROP TABLE IF EXISTS floor_cdf, floor_batches;
-- Rank k (0-based) has weight 1 / (k + 1)^1.1; a pick is the first rank
-- whose cumulative weight reaches a uniform draw.
-- All double precision: a numeric cum would not match the draws' type, and
-- each pick would then scan the whole table instead of its index.
CREATE TABLE floor_cdf AS
  SELECT k, sum(1 / power(k + 1.0::float8, 1.1::float8)) OVER (ORDER BY k) AS cum
    FROM generate_series(0, :naccounts - 1) k;
CREATE INDEX ON floor_cdf (cum);
ANALYZE floor_cdf;
-- One store holds every account: every leg is here (bench/pg_floor.sql).
CREATE TABLE floor_batches (k integer, n integer, src text, dst text, amount bigint,
  src_here boolean NOT NULL DEFAULT true, dst_here boolean NOT NULL DEFAULT true, PRIMARY KEY (k, n));
INSERT INTO floor_batches
  SELECT b.k, b.n, 'acct-' || s.k,
      'acct-' || CASE WHEN d.k = s.k THEN (d.k + 1) % :naccounts ELSE d.k END, 1 + floor(random() * 10000)
    FROM (SELECT k, n, random() * (SELECT max(cum) FROM floor_cdf) AS x,
              random() * (SELECT max(cum) FROM floor_cdf) AS y
            FROM generate_series(1, 50) k, generate_series(1, :batch) n) b
    CROSS JOIN LATERAL (SELECT k FROM floor_cdf WHERE cum >= b.x ORDER BY cum LIMIT 1) s
    CROSS JOIN LATERAL (SELECT k FROM floor_cdf WHERE cum >= b.y ORDER BY cum LIMIT 1) d;
DROP TABLE floor_cdf;
VACUUM ANALYZE floor_batches;
