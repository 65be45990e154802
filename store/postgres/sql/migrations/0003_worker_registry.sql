-- Version 3, expand: the worker registry. Builds of version 2 never read
-- it, so they keep running beside those that write it.
CREATE TABLE IF NOT EXISTS saga_workers (
  worker_id text PRIMARY KEY,
  build_version text NOT NULL,
  git_revision text NOT NULL,
  schema_version integer NOT NULL,
  lease_ms bigint NOT NULL,
  heartbeat_ms bigint NOT NULL
);
-- Who ran a recovery pass (saga_claim_expired) when, busy or idle: how a
-- worker of version 2, which never registers, is seen even while it holds
-- no lease. One row per worker id ever seen.
CREATE TABLE IF NOT EXISTS saga_owners_seen (
  owner text PRIMARY KEY,
  seen_ms bigint NOT NULL
);
