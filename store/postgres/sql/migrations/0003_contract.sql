-- Version 3, contract: once no build of version 2 runs, the call of
-- schema 2's first builds goes (saga_transition_at replaced it).
DROP FUNCTION IF EXISTS saga_transition(text[], text[], text[], text[], text[], bigint[], bigint);
