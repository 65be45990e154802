-- The functions are code, not data: every `sagactl init` (re)installs them
-- with CREATE OR REPLACE (same signatures), so a store at the current schema
-- version gets the current code too.
--
-- Each batch function is a handful of set-based statements over the input
-- arrays (unnest ... WITH ORDINALITY keeps input order), not one statement
-- per record: per-statement overhead, not the rows, was the cost. They run
-- in the caller's transaction, which may be a whole batch's (a scope), so
-- none of them commits, and every statement takes a fresh snapshot (READ
-- COMMITTED: the scope says so when it begins). Times come from
-- clock_timestamp() (saga_now_ms), not now(): now() is frozen at the start
-- of the transaction, and a lease must be measured from when it is written.
CREATE OR REPLACE FUNCTION saga_now_ms() RETURNS bigint LANGUAGE sql VOLATILE AS
$$ SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint $$;

-- This transaction's batch number, the same for every posting it writes: a
-- new one from saga_batches on its first call, kept in a setting local to
-- the transaction (a rolled-back subtransaction forgets it with its
-- postings). A sequence, not the transaction id: a dump restored elsewhere
-- keeps its value, so later batches never reuse a number.
CREATE OR REPLACE FUNCTION saga_batch_id() RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  v text := current_setting('saga.batch', true);
BEGIN
  IF coalesce(v, '') = '' THEN
    v := nextval('saga_batches')::text;
    PERFORM set_config('saga.batch', v, true);
  END IF;
  RETURN v::bigint;
END $$;

-- An account's latest postings, at most p_limit, newest first: from its
-- last batch back through saga_batch_links (migrations/0009_batch_links.sql),
-- each batch's postings in the order written; then those from before
-- version 9, newest first. Batches follow the order in which they locked the
-- account, which is the order their balances moved. STABLE: every read
-- sees the caller's snapshot, so a batch committing meanwhile is seen whole
-- or not at all.
CREATE OR REPLACE FUNCTION saga_account_postings(p_account text, p_limit bigint)
  RETURNS TABLE (o_transfer text, o_account text, o_kind text, o_amount bigint, o_at bigint)
  LANGUAGE plpgsql STABLE AS $$
DECLARE
  v_batch bigint;
  v_left bigint := p_limit;
  v_got bigint;
BEGIN
  SELECT a.last_batch INTO v_batch FROM saga_accounts a WHERE a.id = p_account;
  WHILE v_batch IS NOT NULL AND v_left > 0 LOOP
    RETURN QUERY SELECT p.transfer_id, p.account_id, p.kind, p.amount, p.at_ms FROM saga_postings p
      WHERE p.batch = v_batch AND p.account_id = p_account ORDER BY p.seq DESC LIMIT v_left;
    GET DIAGNOSTICS v_got = ROW_COUNT;
    v_left := v_left - v_got;
    SELECT l.prevs[array_position(l.accounts, p_account)] INTO v_batch FROM saga_batch_links l
      WHERE l.batch = v_batch AND p_account = ANY (l.accounts) LIMIT 1;
  END LOOP;
  IF v_left > 0 THEN
    RETURN QUERY SELECT p.transfer_id, p.account_id, p.kind, p.amount, p.at_ms FROM saga_postings p
      WHERE p.batch IS NULL AND p.account_id = p_account ORDER BY p.seq DESC LIMIT v_left;
  END IF;
END $$;

-- Results: 0 inserted, 1 duplicate, 2 conflict, -1 vanished (an error), one
-- row per input, in order. An id named twice in one batch: the first is
-- inserted, the later ones compare with it, as one by one.
CREATE OR REPLACE FUNCTION saga_insert_transfers(
    p_id text[], p_source text[], p_destination text[], p_amount bigint[], p_currency text[],
    p_metadata text[], p_hash bigint[], p_requested_at bigint[], p_topic text[],
    p_partition integer[], p_offset bigint[], p_owner text, p_lease_ms bigint)
  RETURNS SETOF smallint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  v_now bigint := saga_now_ms();
  v_inserted text[];
BEGIN
  WITH ins AS (
    INSERT INTO saga_transfers (id, source, destination, amount, currency, metadata,
        payload_hash, state, owner, epoch, lease_until_ms, reason, created_at_ms,
        last_modified_ms, requested_at_ms, finished_at_ms, attempts, notified, origin_topic,
        origin_partition, origin_offset)
      SELECT u.id, u.source, u.destination, u.amount, u.currency, u.metadata, u.hash,
          'initial', p_owner, 1, v_now + p_lease_ms, NULL, v_now, v_now, u.requested, NULL, 0,
          false, u.topic, u.part, u.off
        FROM unnest(p_id, p_source, p_destination, p_amount, p_currency, p_metadata, p_hash,
            p_requested_at, p_topic, p_partition, p_offset) WITH ORDINALITY
          AS u(id, source, destination, amount, currency, metadata, hash, requested, topic,
            part, off, n)
        ORDER BY u.n
      ON CONFLICT (id) DO NOTHING
      RETURNING id)
  SELECT array_agg(ins.id) INTO v_inserted FROM ins;
  -- A new statement, so a new snapshot: a row a concurrent insert committed
  -- (ON CONFLICT skipped it) is visible here, and so are our own.
  RETURN QUERY
    SELECT CASE
        WHEN u.n = u.first AND i.id IS NOT NULL THEN 0::smallint
        WHEN t.id IS NULL THEN -1::smallint
        WHEN t.payload_hash = u.hash AND t.source = u.source AND t.destination = u.destination
            AND t.amount = u.amount AND t.currency = u.currency AND t.metadata = u.metadata
          THEN 1::smallint
        ELSE 2::smallint END
      FROM (SELECT x.*, min(x.n) OVER (PARTITION BY x.id) AS first
              FROM unnest(p_id, p_source, p_destination, p_amount, p_currency, p_metadata,
                  p_hash) WITH ORDINALITY
                AS x(id, source, destination, amount, currency, metadata, hash, n)) u
      LEFT JOIN unnest(v_inserted) AS i(id) ON i.id = u.id
      LEFT JOIN saga_transfers t ON t.id = u.id
      ORDER BY u.n;
END $$;

-- One row per input, in order: the time written (the terminal states'
-- finished_at, which outcomes report), or NULL when not applied. Applied only
-- in `from`, owned by (owner, epoch). One UPDATE for the batch; a batch naming
-- an id twice (the engine never sends one) is applied one record at a time,
-- so a later record sees the earlier one's change. p_now: the time to write,
-- NULL for now; a call split over several statements writes one time.
CREATE OR REPLACE FUNCTION saga_transition_at(p_id text[], p_from text[], p_to text[],
    p_reason text[], p_owner text[], p_epoch bigint[], p_lease_ms bigint, p_now bigint)
  RETURNS SETOF bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  v_now bigint := coalesce(p_now, saga_now_ms());
  v_n integer := coalesce(array_length(p_id, 1), 0);
  v_terminal boolean;
