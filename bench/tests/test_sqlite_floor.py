"""bench/sqlite_floor.py on a small ledger made from the store's own schema:
it writes every transfer's rows, conserves money, links each account's
postings as the store reads them, and says so."""
import sqlite3
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FLOOR = ROOT / "bench" / "sqlite_floor.py"
SCHEMA = ROOT / "store" / "sqlite" / "sql" / "schema.sql"
STATEMENTS = ROOT / "store" / "sqlite" / "sql" / "statements.sql"


def store_statement(name: str) -> str:
    """One statement of the store's statements.sql, as the store runs it."""
    text = STATEMENTS.read_text().split(f"-- name: {name}\n", 1)[1]
    return text.split(";", 1)[0]


def ledger(path: Path, accounts: int) -> None:
    with sqlite3.connect(path) as db:
        db.executescript(SCHEMA.read_text())
        db.executemany("INSERT INTO accounts(id, balance, opening_balance, min_balance, currency, locked) "
                       "VALUES (?, 1000000, 1000000, 0, 'USD', 0)",
                       [(f"acct-{i}",) for i in range(accounts)])


def floor(db: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-B", str(FLOOR), str(db), *flags], capture_output=True, text=True)


class SqliteFloor(unittest.TestCase):
    def test_writes_each_transfer_and_balances(self):
        for dist in ("uniform", "zipf"):
            with tempfile.TemporaryDirectory() as d:
                db = Path(d) / "ledger.db"
                ledger(db, 50)
                done = floor(db, "--accounts", "50", "--transfers", "1001", "--batch", "300", "--dist", dist)
                self.assertEqual(done.returncode, 0, done.stderr)
                tput, cpu, secs, third = done.stdout.split()
                self.assertGreater(float(tput), 0)
                self.assertGreaterEqual(float(cpu), 0)
                self.assertGreater(float(secs), 0)
                with sqlite3.connect(db) as check:
                    self.assertEqual(check.execute("SELECT count(*) FROM transfers").fetchone()[0], 1001)
                    self.assertEqual(check.execute("SELECT count(*), sum(amount) FROM postings").fetchone(), (2002, 0))
                    self.assertEqual(check.execute("SELECT sum(balance) FROM accounts").fetchone()[0], 50_000_000)
                    self.assertEqual(check.execute("PRAGMA journal_mode").fetchone()[0], "wal")
                    latest = store_statement("postings_for_account")
                    for (account,) in check.execute("SELECT id FROM accounts").fetchall():
                        chain = check.execute(latest, (account, 10_000)).fetchall()
                        every = check.execute("SELECT transfer_id, account_id, kind, amount, at FROM postings "
                                              "WHERE account_id = ?", (account,)).fetchall()
                        self.assertEqual(sorted(chain), sorted(every), account)
                        newest = max(every, key=lambda row: int(row[0].rsplit("-", 1)[1]))
                        self.assertEqual(chain[0][0], newest[0], "newest first")

    def test_version_three_rows_with_the_account_index(self):
        with tempfile.TemporaryDirectory() as d:
            db = Path(d) / "ledger.db"
            ledger(db, 20)
            done = floor(db, "--accounts", "20", "--transfers", "100", "--batch", "30", "--dist", "uniform",
                         "--account-index")
            self.assertEqual(done.returncode, 0, done.stderr)
            with sqlite3.connect(db) as check:
                self.assertEqual(check.execute("SELECT count(*) FROM postings WHERE prev_transfer = ''")
                                 .fetchone()[0], 200)
                self.assertIsNotNone(check.execute(
                    "SELECT 1 FROM sqlite_master WHERE name = 'postings_account'").fetchone())

    def test_refuses_an_empty_batch(self):
        with tempfile.TemporaryDirectory() as d:
            db = Path(d) / "ledger.db"
            ledger(db, 5)
            done = floor(db, "--accounts", "5", "--transfers", "10", "--batch", "0", "--dist", "uniform")
            self.assertEqual(done.returncode, 2)
            self.assertIn("--batch", done.stderr)


if __name__ == "__main__":
    unittest.main()
