-- (a) plain ACID transfer: one transaction, two updates. pgbench -D sets
-- naccounts and zipf (0: uniform account choice, 1: Zipf with s = 1.1, like
-- saga-producer's generator). The two rows are locked in id order, so
-- concurrent transfers never deadlock.
\set src CASE WHEN :zipf = 1 THEN random_zipfian(1, :naccounts, 1.1) ELSE random(1, :naccounts) END
\set dst CASE WHEN :zipf = 1 THEN random_zipfian(1, :naccounts, 1.1) ELSE random(1, :naccounts) END
\set dst CASE WHEN :src = :dst THEN 1 + :src % :naccounts ELSE :dst END
\set amount random(1, 10000)
\set lo least(:src, :dst)
\set hi greatest(:src, :dst)
\set delta_lo CASE WHEN :lo = :src THEN -:amount ELSE :amount END
BEGIN;
UPDATE plain_accounts SET balance = balance + :delta_lo WHERE id = :lo;
UPDATE plain_accounts SET balance = balance - :delta_lo WHERE id = :hi;
COMMIT;
