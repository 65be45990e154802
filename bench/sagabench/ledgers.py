"""A sagapool run's own ledger, a fresh copy of the template: a SQLite
file, or a PostgreSQL database made with CREATE DATABASE ... TEMPLATE (one
on each server for two shards). All answer the same questions about the
run's transfers; only the table and column names differ between the
stores."""
import contextlib
import shutil
import sqlite3
from pathlib import Path

from .servers import Postgres

MEASURED = "id NOT LIKE 'warm-%'"  # the warm-up transfers are left out of every figure


class SqliteLedger:
    table, requested, finished = "transfers", "requested_at", "finished_at"
    # transfers_open's predicate, verbatim, so that SQLite counts the index.
    unfinished = "((state <> 'done' AND state <> 'canceled') OR notified = 0)"
    # Finished transfers whose outcomes are not marked yet, listed in the
    # outbox instead (store/sqlite/sql/schema.sql).
    listed = "(SELECT coalesce(sum(json_array_length(done) + json_array_length(canceled)), 0) FROM outbox)"

    def __init__(self, template: Path, run: Path):
        self.path = run / "ledger.db"
        shutil.copyfile(template, self.path)
        self.store_args = ["--store", f"sqlite:{self.path}"]

    def rows(self, sql: str) -> list[tuple]:
        # A connection per question, as the workers write meanwhile.
        with contextlib.closing(sqlite3.connect(self.path, timeout=10)) as db:
            return db.execute(sql).fetchall()

    def drop(self) -> None:
        for path in self.path.parent.glob(self.path.name + "*"):
            path.unlink()


class PostgresLedger:
    table, requested, finished = "saga_transfers", "requested_at_ms", "finished_at_ms"
    # saga_transfers_recovery's predicate, verbatim (see count_unfinished).
    unfinished = "state IN ('initial', 'pending', 'applied', 'canceling') OR NOT notified"
    # As on SQLite (store/postgres/sql/migrations/0006_outbox.sql).
    listed = "(SELECT coalesce(sum(cardinality(done) + cardinality(canceled)), 0) FROM saga_outbox)"

    def __init__(self, pg: Postgres, template: str, database: str):
        self.pg, self.database = pg, database
        pg.psql("sagapool", f"CREATE DATABASE {database} TEMPLATE {template}")
        self.store_args = ["--store", pg.url(database)]

    def rows(self, sql: str, *settings: str) -> list[tuple]:
        out = self.pg.psql(self.database, *(f"SET {s}" for s in settings), sql)
        return [tuple(line.split("|")) for line in out.splitlines() if line]

    def drop(self) -> None:
        self.pg.psql("sagapool", f"DROP DATABASE {self.database}")


def shard_store_args(first: Postgres, second: Postgres, database: str) -> list[str]:
    """The --store flags of a ledger over two shards, in shard order."""
    return ["--store", first.url(database), "--store", second.url(database)]


class ShardedPostgresLedger(PostgresLedger):
    """Two shards: a database on each server. Transfer documents all live
    on the first shard (docs/postgres.md, "Sharding"), so its questions are
    asked there."""

    def __init__(self, first: Postgres, second: Postgres, template: str, database: str):
        super().__init__(first, template, database)
        self.second = second
        second.psql("sagapool", f"CREATE DATABASE {database} TEMPLATE {template}")
        self.store_args = shard_store_args(first, second, database)

    def drop(self) -> None:
        super().drop()
        self.second.psql("sagapool", f"DROP DATABASE {self.database}")


Ledger = SqliteLedger | PostgresLedger | ShardedPostgresLedger


def count(ledger: Ledger, where: str = "true") -> int:
    return int(ledger.rows(f"SELECT count(*) FROM {ledger.table} WHERE {where}")[0][0])


def count_unfinished(ledger: Ledger) -> int:
    """Transfers not terminal or not published, from the stores' partial
    index of them: what the run left to do, not the table's size. A
    PostgreSQL table the run filled is not analyzed yet, and the planner
    would read all of it (as the store's gauges once did, pg_store.cpp)."""
    sql = f"SELECT (SELECT count(*) FROM {ledger.table} WHERE {ledger.unfinished}) + {ledger.listed}"
    if isinstance(ledger, PostgresLedger):
        return int(ledger.rows(sql, "enable_seqscan = off", "enable_bitmapscan = off")[0][0])
    return int(ledger.rows(sql)[0][0])


def measured_times(ledger: Ledger) -> list[tuple[int, int, bool]]:
    """(requested ms, finished ms, done) of every measured transfer."""
    rows = ledger.rows(f"SELECT {ledger.requested}, {ledger.finished}, "
                       f"CASE WHEN state = 'done' THEN 1 ELSE 0 END FROM {ledger.table} WHERE {MEASURED}")
    return [(int(req), int(fin), int(done) == 1) for req, fin, done in rows]
