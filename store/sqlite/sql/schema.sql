-- The SQLite store's tables at the current schema version, created where
-- missing by every `sagactl init` (in one transaction). A store made by an
-- older version gets what it lacks from migrations/.

CREATE TABLE IF NOT EXISTS meta (
  key TEXT PRIMARY KEY,
  value TEXT NOT NULL
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS transfers (
  id TEXT PRIMARY KEY,
  source TEXT NOT NULL, destination TEXT NOT NULL, amount INTEGER NOT NULL,
  currency TEXT NOT NULL, metadata TEXT NOT NULL, payload_hash INTEGER NOT NULL,
  state TEXT NOT NULL, owner TEXT NOT NULL, epoch INTEGER NOT NULL,
  lease_until INTEGER NOT NULL, reason TEXT NOT NULL,
  created_at INTEGER NOT NULL, last_modified INTEGER NOT NULL,
  requested_at INTEGER NOT NULL, finished_at INTEGER NOT NULL,
  attempts INTEGER NOT NULL, notified INTEGER NOT NULL,
  origin_topic TEXT NOT NULL, origin_partition INTEGER NOT NULL,
  origin_offset INTEGER NOT NULL
) WITHOUT ROWID;

-- The recovery pass and the stuck gauges read only unfinished work: not
-- terminal, or its outcome not yet published. Spelled with comparisons, not
-- IN: an IN list in an index predicate opens a temporary b-tree on every
-- write of a transfer row. Queries repeat the predicate verbatim so that the
-- planner can use the index. transfers_unfinished was the IN spelling.
DROP INDEX IF EXISTS transfers_unfinished;
CREATE INDEX IF NOT EXISTS transfers_open ON transfers(lease_until)
  WHERE ((state <> 'done' AND state <> 'canceled') OR notified = 0);

-- reserved: the sum of the pending entries' reserved (schema version 2).
-- last_transfer, last_kind: the key of the account's latest posting, the
-- head of its chain; '' before its first (schema version 4).
CREATE TABLE IF NOT EXISTS accounts (
  id TEXT PRIMARY KEY, balance INTEGER NOT NULL, opening_balance INTEGER NOT NULL,
  min_balance INTEGER NOT NULL, currency TEXT NOT NULL,
  locked INTEGER NOT NULL, reserved INTEGER NOT NULL DEFAULT 0,
  last_transfer TEXT NOT NULL DEFAULT '', last_kind TEXT NOT NULL DEFAULT ''
) WITHOUT ROWID;

-- prev_transfer, prev_kind: the key of the same account's posting before
-- this one ('' for its first), so that an account's latest postings are
-- read by key from its head (schema version 4). An index on (account_id,
-- at) did that before, but each posting then wrote into a random leaf of
-- it: under uniform account choice a batch dirtied a page of log per
-- posting, and that index alone held the store to a third of its rate.
-- Stores from before version 4 keep it (postings_account) until the
-- contract step (migrations/0004_contract.sql) links their postings.
CREATE TABLE IF NOT EXISTS postings (
  transfer_id TEXT NOT NULL, account_id TEXT NOT NULL, kind TEXT NOT NULL,
  amount INTEGER NOT NULL, at INTEGER NOT NULL,
  prev_transfer TEXT NOT NULL DEFAULT '', prev_kind TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (transfer_id, account_id, kind)
) WITHOUT ROWID;

-- reserved: what the entry holds in its account's reserved (a debit's
-- amount, 0 for a credit); given back when the entry is dropped.
CREATE TABLE IF NOT EXISTS pending (
  account_id TEXT NOT NULL, transfer_id TEXT NOT NULL,
  reserved INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (account_id, transfer_id)
) WITHOUT ROWID;

-- A void fences a leg against zombies: once present, that leg never posts.
CREATE TABLE IF NOT EXISTS leg_voids (
  transfer_id TEXT NOT NULL, account_id TEXT NOT NULL, kind TEXT NOT NULL,
  PRIMARY KEY (transfer_id, account_id, kind)
) WITHOUT ROWID;

-- The outbox (schema version 7): the transfers a batch transaction finished
-- whose outcomes are not yet delivered to Kafka, one row per batch, the ids
-- as JSON arrays. Their rows say notified = 1 from the start, so a
-- delivered outcome costs no write of its row (one per transfer before, and
-- an entry in and out of transfers_open); delivery removes its id here.
-- Recovery turns a row whose lease ended back into per-row flags. Written
-- only once the floor is 7: builds of version 6 read only the flags.
-- AUTOINCREMENT: a committed seq is never reused, so a worker that
-- remembers its row never rewrites another's (one rolled back it forgets).
CREATE TABLE IF NOT EXISTS outbox (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  lease_until INTEGER NOT NULL, finished_at INTEGER NOT NULL,
  done TEXT NOT NULL, canceled TEXT NOT NULL
);

-- The worker registry (schema version 3): each running worker's build and a
-- heartbeat; `sagactl migrate --contract` reads it. Version-2 builds never
-- touch it, so adding it is an expand step.
CREATE TABLE IF NOT EXISTS workers (
  worker_id TEXT PRIMARY KEY,
  build_version TEXT NOT NULL, git_revision TEXT NOT NULL,
  schema_version INTEGER NOT NULL, lease_ms INTEGER NOT NULL,
  heartbeat_ms INTEGER NOT NULL
) WITHOUT ROWID;
