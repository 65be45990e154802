#!/usr/bin/env python3
"""(f) The SQLite floor: the rows a finished transfer leaves in a sagapool
SQLite store (its transfer row, its two postings with their index entries,
its two balances), written by bare set-based SQL in batches on one
connection, with the workers' durability settings (WAL, synchronous=FULL).
No saga, no broker, no pending entries, no outcome: what a ledger with this
schema must at least write, so its rate bounds what sagapool can reach there.
--without-account-index drops the postings' per-account index first
(postings_account, which `sagactl accounts show` reads): the same rows,
without the one structure that every posting updates at a random place.

The database must be a sagapool SQLite store with accounts acct-0 ..
acct-(M-1) (`sagactl init` and `accounts import`). Requests are drawn like
the bench's: uniform over distinct accounts, or Zipf-skewed with s = 1.1.
Checks afterwards that money is conserved and every transfer row is there.
Prints one line: transfers/s, CPU seconds per 1,000 transfers (this
process, user + system), seconds, last third's rate / first third's.
Usage: bench/sqlite_floor.py DB --accounts M --transfers N --batch B
                             --dist uniform|zipf [--seed S] [--without-account-index]
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
INSERT_POSTINGS = """
INSERT INTO postings SELECT id, src, 'debit', -amount, :at FROM req WHERE n BETWEEN :lo AND :hi
  UNION ALL SELECT id, dst, 'credit', amount, :at FROM req WHERE n BETWEEN :lo AND :hi"""
UPDATE_BALANCES = """
UPDATE accounts SET balance = balance + d.delta
  FROM (SELECT account, sum(delta) AS delta
          FROM (SELECT src AS account, -amount AS delta FROM req WHERE n BETWEEN :lo AND :hi
                UNION ALL SELECT dst, amount FROM req WHERE n BETWEEN :lo AND :hi)
         GROUP BY account) AS d
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
    p.add_argument("--without-account-index", action="store_true")
    a = p.parse_args()
    if min(a.accounts - 1, a.transfers, a.batch) < 1:
        p.error("--accounts must be 2 or more, --transfers and --batch 1 or more")

    db = sqlite3.connect(a.db, isolation_level=None)
    for pragma in PRAGMAS:
        db.execute("PRAGMA " + pragma)
    if a.without_account_index:
        db.execute("DROP INDEX postings_account")
    money = db.execute("SELECT sum(balance) FROM accounts").fetchone()[0]
    db.execute("CREATE TEMP TABLE req (n INTEGER PRIMARY KEY, id TEXT, src TEXT, dst TEXT, amount INTEGER)")
    db.executemany("INSERT INTO req VALUES (?, ?, ?, ?, ?)", requests(a.dist, a.transfers, a.accounts, a.seed))

    commits: list[tuple[float, int]] = []  # (seconds in, transfers) of each batch
    t0, cpu0 = time.monotonic(), time.process_time()
    for lo in range(0, a.transfers, a.batch):
        hi = min(lo + a.batch, a.transfers) - 1
        db.execute("BEGIN IMMEDIATE")
        for statement in (INSERT_TRANSFERS, INSERT_POSTINGS, UPDATE_BALANCES):
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
