#!/usr/bin/env python3
"""(f) The SQLite floor: the rows a finished transfer leaves in a sagapool
SQLite store (its transfer row, its two postings, each linked to its
account's one before, and its two accounts' balances and chain heads),
and the batch's outbox row listing them (the store's since schema version
7), written by bare set-based SQL in batches on one connection, with the
workers' durability settings (WAL, synchronous=FULL). No saga, no broker,
no pending entries, no outcome: what a ledger with this schema must at least
write, so its rate bounds what sagapool can reach there.
--account-index writes the rows of schema version 3 instead: postings
unlinked, and indexed by (account, time) in postings_account, which puts
each one at a random place.

The database must be a sagapool SQLite store with accounts acct-0 ..
acct-(M-1) (`sagactl init` and `accounts import`). Requests are drawn like
the bench's: uniform over distinct accounts, or Zipf-skewed with s = 1.1.
Checks afterwards that money is conserved and every transfer row is there.
Prints one line: transfers/s, CPU seconds per 1,000 transfers (this
process, user + system), seconds, last third's rate / first third's.
Usage: bench/sqlite_floor.py DB --accounts M --transfers N --batch B
                             --dist uniform|zipf [--seed S] [--account-index]
"""
import argparse
import bisect
import itertools
import random
import sqlite3
import sys
import time

# The workers' settings (store/sqlite), and the requests' table in memory.
PRAGMAS = ("journal_mode=WAL", "synchronous=FULL", "cache_size=-32768", "mmap_size=0",
           "wal_autocheckpoint=8192", "temp_store=MEMORY")

INSERT_TRANSFERS = """
INSERT INTO transfers SELECT id, src, dst, amount, 'USD', '{}', 0, 'done', 'floor', 1, 0, 'none',
    :at, :at, :at, :at, 1, 1, 'transfers.requests', 0, n
  FROM req WHERE n BETWEEN :lo AND :hi"""
# The batch's postings in order (a debit, then its credit), in a table kept
# in memory; each links to the one before on its account, the batch's first
# to the account's head. Version 3's postings were unlinked.
FILL_LEGS = """
INSERT INTO leg SELECT 2 * n, id, src, 'debit', -amount FROM req WHERE n BETWEEN :lo AND :hi
  UNION ALL SELECT 2 * n + 1, id, dst, 'credit', amount FROM req WHERE n BETWEEN :lo AND :hi"""
INSERT_POSTINGS = """
INSERT INTO postings(transfer_id, account_id, kind, amount, at, prev_transfer, prev_kind)
  SELECT l.id, l.account, l.kind, l.amount, :at,
         coalesce(lag(l.id) OVER w, a.last_transfer), coalesce(lag(l.kind) OVER w, a.last_kind)
    FROM leg l JOIN accounts a ON a.id = l.account
    WINDOW w AS (PARTITION BY l.account ORDER BY l.seq)"""
INSERT_POSTINGS_V3 = """
INSERT INTO postings(transfer_id, account_id, kind, amount, at)
  SELECT id, account, kind, amount, :at FROM leg"""
# With one max() in a group, SQLite takes the bare columns (id, kind) from
# the row holding it: the account's latest posting, its new head.
UPDATE_ACCOUNTS = """
UPDATE accounts SET balance = balance + d.delta, last_transfer = d.id, last_kind = d.kind
  FROM (SELECT account, sum(amount) AS delta, max(seq), id, kind FROM leg GROUP BY account) AS d
  WHERE accounts.id = d.account"""
# The batch's outbox row (schema version 7): its finished transfers, which
# the saga lists until Kafka confirms their outcomes.
INSERT_OUTBOX = """
INSERT INTO outbox(lease_until, finished_at, done, canceled)
  SELECT :at, :at, json_group_array(id), '[]' FROM req WHERE n BETWEEN :lo AND :hi"""
