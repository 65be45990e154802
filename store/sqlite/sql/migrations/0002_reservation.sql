-- Version 2: the reservation that keeps every debit's reversal within
-- INT64_MAX. Run only on a store made by version 1 (its accounts have no
-- `reserved`), in init's transaction: the columns, then each pending
-- entry's reservation from its debit not reversed, then each account's sum.
ALTER TABLE accounts ADD COLUMN reserved INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pending ADD COLUMN reserved INTEGER NOT NULL DEFAULT 0;
UPDATE pending SET reserved = coalesce((
    SELECT d.amount FROM postings d
      WHERE d.transfer_id = pending.transfer_id AND d.account_id = pending.account_id
        AND d.kind = 'debit'
        AND NOT EXISTS (SELECT 1 FROM postings r WHERE r.transfer_id = d.transfer_id
                          AND r.account_id = d.account_id AND r.kind = 'reverse_debit')), 0);
UPDATE accounts SET reserved = coalesce((
    SELECT sum(e.reserved) FROM pending e WHERE e.account_id = accounts.id), 0);
