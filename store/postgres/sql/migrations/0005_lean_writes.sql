-- Version 5, expand (nothing older relies on what it removes): the
-- journal's and the pending list's foreign keys go, and account rows leave
-- room on their pages.
-- Every posting and pending entry is written by a function holding its
-- account's row lock, after reading that row, so the keys checked nothing
-- the function had not; their lookup per row was a quarter of a settled
-- batch's time (bench/REPORT.md, "Whole sagas in one call").
-- With room on the page, a balance update (no index covers it) writes its
-- new row version there (HOT): no new index entry per update. fillfactor
-- applies to pages written from now on; `VACUUM FULL saga_accounts` (which
-- locks the table) applies it to the pages a store already has.
-- Dropping a foreign key locks the referenced table too. Batches lock
-- saga_accounts before they read or write the other two: taken in that
-- order here, the step waits for running batches instead of holding
-- saga_postings while one of them waits for it (a deadlock).
LOCK TABLE saga_accounts, saga_pending, saga_postings IN ACCESS EXCLUSIVE MODE;
ALTER TABLE saga_postings DROP CONSTRAINT IF EXISTS saga_postings_account_id_fkey;
ALTER TABLE saga_pending DROP CONSTRAINT IF EXISTS saga_pending_account_id_fkey;
ALTER TABLE saga_accounts SET (fillfactor = 70);
