-- Version 8, expand: the commit decisions of batches across stores
-- (store.hpp, TwoPhaseStore). A batch whose accounts lie on several stores
-- runs in one transaction on each; the first store's transaction inserts
-- the batch's row here (committed) and its COMMIT is the commit point, the
-- others being prepared under the batch's name (gid) before it. Whoever
-- finds a prepared transaction left by a crash finishes it as this row
-- says, first inserting the row as an abort if there is none
-- (saga_decide), so a batch not committed never can be. Rows go once no
-- prepared transaction needs them. Builds before version 8 never run
-- batches across stores this way and never read the table.
CREATE TABLE IF NOT EXISTS saga_decisions (
  gid text PRIMARY KEY,
  committed boolean NOT NULL,
  at_ms bigint NOT NULL
);
