#include "pg_schema.hpp"

#include <array>

namespace sagapool::pg {

// The meta table exists before any version does; exactly one row.
const std::string_view kCreateMeta = R"sql(
CREATE TABLE IF NOT EXISTS saga_meta (
  singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
  schema_version integer NOT NULL,
  ledger_id text,
  shard_index integer,
  shard_count integer
))sql";

namespace {

// Version 1. Times are bigint milliseconds since the Unix epoch on the
// server's clock; clock_timestamp() (not now()) so that time advances within
// a transaction. NULL reason = none, NULL finished_at = not finished.
constexpr std::string_view kV1 = R"sql(
CREATE OR REPLACE FUNCTION saga_now_ms() RETURNS bigint LANGUAGE sql VOLATILE AS
$$ SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint $$;

CREATE TABLE saga_transfers (
  id text PRIMARY KEY,
  source text NOT NULL,
  destination text NOT NULL,
  amount bigint NOT NULL CHECK (amount > 0),
  currency text NOT NULL,
  metadata text NOT NULL,
  payload_hash bigint NOT NULL,
  state text NOT NULL
    CHECK (state IN ('initial', 'pending', 'applied', 'canceling', 'done', 'canceled')),
  owner text NOT NULL,
  epoch bigint NOT NULL,
  lease_until_ms bigint NOT NULL,
  reason text CHECK (reason IN ('invalid', 'conflict', 'unknown_account', 'account_locked',
    'insufficient_funds', 'currency_mismatch', 'canceled_by_operator', 'overflow')),
  created_at_ms bigint NOT NULL,
  last_modified_ms bigint NOT NULL,
  requested_at_ms bigint NOT NULL,
  finished_at_ms bigint,
  attempts integer NOT NULL,
  notified boolean NOT NULL,
  origin_topic text NOT NULL,
  origin_partition integer NOT NULL,
  origin_offset bigint NOT NULL
);
-- The recovery pass: unfinished or unpublished work by lease expiry.
CREATE INDEX saga_transfers_recovery ON saga_transfers (lease_until_ms)
  WHERE state IN ('initial', 'pending', 'applied', 'canceling') OR NOT notified;
-- `sagactl stuck`: unfinished work by age.
CREATE INDEX saga_transfers_stale ON saga_transfers (last_modified_ms)
  WHERE state IN ('initial', 'pending', 'applied', 'canceling');
-- Per-state gauges of unfinished work, answered from this (small) index alone.
CREATE INDEX saga_transfers_state ON saga_transfers (state, created_at_ms, lease_until_ms)
  WHERE state IN ('initial', 'pending', 'applied', 'canceling');

CREATE TABLE saga_accounts (
  id text PRIMARY KEY,
  balance bigint NOT NULL,
  opening_balance bigint NOT NULL,
  min_balance bigint NOT NULL,
  currency text NOT NULL,
  locked boolean NOT NULL
);

-- The double-entry journal; never deleted. seq orders it.
CREATE TABLE saga_postings (
  seq bigint GENERATED ALWAYS AS IDENTITY,
  transfer_id text NOT NULL,
  account_id text NOT NULL REFERENCES saga_accounts (id),
  kind text NOT NULL CHECK (kind IN ('debit', 'credit', 'reverse_debit')),
  amount bigint NOT NULL CHECK (amount > 0),
  at_ms bigint NOT NULL,
  PRIMARY KEY (transfer_id, account_id, kind)
);
CREATE INDEX saga_postings_account ON saga_postings (account_id, seq);

-- The seeds' pendingTransactions, one row per entry.
CREATE TABLE saga_pending (
  account_id text NOT NULL REFERENCES saga_accounts (id),
  transfer_id text NOT NULL,
  PRIMARY KEY (account_id, transfer_id)
);

-- A void fences a leg against zombies: once present, that leg never posts.
-- No foreign key: a leg on an unknown account is voided too.
CREATE TABLE saga_leg_voids (
  transfer_id text NOT NULL,
  account_id text NOT NULL,
  kind text NOT NULL CHECK (kind IN ('debit', 'credit')),
  at_ms bigint NOT NULL,
  PRIMARY KEY (transfer_id, account_id, kind)
);

-- Results: 0 inserted, 1 duplicate, 2 conflict, one row per input, in order.
CREATE FUNCTION saga_insert_transfers(
    p_id text[], p_source text[], p_destination text[], p_amount bigint[], p_currency text[],
    p_metadata text[], p_hash bigint[], p_requested_at bigint[], p_topic text[],
    p_partition integer[], p_offset bigint[], p_owner text, p_lease_ms bigint)
  RETURNS SETOF smallint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  v_now bigint := saga_now_ms();
  r record;
BEGIN
  FOR i IN 1 .. coalesce(array_length(p_id, 1), 0) LOOP
    INSERT INTO saga_transfers (id, source, destination, amount, currency, metadata,
        payload_hash, state, owner, epoch, lease_until_ms, reason, created_at_ms,
        last_modified_ms, requested_at_ms, finished_at_ms, attempts, notified, origin_topic,
        origin_partition, origin_offset)
      VALUES (p_id[i], p_source[i], p_destination[i], p_amount[i], p_currency[i],
        p_metadata[i], p_hash[i], 'initial', p_owner, 1, v_now + p_lease_ms, NULL, v_now,
        v_now, p_requested_at[i], NULL, 0, false, p_topic[i], p_partition[i], p_offset[i])
      ON CONFLICT (id) DO NOTHING;
    IF FOUND THEN
      RETURN NEXT 0::smallint;
      CONTINUE;
    END IF;
    SELECT t.payload_hash, t.source, t.destination, t.amount, t.currency, t.metadata INTO r
      FROM saga_transfers t WHERE t.id = p_id[i];
    IF NOT FOUND THEN
      RAISE EXCEPTION 'transfer % vanished during insert', p_id[i];
    END IF;
    IF r.payload_hash = p_hash[i] AND r.source = p_source[i]
        AND r.destination = p_destination[i] AND r.amount = p_amount[i]
        AND r.currency = p_currency[i] AND r.metadata = p_metadata[i] THEN
      RETURN NEXT 1::smallint;
    ELSE
      RETURN NEXT 2::smallint;
    END IF;
  END LOOP;
END $$;

-- One boolean per input, in order: applied only in `from`, owned by
-- (owner, epoch).
CREATE FUNCTION saga_transition(p_id text[], p_from text[], p_to text[], p_reason text[],
    p_owner text[], p_epoch bigint[], p_lease_ms bigint)
  RETURNS SETOF boolean LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  v_now bigint := saga_now_ms();
  v_terminal boolean;
BEGIN
  FOR i IN 1 .. coalesce(array_length(p_id, 1), 0) LOOP
    v_terminal := p_to[i] IN ('done', 'canceled');
    UPDATE saga_transfers t
      SET state = p_to[i], reason = NULLIF(p_reason[i], 'none'), last_modified_ms = v_now,
          lease_until_ms = v_now + p_lease_ms,
          finished_at_ms = CASE WHEN v_terminal THEN v_now ELSE t.finished_at_ms END,
          notified = CASE WHEN v_terminal THEN false ELSE t.notified END
      WHERE t.id = p_id[i] AND t.state = p_from[i] AND t.owner = p_owner[i]
        AND t.epoch = p_epoch[i];
    RETURN NEXT FOUND;
  END LOOP;
END $$;

-- SKIP LOCKED: concurrent claimers split the expired rows between them and
-- never claim the same one; a row changed since the snapshot is re-checked
-- before it is locked.
CREATE FUNCTION saga_claim_expired(p_owner text, p_lease_ms bigint, p_limit bigint)
  RETURNS SETOF saga_transfers LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  v_now bigint := saga_now_ms();
BEGIN
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

-- One row per leg, in input order: (status, reason, account currency).
-- Applies the legs one by one inside the caller's single transaction, so a
-- batch with several legs on one account gives the result of applying them
-- one at a time.
CREATE FUNCTION saga_apply_legs(p_op text[], p_transfer text[], p_account text[],
    p_amount bigint[], p_currency text[])
  RETURNS TABLE (o_status text, o_reason text, o_currency text)
  LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  v_now bigint := saga_now_ms();
  a saga_accounts%ROWTYPE;
  v_amount bigint;
BEGIN
  -- Lock the batch's accounts in one order: batches sharing accounts queue
  -- instead of deadlocking, and every check below sees the rows committed
  -- before the lock was granted.
  PERFORM 1 FROM saga_accounts WHERE id = ANY (p_account) ORDER BY id FOR UPDATE;
  FOR i IN 1 .. coalesce(array_length(p_op, 1), 0) LOOP
    o_status := NULL;
    o_reason := NULL;
    o_currency := '';
    SELECT * INTO a FROM saga_accounts WHERE id = p_account[i];  -- all NULL when missing
    CASE p_op[i]
    WHEN 'debit', 'credit' THEN
      o_currency := coalesce(a.currency, '');
      IF EXISTS (SELECT 1 FROM saga_leg_voids v WHERE v.transfer_id = p_transfer[i]
                   AND v.account_id = p_account[i] AND v.kind = p_op[i]) THEN
        o_status := 'voided';
      ELSIF EXISTS (SELECT 1 FROM saga_postings p WHERE p.transfer_id = p_transfer[i]
                      AND p.account_id = p_account[i] AND p.kind = p_op[i]) THEN
        o_status := 'already_posted';
      ELSIF a.id IS NULL THEN
        o_status := 'refused'; o_reason := 'unknown_account';
      ELSIF a.locked THEN
        o_status := 'refused'; o_reason := 'account_locked';
      ELSIF p_currency[i] <> '' AND a.currency <> '' AND a.currency <> p_currency[i] THEN
        o_status := 'refused'; o_reason := 'currency_mismatch';
      -- numeric: no bigint overflow while checking; an underflow is insufficient.
      ELSIF p_op[i] = 'debit' AND a.balance::numeric - p_amount[i] < a.min_balance THEN
        o_status := 'refused'; o_reason := 'insufficient_funds';
      ELSIF p_op[i] = 'credit' AND a.balance::numeric + p_amount[i] > 9223372036854775807 THEN
        o_status := 'refused'; o_reason := 'overflow';
      ELSE
        INSERT INTO saga_postings (transfer_id, account_id, kind, amount, at_ms)
          VALUES (p_transfer[i], p_account[i], p_op[i], p_amount[i], v_now)
          ON CONFLICT DO NOTHING;
        IF FOUND THEN
          UPDATE saga_accounts
            SET balance = CASE WHEN p_op[i] = 'debit' THEN balance - p_amount[i]
                               ELSE balance + p_amount[i] END
            WHERE id = p_account[i];
          INSERT INTO saga_pending (account_id, transfer_id)
            VALUES (p_account[i], p_transfer[i]) ON CONFLICT DO NOTHING;
          o_status := 'posted';
        ELSE
          o_status := 'already_posted';
        END IF;
      END IF;
    WHEN 'cancel_debit' THEN
      o_currency := coalesce(a.currency, '');
      SELECT p.amount INTO v_amount FROM saga_postings p WHERE p.transfer_id = p_transfer[i]
        AND p.account_id = p_account[i] AND p.kind = 'debit';
      IF NOT FOUND THEN
        INSERT INTO saga_leg_voids (transfer_id, account_id, kind, at_ms)
          VALUES (p_transfer[i], p_account[i], 'debit', v_now) ON CONFLICT DO NOTHING;
        o_status := 'voided';
      ELSE
        -- Reverse exactly what was posted, once.
        INSERT INTO saga_postings (transfer_id, account_id, kind, amount, at_ms)
          VALUES (p_transfer[i], p_account[i], 'reverse_debit', v_amount, v_now)
          ON CONFLICT DO NOTHING;
        IF FOUND THEN
          IF a.balance::numeric + v_amount > 9223372036854775807 THEN
            RAISE EXCEPTION 'reversing the debit of transfer % would overflow account %',
              p_transfer[i], p_account[i];
          END IF;
          UPDATE saga_accounts SET balance = balance + v_amount WHERE id = p_account[i];
          DELETE FROM saga_pending WHERE account_id = p_account[i]
            AND transfer_id = p_transfer[i];
        END IF;
        o_status := 'reversed';
      END IF;
    WHEN 'cancel_credit' THEN
      IF EXISTS (SELECT 1 FROM saga_postings p WHERE p.transfer_id = p_transfer[i]
                   AND p.account_id = p_account[i] AND p.kind = 'credit') THEN
        o_status := 'credit_posted';
      ELSE
        INSERT INTO saga_leg_voids (transfer_id, account_id, kind, at_ms)
          VALUES (p_transfer[i], p_account[i], 'credit', v_now) ON CONFLICT DO NOTHING;
        o_status := 'voided';
      END IF;
    WHEN 'release' THEN
      DELETE FROM saga_pending WHERE account_id = p_account[i] AND transfer_id = p_transfer[i];
      o_status := 'released';
    ELSE
      RAISE EXCEPTION 'unknown leg operation %', p_op[i];
    END CASE;
    RETURN NEXT;
  END LOOP;
END $$;

-- All or nothing: returns the first id that exists already or is named
-- twice (nothing inserted), NULL once every account is inserted.
CREATE FUNCTION saga_create_accounts(p_id text[], p_balance bigint[], p_min_balance bigint[],
    p_currency text[], p_locked boolean[])
  RETURNS text LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  v_clash text;
BEGIN
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
)sql";

