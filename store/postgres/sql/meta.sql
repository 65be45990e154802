-- The meta table exists before any version does; exactly one row.
CREATE TABLE IF NOT EXISTS saga_meta (
  singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  schema_version integer NOT NULL,
  ledger_id text,
  shard_index integer,
  shard_count integer
)
