-- Version 9, expand: an account's postings are found through the batches
-- that posted to it, no longer through an index by account. Under uniform
-- account choice saga_postings_account took every posting into a random
-- leaf, and as it outgrew memory each checkpoint logged those leaves whole
-- again: the store slowed by a fifth over a few million transfers
-- (bench/REPORT.md, "The thirty-third session").
-- - A posting names its batch (a number per transaction that posts:
--   saga_batch_id), and saga_postings_batch finds a batch's postings of one
--   account. Batch numbers grow, so that index fills at its right edge.
-- - The UPDATE that moves an account's balance, holding its row lock, also
--   makes the batch its last one (last_batch) and keeps the one before
--   (prev_batch). One row of saga_batch_links per lock pass records, for
--   each account the batch posted to, its batch before this one: an
--   account's history walks back from last_batch (saga_account_postings).
--   Nothing is written per posting while the rows are locked.
-- - The functions of this version (installed by the same init) write all
--   of it, also for builds before version 9, which call them.
-- Postings from before this step have no batch; the contract gives them an
-- index of their own (0009_contract.sql).
-- Taken in 0005's order: batches lock accounts before the other tables.
LOCK TABLE saga_accounts, saga_postings IN ACCESS EXCLUSIVE MODE;
ALTER TABLE saga_accounts ADD COLUMN IF NOT EXISTS last_batch bigint,
  ADD COLUMN IF NOT EXISTS prev_batch bigint;
ALTER TABLE saga_postings ADD COLUMN IF NOT EXISTS batch bigint;
CREATE SEQUENCE IF NOT EXISTS saga_batches;
CREATE TABLE IF NOT EXISTS saga_batch_links (
  batch bigint NOT NULL,
  accounts text[] NOT NULL,
  prevs bigint[] NOT NULL  -- prevs[i]: accounts[i]'s batch before (NULL: none)
);
-- Out of line, uncompressed: arrays of thousands, written under the locks,
-- read a few at a time.
ALTER TABLE saga_batch_links ALTER accounts SET STORAGE EXTERNAL, ALTER prevs SET STORAGE EXTERNAL;
CREATE INDEX IF NOT EXISTS saga_batch_links_batch ON saga_batch_links (batch);
-- Scans the journal once (no entry: no posting has a batch yet), holding
-- the postings' lock meanwhile.
CREATE INDEX IF NOT EXISTS saga_postings_batch ON saga_postings (batch, account_id)
  WHERE batch IS NOT NULL;