BEGIN
  IF v_n > 1 AND (SELECT count(DISTINCT x) FROM unnest(p_id) AS x) < v_n THEN
    FOR i IN 1 .. v_n LOOP
      v_terminal := p_to[i] IN ('done', 'canceled');
      UPDATE saga_transfers t
        SET state = p_to[i], reason = NULLIF(p_reason[i], 'none'), last_modified_ms = v_now,
            lease_until_ms = v_now + p_lease_ms,
            finished_at_ms = CASE WHEN v_terminal THEN v_now ELSE t.finished_at_ms END,
            notified = CASE WHEN v_terminal THEN false ELSE t.notified END
        WHERE t.id = p_id[i] AND t.state = p_from[i] AND t.owner = p_owner[i]
          AND t.epoch = p_epoch[i];
      RETURN NEXT CASE WHEN FOUND THEN v_now END;
    END LOOP;
    RETURN;
  END IF;
  RETURN QUERY
    WITH u AS (
      SELECT x.*, x.to_state IN ('done', 'canceled') AS terminal
        FROM unnest(p_id, p_from, p_to, p_reason, p_owner, p_epoch) WITH ORDINALITY
          AS x(id, from_state, to_state, reason, owner, epoch, n)),
    upd AS (
      UPDATE saga_transfers t
        SET state = u.to_state, reason = NULLIF(u.reason, 'none'), last_modified_ms = v_now,
            lease_until_ms = v_now + p_lease_ms,
            finished_at_ms = CASE WHEN u.terminal THEN v_now ELSE t.finished_at_ms END,
            notified = CASE WHEN u.terminal THEN false ELSE t.notified END
        FROM u
        WHERE t.id = u.id AND t.state = u.from_state AND t.owner = u.owner AND t.epoch = u.epoch
        RETURNING u.n)
    SELECT CASE WHEN upd.n IS NOT NULL THEN v_now END FROM u LEFT JOIN upd ON upd.n = u.n ORDER BY u.n;
END $$;
-- saga_transition(p_id, p_from, p_to, p_reason, p_owner, p_epoch,
-- p_lease_ms), the call of schema 2's first builds, is left as those builds'
-- `init` made it until version 3's contract step drops it: reinstalling it
-- here would bring it back after the contract.

-- SKIP LOCKED: concurrent claimers split the expired rows between them and
-- never claim the same one; a row changed since the snapshot is re-checked
-- before it is locked.
CREATE OR REPLACE FUNCTION saga_claim_expired(p_owner text, p_lease_ms bigint, p_limit bigint)
  RETURNS SETOF saga_transfers LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  v_now bigint := saga_now_ms();
BEGIN
  -- Every worker calls this each recovery interval: the caller is seen
  -- (written at most once a second), which is how `sagactl migrate
  -- --contract` sees builds from before the worker registry.
  INSERT INTO saga_owners_seen AS s (owner, seen_ms) VALUES (p_owner, v_now)
    ON CONFLICT (owner) DO UPDATE SET seen_ms = EXCLUDED.seen_ms
    WHERE s.seen_ms < EXCLUDED.seen_ms - 1000;
  -- Outbox rows whose lease ended (their worker did not see the outcomes
  -- delivered): the transfers go back to their own flags, unpublished under
  -- the row's lease, and the claim below takes them as any other. A few rows
  -- a call (up to 10,000 ids each); the rest wait for the next.
  WITH gone AS (
    DELETE FROM saga_outbox o
      WHERE o.seq IN (SELECT b.seq FROM saga_outbox b WHERE b.lease_until_ms < v_now
                        ORDER BY b.seq LIMIT 8 FOR UPDATE SKIP LOCKED)
      RETURNING o.lease_until_ms, o.done || o.canceled AS ids)
  UPDATE saga_transfers t SET notified = false, lease_until_ms = g.lease_until_ms
    FROM gone g CROSS JOIN LATERAL unnest(g.ids) AS x(id)
    WHERE t.id = x.id;
  RETURN QUERY
    UPDATE saga_transfers t
      SET owner = p_owner, epoch = t.epoch + 1, attempts = t.attempts + 1,
          lease_until_ms = v_now + p_lease_ms
      WHERE t.id IN (
        SELECT c.id FROM saga_transfers c
          WHERE c.lease_until_ms < v_now
            AND (c.state IN ('initial', 'pending', 'applied', 'canceling') OR NOT c.notified)
          ORDER BY c.lease_until_ms
          LIMIT p_limit
          FOR UPDATE SKIP LOCKED)
      RETURNING t.*;
END $$;

-- Outcomes delivered (any number of ids, in any order): the outbox rows
-- listing them lose them (a row goes with its last), and the others' rows
-- get their flag. Only the outbox rows that list one of the ids are locked
-- (a row deleted meanwhile, claimed by recovery, is skipped: its ids are
-- flagged on their own rows by then), so workers marking their own batches
-- never wait on each other. Custom plans: with p_id a constant the server
-- hashes `= ANY (p_id)`. The flags' UPDATE is on one line for the plan test
-- (instantiate_postgresql.cpp).
CREATE OR REPLACE FUNCTION saga_mark_notified(p_id text[]) RETURNS void
  LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_custom_plan AS $$
DECLARE
  v_listed text[] := '{}';  -- the ids found in the outbox
  v_hit text[];
  v_rest text[];
  r record;
BEGIN
  FOR r IN SELECT o.seq, o.done, o.canceled FROM saga_outbox o
             WHERE EXISTS (SELECT 1 FROM unnest(o.done || o.canceled) AS e(id) WHERE e.id = ANY (p_id))
             ORDER BY o.seq FOR UPDATE LOOP
    v_hit := ARRAY(SELECT e.id FROM unnest(r.done || r.canceled) AS e(id) WHERE e.id = ANY (p_id));
    IF cardinality(v_hit) = cardinality(r.done) + cardinality(r.canceled) THEN
      DELETE FROM saga_outbox WHERE seq = r.seq;
    ELSE
      UPDATE saga_outbox
        SET done = ARRAY(SELECT unnest(r.done) EXCEPT SELECT unnest(v_hit)),
            canceled = ARRAY(SELECT unnest(r.canceled) EXCEPT SELECT unnest(v_hit))
        WHERE seq = r.seq;
    END IF;
    v_listed := v_listed || v_hit;
  END LOOP;
  -- Each listed id is in p_id, so as many means none is left.
  IF cardinality(v_listed) < cardinality(p_id) THEN
    v_rest := ARRAY(SELECT unnest(p_id) EXCEPT SELECT unnest(v_listed));
    -- By primary key (statements.sql had the reason when this was a statement).
    UPDATE saga_transfers SET notified = true WHERE id = ANY (v_rest) AND notified IS NOT TRUE AND state IN ('done', 'canceled');
  END IF;
END $$;

