-- Version 2: the reservation that keeps every debit's reversal within
-- INT64_MAX. An account's `reserved` is the sum of its pending entries'
-- `reserved` (a debit's amount, 0 for a credit), filled here from the
-- pending debits not reversed.
ALTER TABLE saga_accounts ADD COLUMN reserved bigint NOT NULL DEFAULT 0;
ALTER TABLE saga_pending ADD COLUMN reserved bigint NOT NULL DEFAULT 0;
UPDATE saga_pending e SET reserved = d.amount
  FROM saga_postings d
  WHERE d.transfer_id = e.transfer_id AND d.account_id = e.account_id AND d.kind = 'debit'
    AND NOT EXISTS (SELECT 1 FROM saga_postings r WHERE r.transfer_id = d.transfer_id
                      AND r.account_id = d.account_id AND r.kind = 'reverse_debit');
UPDATE saga_accounts a SET reserved = s.total
  FROM (SELECT account_id, sum(reserved) AS total FROM saga_pending GROUP BY account_id) s
  WHERE s.account_id = a.id AND s.total <> 0;
