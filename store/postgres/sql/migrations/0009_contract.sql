-- Version 9, contract: the postings from before version 9 (no batch; none
-- is added once every build calls this version's functions) keep an index
-- by account of their own, which no later posting enters, and the index of
-- every posting by account goes. The build reads those postings once,
-- holding off new postings meanwhile.
CREATE INDEX IF NOT EXISTS saga_postings_unbatched ON saga_postings (account_id, seq)
  WHERE batch IS NULL;
DROP INDEX IF EXISTS saga_postings_account;