-- Serialises everything that decides on an account id that has no row yet:
-- legs (a void written from "no such account") and the account's creation.
-- FOR UPDATE locks nothing where there is no row, so without this a leg
-- voided for an unknown account could be posted by a paused worker once an
-- operator created the account, before the void committed (money destroyed
-- or created; docs/design-additions.md, "Legs on accounts that do not exist
-- yet"). Transaction-scoped advisory locks on 256 buckets of the id's hash:
-- a batch holds at most 256 of them whatever its size (the lock table is
-- small), and only batches naming a missing account, or creating accounts,
-- take any. Legs take them after the rows of the ids that have one
-- (saga_lock_missing_accounts).
CREATE OR REPLACE FUNCTION saga_lock_account_ids(p_id text[]) RETURNS void
  LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  k integer;
BEGIN
  FOR k IN SELECT DISTINCT hashtext(x) & 255 FROM unnest(p_id) AS x ORDER BY 1 LOOP
    PERFORM pg_advisory_xact_lock(1935763297, k);  -- 'saga' in ASCII: the class
  END LOOP;
END $$;

-- The accounts of p_id that have a row, locked in id order (so two callers
-- never wait on each other's accounts in opposite orders).
-- Custom plans: with p_id a constant the server hashes the `= ANY` list. A
-- row another transaction changed while this one waited for its lock is
-- checked against the list again (READ COMMITTED), and a generic plan walks
-- all of it each time: under uniform load the planning read then cost more
-- than the legs (bench/REPORT.md, "The planning read").
CREATE OR REPLACE FUNCTION saga_accounts_locked(p_id text[]) RETURNS SETOF saga_accounts
  LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_custom_plan AS $$
BEGIN
  RETURN QUERY SELECT * FROM saga_accounts WHERE id = ANY (p_id) ORDER BY id FOR UPDATE;
END $$;

-- The ids that had no row when the caller locked the rows of the others
-- (saga_accounts_locked): their buckets, in bucket order, then the rows of
-- any of them created before the buckets were granted (a new statement, so
-- a new snapshot), locked NOWAIT: a conflict fails the call, which is
-- retried. So a call holding buckets never waits for a row, and rows are
-- locked in id order: no two calls wait on each other in a cycle (one that
-- spans calls is broken by the server's deadlock check, and retried too).
-- The buckets are held to the end of the transaction, so an id still
-- without a row gets none before it ends. Rows first, buckets after: the
-- common call, every account there, pays one index pass over its ids, not a
-- second one to look for missing ids before it locks.
CREATE OR REPLACE FUNCTION saga_lock_missing_accounts(p_missing text[])
  RETURNS SETOF saga_accounts LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  PERFORM saga_lock_account_ids(p_missing);
  RETURN QUERY SELECT * FROM saga_accounts WHERE id = ANY (p_missing) ORDER BY id FOR UPDATE NOWAIT;
END $$;

-- The accounts of p_id (ids may repeat), locked, and those of its ids that
-- had no row: the planning read of a batch transaction, and the legs' and
-- saga_settle's lock pass (the legs after a planning read lock subsets of
-- its accounts again).
CREATE OR REPLACE FUNCTION saga_load_accounts_locked(p_id text[]) RETURNS SETOF saga_accounts
  LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  v_rows saga_accounts[];
  v_missing text[];
BEGIN
  SELECT coalesce(array_agg(a), '{}') INTO v_rows FROM saga_accounts_locked(p_id) AS a;
  RETURN QUERY SELECT * FROM unnest(v_rows);
  -- Rows are unique: as many as ids means every id has one. Fewer (ids
  -- repeat in the legs' calls) are checked in memory.
  IF cardinality(v_rows) < cardinality(p_id) THEN
    v_missing := ARRAY(SELECT u.id FROM unnest(p_id) AS u(id)
                       EXCEPT SELECT r.id FROM unnest(v_rows) AS r);
    IF cardinality(v_missing) > 0 THEN
      RETURN QUERY SELECT * FROM saga_lock_missing_accounts(v_missing);
    END IF;
  END IF;
END $$;

-- One row per leg, in input order: (status, reason, account currency).
-- The result of applying the legs one by one, computed in three phases:
-- 1. lock the batch's accounts (one order, so batches sharing accounts
--    queue instead of deadlocking) and read them, then read what the
--    journal, the voids and the pending list hold for every (transfer,
--    account) pair of the batch: a few statements, each after the lock, so
--    each sees everything committed before it was granted;
-- 2. walk the legs in order over that state, in memory (arrays): a leg sees
--    the balances and postings of the legs before it;
-- 3. write what changed: the new postings in leg order, the balances, the
--    pending entries and the voids, one statement each.
-- Only legs on locked accounts post, so nothing else can write the same
-- postings meanwhile: a unique violation there is a bug, and is raised.
-- The session's holding place for pending entries added inside a batch
-- transaction (see saga_apply_legs). Temporary: no WAL, emptied at every
-- commit or rollback, after saga_flush_scope_pending moved what is left.
CREATE OR REPLACE FUNCTION saga_create_scope_pending() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  CREATE TEMP TABLE IF NOT EXISTS saga_scope_pending (
    account_id text NOT NULL,
    transfer_id text NOT NULL,
    reserved bigint NOT NULL,
    PRIMARY KEY (account_id, transfer_id)
  ) ON COMMIT DELETE ROWS;
END $$;

-- Run by the store just before a batch transaction's COMMIT (in the same
-- round trip): the entries still held become saga_pending rows.
CREATE OR REPLACE FUNCTION saga_flush_scope_pending() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  IF to_regclass('pg_temp.saga_scope_pending') IS NULL THEN
    RETURN;
  END IF;
  INSERT INTO saga_pending (account_id, transfer_id, reserved)
    SELECT t.account_id, t.transfer_id, t.reserved FROM pg_temp.saga_scope_pending t
    ON CONFLICT (account_id, transfer_id) DO UPDATE SET reserved = EXCLUDED.reserved;
  DELETE FROM pg_temp.saga_scope_pending;
END $$;

CREATE OR REPLACE FUNCTION saga_apply_legs(p_op text[], p_transfer text[], p_account text[],
    p_amount bigint[], p_currency text[])
  RETURNS TABLE (o_status text, o_reason text, o_currency text)
  LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  c_max constant numeric := 9223372036854775807;
  v_now bigint := saga_now_ms();
  v_n integer := coalesce(array_length(p_op, 1), 0);
  -- accounts, by slot (id order)
  a_id text[];
  a_bal bigint[];
  a_bal0 bigint[];
  a_res bigint[];
  a_res0 bigint[];
  a_min bigint[];
  a_cur text[];
  a_locked boolean[];
  -- per leg: its account's slot (NULL: no such account) and its pair's
  l_acc integer[];
  l_pair integer[];
  -- per (transfer, account) pair: as stored (…0) and as the legs leave it
  q_tr text[];
  q_acc text[];
  q_debit bigint[];  -- amount of the posted debit, NULL: none
  q_credit boolean[];
  q_rev boolean[];
  q_vdebit boolean[];
  q_vdebit0 boolean[];
  q_vcredit boolean[];
  q_vcredit0 boolean[];
  q_need boolean[];
  q_pend boolean[];  -- as the pair's last leg leaves its pending entry; NULL: untouched
  q_held bigint[];   -- what the pair's pending entry reserves; NULL: no entry
  -- new postings, in leg order
  w_n integer := 0;
  w_tr text[] := '{}';
  w_acc text[] := '{}';
  w_kind text[] := '{}';
  w_amount bigint[] := '{}';
  k integer;
  q integer;
  v_amount bigint;
  v_debit boolean;
  -- what phase 3 has to write besides postings and balances
  v_pend_added boolean := false;
  v_pend_dropped boolean := false;
  v_voided boolean := false;
  -- Inside a batch transaction (the store sets saga.scope), pending entries
  -- this transaction adds go to the session's saga_scope_pending, and the
  -- store moves what is left of them into saga_pending just before COMMIT
  -- (saga_flush_scope_pending): an entry added and released in the same
  -- transaction never touches saga_pending (no row, index entry, foreign
  -- key check or dead tuple). q_real: the pair's entry is in saga_pending.
  v_scoped boolean := coalesce(current_setting('saga.scope', true), '') = 'on';
  q_real boolean[];
  v_real_dropped boolean := false;
  a_post boolean[];  -- per slot: a leg posted on it
  v_batch bigint;
BEGIN
  IF v_n = 0 THEN
    RETURN;
  END IF;
  IF to_regclass('pg_temp.saga_scope_pending') IS NULL THEN
    PERFORM saga_create_scope_pending();
  END IF;
  -- The accounts, locked (those of ids with no row too: their buckets). The
  -- arrays are filled in one pass over the same rows, so slot k is one
  -- account in each of them (slots need no order of their own).
  SELECT array_agg(a.id), array_agg(a.balance), array_agg(a.min_balance),
      array_agg(a.currency), array_agg(a.locked), array_agg(a.reserved)
    INTO a_id, a_bal, a_min, a_cur, a_locked, a_res
    FROM saga_load_accounts_locked(p_account) AS a;
  -- A pair is named by its first leg: pair slots are leg positions.
  SELECT array_agg(s.k ORDER BY u.n), array_agg(u.first ORDER BY u.n)
    INTO l_acc, l_pair
    FROM (SELECT x.n, x.acc, min(x.n) OVER (PARTITION BY x.tr, x.acc)::integer AS first
            FROM unnest(p_transfer, p_account) WITH ORDINALITY AS x(tr, acc, n)) u
    LEFT JOIN unnest(a_id) WITH ORDINALITY AS s(id, k) ON s.id = u.acc;
  a_bal0 := a_bal;
  a_res0 := a_res;
  a_post := array_fill(false, ARRAY[coalesce(cardinality(a_id), 0)]);
  -- What the journal and the voids hold for each pair, one index range of
  -- each per pair; a pair only released needs neither. Of the pending list
  -- only what each pair's entry reserves is read (a release or a reversal
  -- gives back exactly that); the list is written as the pair's last leg
  -- leaves it.
  q_need := array_fill(false, ARRAY[v_n]);
  FOR i IN 1 .. v_n LOOP
    q := l_pair[i];
    IF q = i THEN
      q_tr[q] := p_transfer[i];
      q_acc[q] := p_account[i];
    END IF;
    IF p_op[i] <> 'release' THEN
      q_need[q] := true;
    END IF;
  END LOOP;
  -- One sort, not one per array: ordered by n in the subquery, which the
  -- server never flattens (it has ORDER BY) and never runs in parallel (it
  -- reads a temporary table), so the aggregates read its rows in that order.
  -- Each lookup is a subquery per pair (LIMIT: never turned into a join), so
  -- it probes by key whatever the statistics say: as a join, an ANALYZE that
  -- found saga_pending without live entries made the generic plan compare
  -- every pair with every entry, 0.6-2.3 s a call as cross-shard sagas filled
  -- the table (bench/REPORT.md, "The eleventh session").
  SELECT array_agg(x.debit), array_agg(coalesce(x.credit, false)),
      array_agg(coalesce(x.rev, false)), array_agg(coalesce(x.vdebit, false)),
      array_agg(coalesce(x.vcredit, false)), array_agg(x.held), array_agg(x.is_real)
    INTO q_debit, q_credit, q_rev, q_vdebit, q_vcredit, q_held, q_real
    FROM (SELECT y.n, j.debit, j.credit, j.rev, v.vdebit, v.vcredit,
              coalesce(t.reserved, e.reserved) AS held, e.reserved IS NOT NULL AS is_real
            FROM unnest(q_tr, q_acc, q_need) WITH ORDINALITY AS y(tr, acc, need, n)
            LEFT JOIN LATERAL (
              SELECT e.reserved FROM saga_pending e
                WHERE e.account_id = y.acc AND e.transfer_id = y.tr LIMIT 1) e ON true
            LEFT JOIN pg_temp.saga_scope_pending t
              ON t.account_id = y.acc AND t.transfer_id = y.tr
            LEFT JOIN LATERAL (
              SELECT max(p.amount) FILTER (WHERE p.kind = 'debit') AS debit,
                  bool_or(p.kind = 'credit') AS credit, bool_or(p.kind = 'reverse_debit') AS rev
                FROM saga_postings p
                WHERE y.need AND p.transfer_id = y.tr AND p.account_id = y.acc) j ON true
            LEFT JOIN LATERAL (
              SELECT bool_or(w.kind = 'debit') AS vdebit, bool_or(w.kind = 'credit') AS vcredit
                FROM saga_leg_voids w
                WHERE y.need AND w.transfer_id = y.tr AND w.account_id = y.acc) v ON true
            ORDER BY y.n) x;
  q_vdebit0 := q_vdebit;
  q_vcredit0 := q_vcredit;
  q_pend := array_fill(NULL::boolean, ARRAY[v_n]);

  FOR i IN 1 .. v_n LOOP
    k := l_acc[i];
    q := l_pair[i];
    o_status := NULL;
    o_reason := NULL;
    o_currency := '';
    CASE p_op[i]
    WHEN 'debit', 'credit' THEN
      v_debit := p_op[i] = 'debit';
      o_currency := coalesce(a_cur[k], '');
      IF (v_debit AND q_vdebit[q]) OR (NOT v_debit AND q_vcredit[q]) THEN
        o_status := 'voided';
      ELSIF (v_debit AND q_debit[q] IS NOT NULL) OR (NOT v_debit AND q_credit[q]) THEN
        o_status := 'already_posted';
      ELSIF k IS NULL THEN
        o_status := 'refused'; o_reason := 'unknown_account';
      ELSIF a_locked[k] THEN
        o_status := 'refused'; o_reason := 'account_locked';
      ELSIF p_currency[i] <> '' AND a_cur[k] <> '' AND a_cur[k] <> p_currency[i] THEN
        o_status := 'refused'; o_reason := 'currency_mismatch';
      -- numeric: no bigint overflow while checking; an underflow is insufficient.
      ELSIF v_debit AND a_bal[k]::numeric - p_amount[i] < a_min[k] THEN
        o_status := 'refused'; o_reason := 'insufficient_funds';
      -- A debit reserves its amount for its reversal; a credit may not eat
      -- into what is reserved, so every reversal fits.
      ELSIF v_debit AND a_res[k]::numeric + p_amount[i] > c_max THEN
        o_status := 'refused'; o_reason := 'overflow';
      ELSIF NOT v_debit AND a_bal[k]::numeric + a_res[k] + p_amount[i] > c_max THEN
        o_status := 'refused'; o_reason := 'overflow';
      ELSE
        w_n := w_n + 1;
        w_tr[w_n] := p_transfer[i];
        w_acc[w_n] := p_account[i];
        w_kind[w_n] := p_op[i];
        w_amount[w_n] := p_amount[i];
        a_post[k] := true;
        IF v_debit THEN
          a_bal[k] := a_bal[k] - p_amount[i];
          a_res[k] := a_res[k] + p_amount[i];
          q_debit[q] := p_amount[i];
          q_held[q] := coalesce(q_held[q], 0) + p_amount[i];
        ELSE
          a_bal[k] := a_bal[k] + p_amount[i];
          q_credit[q] := true;
          q_held[q] := coalesce(q_held[q], 0);
        END IF;
        q_pend[q] := true;
        v_pend_added := true;
        o_status := 'posted';
      END IF;
    WHEN 'cancel_debit' THEN
      o_currency := coalesce(a_cur[k], '');
      v_amount := q_debit[q];
      IF v_amount IS NULL THEN
        q_vdebit[q] := true;
        v_voided := true;
        o_status := 'voided';
      ELSE
        -- Reverse exactly what was posted, once.
        IF NOT q_rev[q] THEN
          IF k IS NULL THEN
            RAISE EXCEPTION 'transfer % has a debit on account %, which does not exist',
              p_transfer[i], p_account[i];
          END IF;
          -- The debit's reservation keeps room for this; it can only be
          -- missing if the entry was released first (the engine never does).
          IF a_bal[k]::numeric + v_amount > c_max THEN
            RAISE EXCEPTION 'reversing the debit of transfer % would overflow account %',
              p_transfer[i], p_account[i];
          END IF;
          w_n := w_n + 1;
          w_tr[w_n] := p_transfer[i];
          w_acc[w_n] := p_account[i];
          w_kind[w_n] := 'reverse_debit';
          w_amount[w_n] := v_amount;
          a_post[k] := true;
          a_bal[k] := a_bal[k] + v_amount;
          a_res[k] := a_res[k] - coalesce(q_held[q], 0);
          q_held[q] := NULL;
          q_rev[q] := true;
          q_pend[q] := false;
          v_pend_dropped := true;
        END IF;
        o_status := 'reversed';
      END IF;
    WHEN 'cancel_credit' THEN
      IF q_credit[q] THEN
        o_status := 'credit_posted';
      ELSE
        q_vcredit[q] := true;
        v_voided := true;
        o_status := 'voided';
      END IF;
    WHEN 'release' THEN
      IF k IS NOT NULL THEN
        a_res[k] := a_res[k] - coalesce(q_held[q], 0);
      END IF;
      q_held[q] := NULL;
      q_pend[q] := false;
      v_pend_dropped := true;
      o_status := 'released';
    ELSE
      RAISE EXCEPTION 'unknown leg operation %', p_op[i];
    END CASE;
    RETURN NEXT;
  END LOOP;

  IF w_n > 0 THEN
    v_batch := saga_batch_id();
    INSERT INTO saga_postings (transfer_id, account_id, kind, amount, at_ms, batch)
      SELECT w.tr, w.acc, w.kind, w.amount, v_now, v_batch
        FROM unnest(w_tr, w_acc, w_kind, w_amount) WITH ORDINALITY AS w(tr, acc, kind, amount, n)
        ORDER BY w.n;
  END IF;
  -- An account posted on (its balance may end where it began) is written
  -- too: this batch becomes its last (migrations/0009_batch_links.sql).
  IF w_n > 0 OR v_pend_dropped THEN
    WITH moved AS (
      UPDATE saga_accounts a SET balance = s.bal, reserved = s.res,
          prev_batch = CASE WHEN s.post AND a.last_batch IS DISTINCT FROM v_batch THEN a.last_batch
            ELSE a.prev_batch END,
          last_batch = CASE WHEN s.post THEN v_batch ELSE a.last_batch END
        FROM unnest(a_id, a_bal, a_bal0, a_res, a_res0, a_post) AS s(id, bal, bal0, res, res0, post)
        WHERE a.id = s.id AND (s.bal <> s.bal0 OR s.res <> s.res0 OR s.post)
        RETURNING a.id, a.prev_batch, s.post)
    INSERT INTO saga_batch_links (batch, accounts, prevs)
      SELECT v_batch, array_agg(m.id), array_agg(m.prev_batch) FROM moved m WHERE m.post
        HAVING count(*) > 0;
  END IF;
  IF v_pend_added AND (NOT v_scoped OR true = ANY (q_real)) THEN
    INSERT INTO saga_pending (account_id, transfer_id, reserved)
      SELECT x.acc, x.tr, x.held
        FROM unnest(q_tr, q_acc, q_pend, q_held, q_real) AS x(tr, acc, pend, held, is_real)
        WHERE x.pend AND (x.is_real OR NOT v_scoped)
      ON CONFLICT (account_id, transfer_id) DO UPDATE SET reserved = EXCLUDED.reserved;
  END IF;
  IF v_pend_added THEN
    IF v_scoped THEN
      INSERT INTO pg_temp.saga_scope_pending (account_id, transfer_id, reserved)
        SELECT x.acc, x.tr, x.held
          FROM unnest(q_tr, q_acc, q_pend, q_held, q_real) AS x(tr, acc, pend, held, is_real)
          WHERE x.pend AND NOT x.is_real
        ON CONFLICT (account_id, transfer_id) DO UPDATE SET reserved = EXCLUDED.reserved;
    END IF;
  END IF;
  IF v_pend_dropped THEN
    FOR q IN 1 .. v_n LOOP
      v_real_dropped := v_real_dropped OR coalesce(NOT q_pend[q] AND q_real[q], false);
    END LOOP;
    -- One primary-key probe per entry (a scalar subquery is never turned
    -- into a join), whatever the statistics say: written as a join, an
    -- ANALYZE that saw the table nearly empty made it a walk of the whole,
    -- dead-tuple laden index for every batch, 10-30x slower (bench/REPORT.md).
    IF v_real_dropped THEN
      DELETE FROM saga_pending e
        WHERE e.ctid = ANY (ARRAY(
          SELECT (SELECT s.ctid FROM saga_pending s
                    WHERE s.account_id = x.acc AND s.transfer_id = x.tr)
            FROM unnest(q_tr, q_acc, q_pend, q_real) AS x(tr, acc, pend, is_real)
            WHERE NOT x.pend AND x.is_real));
    END IF;
    IF v_scoped THEN
      DELETE FROM pg_temp.saga_scope_pending e
        USING unnest(q_tr, q_acc, q_pend, q_real) AS x(tr, acc, pend, is_real)
        WHERE NOT x.pend AND e.account_id = x.acc AND e.transfer_id = x.tr;
    END IF;
  END IF;
  IF v_voided THEN
    INSERT INTO saga_leg_voids (transfer_id, account_id, kind, at_ms)
      SELECT x.tr, x.acc, 'debit', v_now
          FROM unnest(q_tr, q_acc, q_vdebit, q_vdebit0) AS x(tr, acc, v, v0)
          WHERE x.v AND NOT x.v0
        UNION ALL
        SELECT x.tr, x.acc, 'credit', v_now
          FROM unnest(q_tr, q_acc, q_vcredit, q_vcredit0) AS x(tr, acc, v, v0)
          WHERE x.v AND NOT x.v0
      ON CONFLICT DO NOTHING;
  END IF;
