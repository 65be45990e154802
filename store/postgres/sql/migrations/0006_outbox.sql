-- Version 6, expand: the outbox of finished batches. A batch transaction
-- that writes transfers in their final state (pg_store.cpp, "Transfers
-- written behind") lists their ids here, one row per statement, instead of
-- leaving each row's `notified` false until an UPDATE per transfer once its
-- outcome is delivered: that update was a second row version and index
-- entry per transfer (bench/REPORT.md, "The seventeenth session"). A
-- finished transfer's outcome is unpublished while its row's `notified` is
-- false or its id is listed here; its row then says true.
-- Builds before version 6 read only the flag, so a store writes here only
-- once its floor is 6 (`sagactl migrate --contract`, or a store made from
-- nothing); until then the table stays empty and they run on unchanged.
CREATE TABLE IF NOT EXISTS saga_outbox (
  seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  lease_until_ms bigint NOT NULL,
  finished_at_ms bigint NOT NULL,
  done text[] NOT NULL,
  canceled text[] NOT NULL
);