UPDATE_BALANCES_V3 = """
UPDATE accounts SET balance = balance + d.delta
  FROM (SELECT account, sum(amount) AS delta FROM leg GROUP BY account) AS d
  WHERE accounts.id = d.account"""


def requests(dist: str, n: int, accounts: int, seed: int):
    """(n, id, source, destination, amount) rows, distinct accounts each."""
    rng = random.Random(seed)
    if dist == "zipf":
        cum = list(itertools.accumulate(1.0 / (i + 1) ** 1.1 for i in range(accounts)))
        total = cum[-1]

        def pick() -> int:
            return min(bisect.bisect_right(cum, rng.random() * total), accounts - 1)
    else:
        def pick() -> int:
            return rng.randrange(accounts)
    for i in range(n):
        a, b = pick(), pick()
        if a == b:
            b = (a + 1) % accounts
        yield i, f"f-{seed}-{i}", f"acct-{a}", f"acct-{b}", rng.randint(1, 10000)


def main() -> int:
    p = argparse.ArgumentParser(description="the SQLite floor: a finished transfer's rows, bare SQL")
    p.add_argument("db")
    p.add_argument("--accounts", type=int, required=True)
    p.add_argument("--transfers", type=int, required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--dist", choices=("uniform", "zipf"), required=True)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--account-index", action="store_true")
    a = p.parse_args()
    if min(a.accounts - 1, a.transfers, a.batch) < 1:
        p.error("--accounts must be 2 or more, --transfers and --batch 1 or more")

    db = sqlite3.connect(a.db, isolation_level=None)
    for pragma in PRAGMAS:
        db.execute("PRAGMA " + pragma)
    if a.account_index:
        db.execute("CREATE INDEX postings_account ON postings(account_id, at)")
        statements = (INSERT_TRANSFERS, FILL_LEGS, INSERT_POSTINGS_V3, UPDATE_BALANCES_V3)
    else:
        statements = (INSERT_TRANSFERS, FILL_LEGS, INSERT_POSTINGS, UPDATE_ACCOUNTS, INSERT_OUTBOX)
    money = db.execute("SELECT sum(balance) FROM accounts").fetchone()[0]
    db.execute("CREATE TEMP TABLE req (n INTEGER PRIMARY KEY, id TEXT, src TEXT, dst TEXT, amount INTEGER)")
    db.executemany("INSERT INTO req VALUES (?, ?, ?, ?, ?)", requests(a.dist, a.transfers, a.accounts, a.seed))
    db.execute("CREATE TEMP TABLE leg (seq INTEGER PRIMARY KEY, id TEXT, account TEXT, kind TEXT, amount INTEGER)")

    commits: list[tuple[float, int]] = []  # (seconds in, transfers) of each batch
    t0, cpu0 = time.monotonic(), time.process_time()
    for lo in range(0, a.transfers, a.batch):
        hi = min(lo + a.batch, a.transfers) - 1
        db.execute("BEGIN IMMEDIATE")
        db.execute("DELETE FROM leg")
        for statement in statements:
            db.execute(statement, {"lo": lo, "hi": hi, "at": int(time.time() * 1000)})
        db.execute("COMMIT")
        commits.append((time.monotonic() - t0, hi - lo + 1))
    secs, cpu = commits[-1][0], time.process_time() - cpu0

    rows = db.execute("SELECT count(*) FROM transfers WHERE owner = 'floor'").fetchone()[0]
    if db.execute("SELECT sum(balance) FROM accounts").fetchone()[0] != money or rows != a.transfers:
        print("sqlite_floor: the ledger does not balance, or transfer rows are missing", file=sys.stderr)
        return 1
    first = sum(n for at, n in commits if at <= secs / 3)
    last = sum(n for at, n in commits if at > 2 * secs / 3)
    third = f"{last / first:.2f}" if first else "-"
    print(f"{a.transfers / secs:.0f} {cpu / a.transfers * 1000:.3f} {secs:.3f} {third}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