END $$;

-- saga_settle's writes of one walk, or one store's share of a walk across
-- stores (Store::write_walk): its postings, in walk order, and its voids.
CREATE OR REPLACE FUNCTION saga_write_walk(p_now bigint, p_tr text[], p_acc text[], p_kind text[],
    p_amount bigint[], p_void_tr text[], p_void_acc text[], p_void_kind text[])
  RETURNS void LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
  v_batch bigint;
BEGIN
  IF cardinality(p_tr) > 0 THEN
    v_batch := saga_batch_id();
    INSERT INTO saga_postings (transfer_id, account_id, kind, amount, at_ms, batch)
      SELECT w.tr, w.acc, w.kind, w.amount, p_now, v_batch
        FROM unnest(p_tr, p_acc, p_kind, p_amount) WITH ORDINALITY AS w(tr, acc, kind, amount, n)
        ORDER BY w.n;
  END IF;
  IF cardinality(p_void_tr) > 0 THEN
    INSERT INTO saga_leg_voids (transfer_id, account_id, kind, at_ms)
      SELECT x.tr, x.acc, x.kind, p_now FROM unnest(p_void_tr, p_void_acc, p_void_kind) AS x(tr, acc, kind);
  END IF;
END $$;

-- The moves of a walk across stores (Store::write_walk), sent with the
-- scope's PREPARE or COMMIT: saga_settle_move's lock pass over every
-- account the walk read, in id order (so two batches lock one server's rows
-- in one order). A move that no longer stands raises SGW01: every store's
-- transaction rolls back and the batch runs again, its accounts then read
-- locked.
CREATE OR REPLACE FUNCTION saga_walk_move(p_id text[], p_bal0 bigint[], p_bal bigint[],
    p_res0 bigint[], p_min bigint[], p_cur text[], p_locked boolean[], p_low bigint[],
    p_res bigint[], p_sum bigint[], p_refused boolean[])
  RETURNS void LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
  v_prev text;
  v_id text;
  v_sorted boolean := true;
