-- Tables of the two baselines, in their own database on the benchmark's
-- PostgreSQL server. :naccounts accounts, ids 1..:naccounts, each opening
-- with :balance (far more than any run can move, so no transfer fails).

-- (a) plain ACID: one row per account, nothing else.
DROP TABLE IF EXISTS plain_accounts;
CREATE TABLE plain_accounts (
  id integer PRIMARY KEY,
  balance bigint NOT NULL
);
INSERT INTO plain_accounts SELECT i, :balance FROM generate_series(1, :naccounts) AS i;

-- (b) the two-phase-commit recipe (MongoDB's account transfers) done
-- naively in SQL: a transfer document with a state, and a pending list on
-- each account.
DROP TABLE IF EXISTS tpc_accounts;
CREATE TABLE tpc_accounts (
  id integer PRIMARY KEY,
  balance bigint NOT NULL,
  pending bigint[] NOT NULL DEFAULT '{}'
);
INSERT INTO tpc_accounts (id, balance) SELECT i, :balance FROM generate_series(1, :naccounts) AS i;

DROP TABLE IF EXISTS tpc_transfers;
CREATE TABLE tpc_transfers (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  source integer NOT NULL,
  destination integer NOT NULL,
  amount bigint NOT NULL,
  state text NOT NULL,
  last_modified timestamptz NOT NULL DEFAULT now()
);
VACUUM ANALYZE plain_accounts;
VACUUM ANALYZE tpc_accounts;
VACUUM ANALYZE tpc_transfers;