constexpr std::array<std::string_view, 1> kMigrations = {kV1};

#define SAGA_TRANSFER_COLUMNS                                                                \
  "id, source, destination, amount, currency, metadata, payload_hash, state, owner, epoch, " \
  "lease_until_ms, reason, created_at_ms, last_modified_ms, requested_at_ms, "               \
  "finished_at_ms, attempts, notified, origin_topic, origin_partition, origin_offset"
#define SAGA_UNFINISHED "('initial', 'pending', 'applied', 'canceling')"
#define SAGA_ACCOUNT_COLUMNS "id, balance, opening_balance, min_balance, currency, locked"
#define SAGA_POSTING_COLUMNS "transfer_id, account_id, kind, amount, at_ms"

// Indexed by Sql.
constexpr std::array<Statement, kSqlCount> kStatements = {{
    {"saga_now", "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint"},
    {"saga_read_meta", "SELECT schema_version, ledger_id, shard_index, shard_count FROM saga_meta"},
    {"saga_write_topology",
     "UPDATE saga_meta SET ledger_id = $1, shard_index = $2, shard_count = $3"},
    {"saga_insert_transfers",
     "SELECT r FROM saga_insert_transfers($1::text[], $2::text[], $3::text[], $4::bigint[], "
     "$5::text[], $6::text[], $7::bigint[], $8::bigint[], $9::text[], $10::integer[], "
     "$11::bigint[], $12, $13) AS r"},
    {"saga_transition",
     "SELECT r FROM saga_transition($1::text[], $2::text[], $3::text[], $4::text[], "
     "$5::text[], $6::bigint[], $7) AS r"},
    {"saga_claim_expired", "SELECT " SAGA_TRANSFER_COLUMNS " FROM saga_claim_expired($1, $2, $3)"},
    {"saga_take_over",
     "UPDATE saga_transfers SET owner = $2, epoch = epoch + 1, attempts = attempts + 1, "
     "lease_until_ms = (SELECT saga_now_ms()) + $3 WHERE id = $1 "
     "RETURNING " SAGA_TRANSFER_COLUMNS},
    {"saga_mark_notified",
     "UPDATE saga_transfers SET notified = true WHERE id = ANY ($1::text[]) "
     "AND NOT notified AND state IN ('done', 'canceled')"},
    {"saga_load_transfer", "SELECT " SAGA_TRANSFER_COLUMNS " FROM saga_transfers WHERE id = $1"},
    {"saga_list_stale",
     "SELECT " SAGA_TRANSFER_COLUMNS " FROM saga_transfers WHERE state IN " SAGA_UNFINISHED
     " AND last_modified_ms < $1 ORDER BY last_modified_ms, id LIMIT $2"},
    {"saga_state_stats",
     "SELECT state, count(*), coalesce(min(created_at_ms), 0), count(*) FILTER (WHERE "
     "lease_until_ms < (SELECT saga_now_ms())) FROM saga_transfers WHERE state IN " SAGA_UNFINISHED
     " GROUP BY state"},
    {"saga_scan_transfer_states", "SELECT id, state, notified FROM saga_transfers"},
    {"saga_apply_legs",
     "SELECT o_status, o_reason, o_currency FROM saga_apply_legs($1::text[], $2::text[], "
     "$3::text[], $4::bigint[], $5::text[])"},
    {"saga_create_accounts",
     "SELECT saga_create_accounts($1::text[], $2::bigint[], $3::bigint[], $4::text[], "
     "$5::boolean[])"},
    {"saga_load_account", "SELECT " SAGA_ACCOUNT_COLUMNS " FROM saga_accounts WHERE id = $1"},
    {"saga_load_accounts",
     "SELECT " SAGA_ACCOUNT_COLUMNS " FROM saga_accounts WHERE id = ANY ($1::text[])"},
    {"saga_set_locked", "UPDATE saga_accounts SET locked = $2 WHERE id = $1"},
    {"saga_postings_for_transfer",
     "SELECT " SAGA_POSTING_COLUMNS " FROM saga_postings WHERE transfer_id = $1 ORDER BY seq"},
    {"saga_postings_for_account",
     "SELECT " SAGA_POSTING_COLUMNS " FROM saga_postings WHERE account_id = $1 "
     "ORDER BY seq DESC LIMIT $2"},
    {"saga_pending_for_account",
     "SELECT transfer_id FROM saga_pending WHERE account_id = $1 ORDER BY transfer_id"},
    {"saga_scan_accounts", "SELECT " SAGA_ACCOUNT_COLUMNS " FROM saga_accounts"},
    {"saga_scan_postings", "SELECT " SAGA_POSTING_COLUMNS " FROM saga_postings"},
    {"saga_scan_pending", "SELECT account_id, transfer_id FROM saga_pending"},
}};

}  // namespace

std::span<const std::string_view> migrations() { return kMigrations; }

const Statement& statement(Sql s) { return kStatements[static_cast<std::size_t>(s)]; }

}  // namespace sagapool::pg