BEGIN
  IF coalesce(cardinality(p_id), 0) = 0 THEN
    RETURN;
  END IF;
  -- The store sends the moves in byte order of their ids, which is this
  -- server's order where ids collate as "C": then they go to the lock pass
  -- as they are. The check costs about 2 ms for 5,000 ids; sorting them
  -- here made the call a third longer (bench/REPORT.md, "The forty-fourth
  -- session").
  FOREACH v_id IN ARRAY p_id LOOP
    IF v_id <= v_prev THEN
      v_sorted := false;
      EXIT;
    END IF;
    v_prev := v_id;
  END LOOP;
  IF NOT v_sorted THEN
    -- Another collation, or an older worker's moves: one sort, not one per
    -- array (as in saga_apply_legs). Ordered by id in the subquery, which
    -- the server never flattens (it has ORDER BY) and cannot scan in
    -- parallel (it reads only a function), so the aggregates read its rows
    -- in that order. Eleven sorts made this the costliest call of a walk
    -- across stores (bench/REPORT.md, "The forty-first session").
    SELECT array_agg(u.id), array_agg(u.bal0), array_agg(u.bal), array_agg(u.res0), array_agg(u.min),
        array_agg(u.cur), array_agg(u.locked), array_agg(u.low), array_agg(u.res), array_agg(u.sum),
        array_agg(u.refused)
      INTO p_id, p_bal0, p_bal, p_res0, p_min, p_cur, p_locked, p_low, p_res, p_sum, p_refused
      FROM (SELECT * FROM unnest(p_id, p_bal0, p_bal, p_res0, p_min, p_cur, p_locked, p_low, p_res,
                p_sum, p_refused) AS u(id, bal0, bal, res0, min, cur, locked, low, res, sum, refused)
              ORDER BY u.id) u;
  END IF;
  IF saga_settle_move(p_id, p_bal, p_bal0, p_res0, p_min, p_cur, p_locked, p_low, p_res,
                      p_sum::numeric[], array_replace(p_refused, false, NULL)) <> cardinality(p_id) THEN
    RAISE EXCEPTION 'a walk across stores no longer stands on its accounts as locked; the batch runs again'
      USING ERRCODE = 'SGW01';
  END IF;
END $$;

-- Whether the batch across stores named p_gid committed (Store::decide), as
-- its row in saga_decisions says: the first store's transaction inserts it
-- as committed (record_decision), and its COMMIT decides. With no row, one
-- is inserted as aborted, so that transaction can never commit. The insert
-- waits for a transaction that inserted the row and has not ended yet
-- (lock_timeout bounds the wait); then the row is read by a new statement,
-- which sees what that transaction committed. A row deleted in between
-- (forget_decisions) is decided again.
CREATE OR REPLACE FUNCTION saga_decide(p_gid text) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  v_committed boolean;
BEGIN
  LOOP
    INSERT INTO saga_decisions (gid, committed, at_ms) VALUES (p_gid, false, saga_now_ms())
      ON CONFLICT (gid) DO NOTHING;
    IF FOUND THEN
      RETURN false;
    END IF;
    SELECT d.committed INTO v_committed FROM saga_decisions d WHERE d.gid = p_gid;
    IF FOUND THEN
      RETURN v_committed;
    END IF;
  END LOOP;
END $$;

-- Whole sagas of transfers inserted in this transaction (Store::settle_sagas),
-- one row per transfer, in input order: ('done' | 'canceled', the refused
-- leg's reason, the source account's currency when its debit posted). Each
-- transfer runs to its end before the next begins, with the checks of
-- saga_apply_legs' debit and credit, so a batch gives the one-by-one result
-- without waves. Against the stage-by-stage legs it saves what a saga that
-- ends inside the call never needs: the journal and void lookups (such a
-- transfer has none; a posting or void already there is a unique violation,
-- raised), pending entries (each is added and dropped in here) and a second
-- write of each account (one UPDATE per changed account for the batch).
-- Generic plans from the first call: the custom plans a session makes for
-- its first five took twice as long (the slots' join alone 20 times).
--
-- Walked first, locked last: the walk reads the accounts unlocked and
-- writes its postings and voids; then one UPDATE locks the accounts (id
-- order) and moves each balance by the walk's change where the row as
-- locked gives every verdict the walk drew from it: its flags and currency
-- unchanged; every check the walk passed still passed with the balance and
-- reservation moved by what changed meanwhile (the bounds b_* keep, per
-- account, what those checks compared); and no leg refused for the balance
-- of an account that changed. If a row does not, the block's writes and
-- locks are undone (a subtransaction, one per call) and the walk runs again
-- on the locked rows, as it always does when an account has no row (its
-- bucket must be held before a verdict of "unknown account"). Batches that
-- share an account (a hot one, or any two of thousands of transfers each)
-- wait on each other only from the lock to their commit, no longer through
-- the walk and the journal's writes (bench/REPORT.md, "The twentieth session").
-- With p_defer, a walk that refused no leg for a balance leaves its lock
-- pass to saga_settle_apply, which the store sends with COMMIT: the
-- transfers' rows are then written outside the lock window too. Should the
-- walk no longer stand by then, the whole batch runs again. (A refusal for
-- a balance fails the check whenever that balance moved, so such a walk
-- takes its locks here, where a failed check costs only a second walk.)
CREATE OR REPLACE FUNCTION saga_settle_batch(p_transfer text[], p_source text[], p_destination text[],
    p_amount bigint[], p_currency text[], p_defer boolean)
  RETURNS TABLE (o_outcome text, o_reason text, o_currency text)
  LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
  c_max constant numeric := 9223372036854775807;
  v_now bigint := saga_now_ms();
  v_n integer := coalesce(array_length(p_transfer, 1), 0);
  v_locked boolean := false;  -- the accounts read are locked: the walk is final
  v_slots integer;
  -- accounts, by slot (id order when read unlocked)
  a_id text[];
  a_bal bigint[];
  a_bal0 bigint[];
  a_res bigint[];
  a_res0 bigint[];
  a_min bigint[];
  a_cur text[];
  a_locked boolean[];
  -- per slot, what the walk's passed checks compared (NULL: none): the lowest
  -- balance a debit left, the highest reservation a debit left, the highest
  -- balance + reservation a credit left; and a leg refused for the balance
  b_low bigint[];
  b_res bigint[];
  b_sum numeric[];
  b_refused boolean[];
  -- per transfer: its source's and destination's slots (NULL: no such
  -- account), and its result
  l_src integer[];
  l_dst integer[];
  r_outcome text[];
  r_reason text[];
  r_currency text[];
  -- new postings and voids, in order
  w_n integer;
  w_tr text[];
  w_acc text[];
  w_kind text[];
  w_amount bigint[];
  v_n_voids integer;
  v_tr text[];
  v_acc text[];
  v_kind text[];
  s integer;
  d integer;
  v_amount bigint;
  v_cur text;
  v_reason text;
  v_batch bigint;
BEGIN
  IF v_n = 0 THEN
    RETURN;
  END IF;
  -- In id order, as the index gives them (no sort).
  SELECT array_agg(a.id), array_agg(a.balance), array_agg(a.min_balance),
      array_agg(a.currency), array_agg(a.locked), array_agg(a.reserved)
    INTO a_id, a_bal, a_min, a_cur, a_locked, a_res
    FROM (SELECT * FROM saga_accounts WHERE id = ANY (p_source || p_destination) ORDER BY id) a;
  LOOP
    IF v_locked THEN
      -- The accounts locked as saga_apply_legs locks them, the missing ones'
      -- buckets included.
      SELECT array_agg(a.id), array_agg(a.balance), array_agg(a.min_balance),
          array_agg(a.currency), array_agg(a.locked), array_agg(a.reserved)
        INTO a_id, a_bal, a_min, a_cur, a_locked, a_res
        FROM saga_load_accounts_locked(p_source || p_destination) AS a;
    END IF;
    SELECT array_agg(x.ks), array_agg(x.kd) INTO l_src, l_dst
      FROM (SELECT u.n, s1.k AS ks, s2.k AS kd
              FROM unnest(p_source, p_destination) WITH ORDINALITY AS u(src, dst, n)
              LEFT JOIN unnest(a_id) WITH ORDINALITY AS s1(id, k) ON s1.id = u.src
              LEFT JOIN unnest(a_id) WITH ORDINALITY AS s2(id, k) ON s2.id = u.dst
              ORDER BY u.n) x;
    IF NOT v_locked AND (array_position(l_src, NULL) IS NOT NULL OR array_position(l_dst, NULL) IS NOT NULL) THEN
      v_locked := true;  -- an id without a row
      CONTINUE;
    END IF;
    a_bal0 := a_bal;
    a_res0 := a_res;
    v_slots := coalesce(cardinality(a_id), 0);
    b_low := array_fill(NULL::bigint, ARRAY[v_slots]);
    b_res := array_fill(NULL::bigint, ARRAY[v_slots]);
    b_sum := array_fill(NULL::numeric, ARRAY[v_slots]);
    b_refused := array_fill(NULL::boolean, ARRAY[v_slots]);
    r_outcome := array_fill('canceled'::text, ARRAY[v_n]);
    r_reason := array_fill(NULL::text, ARRAY[v_n]);
    r_currency := array_fill(''::text, ARRAY[v_n]);
    w_n := 0;
    w_tr := '{}';
    w_acc := '{}';
    w_kind := '{}';
    w_amount := '{}';
    v_n_voids := 0;
    v_tr := '{}';
    v_acc := '{}';
    v_kind := '{}';

    FOR i IN 1 .. v_n LOOP
      s := l_src[i];
      d := l_dst[i];
      v_amount := p_amount[i];
      v_reason := NULL;
      -- The debit.
      IF s IS NULL THEN
        v_reason := 'unknown_account';
      ELSIF a_locked[s] THEN
        v_reason := 'account_locked';
      ELSIF p_currency[i] <> '' AND a_cur[s] <> '' AND a_cur[s] <> p_currency[i] THEN
        v_reason := 'currency_mismatch';
      ELSIF a_bal[s]::numeric - v_amount < a_min[s] THEN
        v_reason := 'insufficient_funds';
        b_refused[s] := true;
      ELSIF a_res[s]::numeric + v_amount > c_max THEN
        v_reason := 'overflow';
        b_refused[s] := true;
      END IF;
      IF v_reason IS NOT NULL THEN
        -- Compensation voids the credit, then the debit that never posted.
        r_reason[i] := v_reason;
        v_n_voids := v_n_voids + 2;
        v_tr[v_n_voids - 1] := p_transfer[i];
        v_acc[v_n_voids - 1] := p_destination[i];
        v_kind[v_n_voids - 1] := 'credit';
        v_tr[v_n_voids] := p_transfer[i];
        v_acc[v_n_voids] := p_source[i];
        v_kind[v_n_voids] := 'debit';
        CONTINUE;
      END IF;
      r_currency[i] := a_cur[s];
      v_cur := CASE WHEN p_currency[i] <> '' THEN p_currency[i] ELSE a_cur[s] END;
      w_n := w_n + 1;
      w_tr[w_n] := p_transfer[i];
      w_acc[w_n] := p_source[i];
      w_kind[w_n] := 'debit';
      w_amount[w_n] := v_amount;
      a_bal[s] := a_bal[s] - v_amount;
      a_res[s] := a_res[s] + v_amount;  -- held for its reversal until the end of its saga
      b_low[s] := least(b_low[s], a_bal[s]);
      b_res[s] := greatest(b_res[s], a_res[s]);
      -- The credit, seeing the debit (the same account twice included).
      IF d IS NULL THEN
        v_reason := 'unknown_account';
      ELSIF a_locked[d] THEN
        v_reason := 'account_locked';
      ELSIF v_cur <> '' AND a_cur[d] <> '' AND a_cur[d] <> v_cur THEN
        v_reason := 'currency_mismatch';
      ELSIF a_bal[d]::numeric + a_res[d] + v_amount > c_max THEN
        v_reason := 'overflow';
        b_refused[d] := true;
      END IF;
      w_n := w_n + 1;
      w_tr[w_n] := p_transfer[i];
      w_amount[w_n] := v_amount;
      IF v_reason IS NULL THEN
        w_acc[w_n] := p_destination[i];
        w_kind[w_n] := 'credit';
        a_bal[d] := a_bal[d] + v_amount;
        b_sum[d] := greatest(b_sum[d], a_bal[d]::numeric + a_res[d]);
        r_outcome[i] := 'done';
      ELSE
        -- The credit voided, the debit reversed.
        r_reason[i] := v_reason;
        v_n_voids := v_n_voids + 1;
        v_tr[v_n_voids] := p_transfer[i];
        v_acc[v_n_voids] := p_destination[i];
        v_kind[v_n_voids] := 'credit';
        w_acc[w_n] := p_source[i];
        w_kind[w_n] := 'reverse_debit';
        a_bal[s] := a_bal[s] + v_amount;
      END IF;
      a_res[s] := a_res[s] - v_amount;  -- released, or given back by the reversal
    END LOOP;

    IF v_locked THEN
      PERFORM saga_write_walk(v_now, w_tr, w_acc, w_kind, w_amount, v_tr, v_acc, v_kind);
      -- Reservations end where they began: only balances change, and only
      -- where the walk posted (a debit leaves low, a credit sum), which
      -- also links this batch (migrations/0009_batch_links.sql).
      v_batch := saga_batch_id();
      WITH moved AS (
        UPDATE saga_accounts a SET balance = x.bal,
            prev_batch = CASE WHEN a.last_batch IS DISTINCT FROM v_batch THEN a.last_batch
              ELSE a.prev_batch END,
            last_batch = v_batch
          FROM unnest(a_id, a_bal, b_low, b_sum) AS x(id, bal, low, sum)
          WHERE a.id = x.id AND (x.low IS NOT NULL OR x.sum IS NOT NULL)
          RETURNING a.id, a.prev_batch)
      INSERT INTO saga_batch_links (batch, accounts, prevs)
        SELECT v_batch, array_agg(m.id), array_agg(m.prev_batch) FROM moved m HAVING count(*) > 0;
      EXIT;
    END IF;
    IF p_defer AND array_position(b_refused, true) IS NULL THEN
      PERFORM saga_write_walk(v_now, w_tr, w_acc, w_kind, w_amount, v_tr, v_acc, v_kind);
      IF to_regclass('pg_temp.saga_scope_settle') IS NULL THEN
        PERFORM saga_create_scope_settle();
      END IF;
      INSERT INTO pg_temp.saga_scope_settle
        VALUES (a_id, a_bal, a_bal0, a_res0, a_min, a_cur, a_locked, b_low, b_res, b_sum, b_refused);
      EXIT;
    END IF;
    BEGIN
      PERFORM saga_write_walk(v_now, w_tr, w_acc, w_kind, w_amount, v_tr, v_acc, v_kind);
      IF saga_settle_move(a_id, a_bal, a_bal0, a_res0, a_min, a_cur, a_locked, b_low, b_res, b_sum,
                          b_refused) <> v_slots THEN
        RAISE EXCEPTION USING ERRCODE = 'SGW01';  -- undoes the block's writes and locks
      END IF;
      EXIT;
    EXCEPTION WHEN SQLSTATE 'SGW01' THEN
      v_locked := true;  -- walked on rows that changed: again, on the rows as locked
    END;
  END LOOP;
  RETURN QUERY SELECT * FROM unnest(r_outcome, r_reason, r_currency);
END $$;

-- As builds before saga_settle_batch call it: settled at once.
CREATE OR REPLACE FUNCTION saga_settle(p_transfer text[], p_source text[], p_destination text[],
    p_amount bigint[], p_currency text[])
  RETURNS TABLE (o_outcome text, o_reason text, o_currency text)
  LANGUAGE sql VOLATILE AS $$
  SELECT * FROM saga_settle_batch(p_transfer, p_source, p_destination, p_amount, p_currency, false)
$$;

-- The lock pass of a walk on unlocked rows: locks every account, in id
-- order (the join walks a_id, which is), and moves its balance by the
-- walk's change where the row as locked gives the walk's verdicts; a row
-- that does not is left out. Returns the rows moved: fewer than the slots,
-- and the walk does not stand.
CREATE OR REPLACE FUNCTION saga_settle_move(a_id text[], a_bal bigint[], a_bal0 bigint[],
    a_res0 bigint[], a_min bigint[], a_cur text[], a_locked boolean[], b_low bigint[],
    b_res bigint[], b_sum numeric[], b_refused boolean[])
  RETURNS bigint LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
  c_max constant numeric := 9223372036854775807;
  v_batch bigint := saga_batch_id();
  v_rows bigint;
BEGIN
  -- Where the walk posted (a debit leaves low, a credit sum), this batch
  -- becomes the account's last (migrations/0009_batch_links.sql).
  WITH checked AS (
    UPDATE saga_accounts a SET balance = (a.balance::numeric + x.bal - x.bal0)::bigint,
        prev_batch = CASE WHEN (x.low IS NOT NULL OR x.sum IS NOT NULL)
          AND a.last_batch IS DISTINCT FROM v_batch THEN a.last_batch ELSE a.prev_batch END,
        last_batch = CASE WHEN x.low IS NOT NULL OR x.sum IS NOT NULL THEN v_batch ELSE a.last_batch END
      FROM unnest(a_id, a_bal, a_bal0, a_res0, a_min, a_cur, a_locked, b_low, b_res, b_sum, b_refused)
        AS x(id, bal, bal0, res0, min, cur, locked, low, res, sum, refused)
      WHERE a.id = x.id AND a.locked = x.locked AND a.currency = x.cur AND a.min_balance = x.min
        AND ((a.balance = x.bal0 AND a.reserved = x.res0)
          OR (x.refused IS NULL
            AND (x.low IS NULL OR x.low::numeric + a.balance - x.bal0 >= a.min_balance)
            AND (x.res IS NULL OR x.res::numeric + a.reserved - x.res0 <= c_max)
            AND (x.sum IS NULL OR x.sum + a.balance - x.bal0 + a.reserved - x.res0 <= c_max)))
      RETURNING a.id, a.prev_batch, x.low IS NOT NULL OR x.sum IS NOT NULL AS posted),
  linked AS (
    INSERT INTO saga_batch_links (batch, accounts, prevs)
      SELECT v_batch, array_agg(m.id), array_agg(m.prev_batch) FROM checked m WHERE m.posted
        HAVING count(*) > 0)
  SELECT count(*) INTO v_rows FROM checked;
  RETURN v_rows;
END $$;

-- A deferred walk (saga_settle_batch with p_defer), kept until its lock
-- pass: the arguments of saga_settle_move. One row at most: the store runs
-- saga_settle_apply before any later statement that could read the
-- accounts, and in the round trip of COMMIT; a row still there at COMMIT
-- (a walk whose balances never moved) fails it. Temporary: no WAL,
-- emptied at every commit or rollback; stored out of line uncompressed
-- (arrays of thousands of numbers, read once).
CREATE OR REPLACE FUNCTION saga_scope_settle_left() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF EXISTS (SELECT FROM pg_temp.saga_scope_settle) THEN
    RAISE EXCEPTION 'a deferred settle was never applied; the transaction cannot commit';
  END IF;
  RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION saga_create_scope_settle() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  CREATE TEMP TABLE saga_scope_settle (
    a_id text[] NOT NULL, a_bal bigint[], a_bal0 bigint[], a_res0 bigint[], a_min bigint[],
    a_cur text[], a_locked boolean[], b_low bigint[], b_res bigint[], b_sum numeric[],
    b_refused boolean[]
  ) ON COMMIT DELETE ROWS;
  CREATE CONSTRAINT TRIGGER saga_scope_settle_applied AFTER INSERT ON pg_temp.saga_scope_settle
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION saga_scope_settle_left();
  ALTER TABLE pg_temp.saga_scope_settle ALTER a_id SET STORAGE EXTERNAL,
    ALTER a_bal SET STORAGE EXTERNAL, ALTER a_bal0 SET STORAGE EXTERNAL,
    ALTER a_res0 SET STORAGE EXTERNAL, ALTER a_min SET STORAGE EXTERNAL,
    ALTER a_cur SET STORAGE EXTERNAL, ALTER a_locked SET STORAGE EXTERNAL,
    ALTER b_low SET STORAGE EXTERNAL, ALTER b_res SET STORAGE EXTERNAL,
    ALTER b_sum SET STORAGE EXTERNAL, ALTER b_refused SET STORAGE EXTERNAL;
END $$;

-- The lock pass of a deferred walk. A walk that no longer stands raises
-- SGW01: the batch transaction is rolled back and runs again (the store
-- then settles its next batch at once).
CREATE OR REPLACE FUNCTION saga_settle_apply() RETURNS void LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  w record;
  v_walks integer := 0;
BEGIN
  IF to_regclass('pg_temp.saga_scope_settle') IS NULL THEN
    RETURN;
  END IF;
  FOR w IN SELECT * FROM pg_temp.saga_scope_settle LOOP
    v_walks := v_walks + 1;
    IF v_walks > 1 THEN  -- two lock passes would not lock in one order
      RAISE EXCEPTION 'saga_settle_apply: more than one deferred walk in a transaction';
    END IF;
    IF saga_settle_move(w.a_id, w.a_bal, w.a_bal0, w.a_res0, w.a_min, w.a_cur, w.a_locked,
                        w.b_low, w.b_res, w.b_sum, w.b_refused) <> cardinality(w.a_id) THEN
      RAISE EXCEPTION 'a deferred settle no longer stands on its accounts as locked; the batch runs again'
        USING ERRCODE = 'SGW01';
    END IF;
  END LOOP;
  DELETE FROM pg_temp.saga_scope_settle;
END $$;

-- All or nothing: returns the first id that exists already or is named
-- twice (nothing inserted), NULL once every account is inserted.
CREATE OR REPLACE FUNCTION saga_create_accounts(p_id text[], p_balance bigint[],
    p_min_balance bigint[], p_currency text[], p_locked boolean[])
  RETURNS text LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  v_clash text;
BEGIN
  -- A leg that found one of these ids missing finishes first (its void
  -- commits before the account exists), and none starts meanwhile.
  PERFORM saga_lock_account_ids(p_id);
  SELECT u.id INTO v_clash FROM unnest(p_id) WITH ORDINALITY AS u(id, n)
    WHERE EXISTS (SELECT 1 FROM saga_accounts a WHERE a.id = u.id)
    ORDER BY u.n LIMIT 1;
  IF v_clash IS NOT NULL THEN
    RETURN v_clash;
  END IF;
  SELECT u.id INTO v_clash FROM unnest(p_id) WITH ORDINALITY AS u(id, n)
    GROUP BY u.id HAVING count(*) > 1 ORDER BY min(u.n) LIMIT 1;
  IF v_clash IS NOT NULL THEN
    RETURN v_clash;
  END IF;
  INSERT INTO saga_accounts (id, balance, opening_balance, min_balance, currency, locked)
    SELECT u.id, u.balance, u.balance, u.min_balance, u.currency, u.locked
      FROM unnest(p_id, p_balance, p_min_balance, p_currency, p_locked)
        AS u(id, balance, min_balance, currency, locked);
  RETURN NULL;
END $$;
