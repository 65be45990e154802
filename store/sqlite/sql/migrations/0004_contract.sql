-- Version 4's contract step, once no build older than 4 writes: every
-- posting linked to its account's one before it, in the order of
-- postings_account (time, then key), each account's head set to its latest,
-- and the index dropped. Rewrites each posting once, under the write lock.
-- Links version-4 workers wrote in the meantime are rewritten too: those are
-- in commit order, which older postings interleaved cannot be placed in.
UPDATE postings SET prev_transfer = c.prev_transfer, prev_kind = c.prev_kind
  FROM (SELECT transfer_id, account_id, kind,
               coalesce(lag(transfer_id) OVER w, '') AS prev_transfer,
               coalesce(lag(kind) OVER w, '') AS prev_kind
          FROM postings
          WINDOW w AS (PARTITION BY account_id ORDER BY at, transfer_id, kind)) AS c
  WHERE postings.transfer_id = c.transfer_id AND postings.account_id = c.account_id
    AND postings.kind = c.kind;
UPDATE accounts SET last_transfer = h.transfer_id, last_kind = h.kind
  FROM (SELECT account_id, transfer_id, kind,
               row_number() OVER (PARTITION BY account_id
                                  ORDER BY at DESC, transfer_id DESC, kind DESC) AS n
          FROM postings) AS h
  WHERE h.account_id = accounts.id AND h.n = 1;
DROP INDEX postings_account;
