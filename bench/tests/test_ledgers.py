"""The bench's question "what is left unfinished" reads the stores' partial
index of unfinished work, never the whole table: SQLite plans it on the
index, and the PostgreSQL spelling is the index's predicate verbatim."""
import sqlite3
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sagabench import ledgers  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SQLITE_SCHEMA = ROOT / "store" / "sqlite" / "sql" / "schema.sql"
PG_TABLES = ROOT / "store" / "postgres" / "sql" / "migrations" / "0001_tables.sql"


class UnfinishedTest(unittest.TestCase):
    def test_sqlite_counts_the_index_of_open_transfers(self):
        with tempfile.TemporaryDirectory() as tmp:
            with sqlite3.connect(Path(tmp) / "ledger.db") as db:
                db.executescript(SQLITE_SCHEMA.read_text())
                plan = db.execute(f"EXPLAIN QUERY PLAN SELECT count(*) FROM {ledgers.SqliteLedger.table} "
                                  f"WHERE {ledgers.SqliteLedger.unfinished}").fetchall()
        self.assertIn("USING INDEX transfers_open", " ".join(row[-1] for row in plan))

    def test_postgres_spells_the_recovery_index_predicate(self):
        tables = " ".join(PG_TABLES.read_text().split())
        index = tables.split("CREATE INDEX saga_transfers_recovery", 1)[1].split(";", 1)[0]
        self.assertTrue(index.endswith(f"WHERE {ledgers.PostgresLedger.unfinished}"), index)


if __name__ == "__main__":
    unittest.main()
