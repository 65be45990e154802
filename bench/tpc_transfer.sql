-- (b) the two-phase-commit recipe done naively: one transfer at a time per
-- client, each of its 8 writes its own autocommitted transaction, each
-- conditional on the state it expects (as the recipe's updates are).
-- pgbench -D sets naccounts and zipf, as in plain_transfer.sql.
\set src CASE WHEN :zipf = 1 THEN random_zipfian(1, :naccounts, 1.1) ELSE random(1, :naccounts) END
\set dst CASE WHEN :zipf = 1 THEN random_zipfian(1, :naccounts, 1.1) ELSE random(1, :naccounts) END
\set dst CASE WHEN :src = :dst THEN 1 + :src % :naccounts ELSE :dst END
\set amount random(1, 10000)
-- 1. the transfer document, state initial
INSERT INTO tpc_transfers (source, destination, amount, state) VALUES (:src, :dst, :amount, 'initial') RETURNING id AS tid
\gset
-- 2. initial -> pending
UPDATE tpc_transfers SET state = 'pending', last_modified = now() WHERE id = :tid AND state = 'initial';
-- 3. debit the source, adding the transfer to its pending list
UPDATE tpc_accounts SET balance = balance - :amount, pending = array_append(pending, :tid::bigint) WHERE id = :src AND NOT (pending @> ARRAY[:tid::bigint]);
-- 4. credit the destination likewise
UPDATE tpc_accounts SET balance = balance + :amount, pending = array_append(pending, :tid::bigint) WHERE id = :dst AND NOT (pending @> ARRAY[:tid::bigint]);
-- 5. pending -> applied
UPDATE tpc_transfers SET state = 'applied', last_modified = now() WHERE id = :tid AND state = 'pending';
-- 6., 7. remove the transfer from both pending lists
UPDATE tpc_accounts SET pending = array_remove(pending, :tid::bigint) WHERE id = :src AND pending @> ARRAY[:tid::bigint];
UPDATE tpc_accounts SET pending = array_remove(pending, :tid::bigint) WHERE id = :dst AND pending @> ARRAY[:tid::bigint];
-- 8. applied -> done
UPDATE tpc_transfers SET state = 'done', last_modified = now() WHERE id = :tid AND state = 'applied';
