-- Version 1: the tables. Times are bigint milliseconds since the Unix epoch
-- on the server's clock. NULL reason = none, NULL finished_at = not finished.
CREATE TABLE saga_transfers (
  id text PRIMARY KEY,
  source text NOT NULL,
  destination text NOT NULL,
  amount bigint NOT NULL CHECK (amount > 0),
  currency text NOT NULL,
  metadata text NOT NULL,
  payload_hash bigint NOT NULL,
  state text NOT NULL
    CHECK (state IN ('initial', 'pending', 'applied', 'canceling', 'done', 'canceled')),
  owner text NOT NULL,
  epoch bigint NOT NULL,
  lease_until_ms bigint NOT NULL,
  reason text CHECK (reason IN ('invalid', 'conflict', 'unknown_account', 'account_locked',
    'insufficient_funds', 'currency_mismatch', 'canceled_by_operator', 'overflow')),
  created_at_ms bigint NOT NULL,
  last_modified_ms bigint NOT NULL,
  requested_at_ms bigint NOT NULL,
  finished_at_ms bigint,
  attempts integer NOT NULL,
  notified boolean NOT NULL,
  origin_topic text NOT NULL,
  origin_partition integer NOT NULL,
  origin_offset bigint NOT NULL
);
-- The recovery pass: unfinished or unpublished work by lease expiry.
CREATE INDEX saga_transfers_recovery ON saga_transfers (lease_until_ms)
  WHERE state IN ('initial', 'pending', 'applied', 'canceling') OR NOT notified;
-- `sagactl stuck`: unfinished work by age.
CREATE INDEX saga_transfers_stale ON saga_transfers (last_modified_ms)
  WHERE state IN ('initial', 'pending', 'applied', 'canceling');
-- Per-state gauges of unfinished work, answered from this (small) index alone.
CREATE INDEX saga_transfers_state ON saga_transfers (state, created_at_ms, lease_until_ms)
  WHERE state IN ('initial', 'pending', 'applied', 'canceling');

CREATE TABLE saga_accounts (
  id text PRIMARY KEY,
  balance bigint NOT NULL,
  opening_balance bigint NOT NULL,
  min_balance bigint NOT NULL,
  currency text NOT NULL,
  locked boolean NOT NULL
);

-- The double-entry journal; never deleted. seq orders it.
CREATE TABLE saga_postings (
  seq bigint GENERATED ALWAYS AS IDENTITY,
  transfer_id text NOT NULL,
  account_id text NOT NULL REFERENCES saga_accounts (id),
  kind text NOT NULL CHECK (kind IN ('debit', 'credit', 'reverse_debit')),
  amount bigint NOT NULL CHECK (amount > 0),
  at_ms bigint NOT NULL,
  PRIMARY KEY (transfer_id, account_id, kind)
);
CREATE INDEX saga_postings_account ON saga_postings (account_id, seq);

-- The seeds' pendingTransactions, one row per entry.
CREATE TABLE saga_pending (
  account_id text NOT NULL REFERENCES saga_accounts (id),
  transfer_id text NOT NULL,
  PRIMARY KEY (account_id, transfer_id)
);

-- A void fences a leg against zombies: once present, that leg never posts.
-- No foreign key: a leg on an unknown account is voided too.
CREATE TABLE saga_leg_voids (
  transfer_id text NOT NULL,
  account_id text NOT NULL,
  kind text NOT NULL CHECK (kind IN ('debit', 'credit')),
  at_ms bigint NOT NULL,
  PRIMARY KEY (transfer_id, account_id, kind)
);
