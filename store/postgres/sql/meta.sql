-- The meta table exists before any version does; exactly one row.
CREATE TABLE IF NOT EXISTS saga_meta (
  singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  schema_version integer NOT NULL,
  ledger_id text,
  shard_index integer,
  shard_count integer
);
-- schema_version is the floor: the oldest build that may run here (builds
-- before version 3 require it to equal their own). schema_expanded: the
-- newest version whose expand step is applied (NULL before version 3: the
-- same as schema_version).
ALTER TABLE saga_meta ADD COLUMN IF NOT EXISTS schema_expanded integer
