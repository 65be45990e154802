-- Version 4's expand step: the chain's columns (see schema.sql), on a store
-- made by version 3 or older. Older builds name the columns they write, so
-- they run on; their postings stay unlinked, and postings_account stays,
-- until the contract step.
ALTER TABLE accounts ADD COLUMN last_transfer TEXT NOT NULL DEFAULT '';
ALTER TABLE accounts ADD COLUMN last_kind TEXT NOT NULL DEFAULT '';
ALTER TABLE postings ADD COLUMN prev_transfer TEXT NOT NULL DEFAULT '';
ALTER TABLE postings ADD COLUMN prev_kind TEXT NOT NULL DEFAULT '';
