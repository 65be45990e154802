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
