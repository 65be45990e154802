"""The bench's phases, in order: the ledgers; (a), (b) pgbench at its best
client count; (c), (d) sagapool on PostgreSQL and SQLite on saga-broker and
on a real Kafka node; (e) scaling; (g) two PostgreSQL shards and their
floor (gf); (f) the SQLite floor; the half-load latency runs. Each
measured run adds a row to the results."""
import contextlib
import http.client
import re
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from . import ledgers, measure
from .budget import Budget
from .console import Fatal, note, say, show_tail
from .options import (ACCOUNTS, BALANCE, CALIBRATE_N, FLOOR_BATCH_MAX, PARTITIONS, PG_FLOOR_BATCH, PG_FLOOR_CLIENTS,
                      SCALE_WORKERS, SPEED_CLIENTS, STEADY_AFTER_MS, MOCK_TRANSFERS_MAX, WORKER_BATCH, Options,
                      half_load_n, run_size)
from .results import Results
from .servers import Kafka, Postgres, Prometheus, start_saga_broker
from .session import Session, free_port, nproc, run_checked

SHARD_TEMPLATE = "saga_shard_template"  # (g)'s ledger: this database on each of the two servers
PG_FLOOR_TEMPLATE = "saga_floor_template"  # (h)'s ledger: the sagapool ledger and the floor's batches
SHARD_FLOOR_TEMPLATE = "saga_shard_floor_template"  # (gf)'s: one store's or a shard's ledger, uniform batches
NO_INVALID = ["--invalid-ratio", "0", "--overdraw-ratio", "0", "--unknown-ratio", "0"]


def _assigned(log: Path) -> int:
    """Partitions a worker says it holds now: its log's last "N assigned now"."""
    counts = re.findall(r"(\d+) assigned now", log.read_text(errors="replace"))
    return int(counts[-1]) if counts else 0


class Bench:
    def __init__(self, opts: Options, bin_dir: Path, bench_dir: Path, session: Session, started: float):
        self.opts, self.bin, self.bench_dir, self.s = opts, bin_dir, bench_dir, session
        self.work = session.work
        self.started = started
        self.results = Results(self.work / "results.tsv")
        self.budget = Budget(started, opts.budget_s)
        self.best_clients: dict[str, int] = {}
        self.run_n: dict[str, int] = {}
        self.half_rates: list[tuple[str, int]] = []
        self.speed: list[tuple[str, float]] = []  # (phase, CPU s / 1,000 of the speed probe at its start)
        self.kafka = Kafka(bench_dir.parent, self.work, session.procs, PARTITIONS)
        self.prometheus = Prometheus(self.work, session.procs)
        self._pgbench_seq = self._run_seq = 0
        self.pg: Postgres
        self.pg2: Postgres  # the second shard's server, for (g)
        self.pg_version = self.pg_settings = ""

    def elapsed(self) -> str:
        return f"{int(time.time() - self.started)} s"

    def phase(self, label: str, message: str) -> None:
        """A phase starts: say so, and take the host's speed, the CPU seconds
        per 1,000 plain ACID transfers in a short pgbench run. The host under
        this machine is shared: a run's later phases have cost 2-3.6 × the CPU
        a transfer of the same phases hours before (REPORT.md, "The
        thirty-fifth session"), and a fixed Python loop did not show it."""
        say(message)
        _, n, cpu_s, _, _ = self.pgbench("plain_transfer.sql", 0, SPEED_CLIENTS, self.opts.probe_s)
        self.speed.append((label, cpu_s / max(n, 1) * 1000))

    # ---- the PostgreSQL server and the ledgers ---------------------------------
    def start_postgres(self) -> None:
        say("starting two throwaway PostgreSQL servers (default durability): the store, and a second shard for (g)")
        # no pg_stat_statements: measure the server as deployed
        # Every autovacuum in the server log: a kept folder (--keep) shows
        # which run met one (REPORT.md, "The slow runs").
        # Prepared transactions: batches across the two shards commit in two
        # phases (one per connection at most).
        server_opts = ["-c max_connections=200", "-c max_prepared_transactions=200",
                       "-c log_autovacuum_min_duration=0"]
        self.pg = Postgres(self.work, "pg", server_opts)
        self.pg2 = Postgres(self.work, "pg2", server_opts)
        for server in (self.pg, self.pg2):
            self.s.servers.append(server)
            server.start()
        self.pg_version = self.pg.version()
        self.pg_settings = self.pg.psql("sagapool", """SELECT string_agg(name || '=' || current_setting(name), ', '
          ORDER BY name) FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes',
          'wal_sync_method', 'shared_buffers', 'max_wal_size', 'checkpoint_timeout', 'wal_level')""")
        note(f"PostgreSQL {self.pg_version}: {self.pg_settings}")
        for setting in ("fsync", "synchronous_commit", "full_page_writes"):
            for server in (self.pg, self.pg2):
                if server.psql("sagapool", f"SHOW {setting}") != "on":
                    raise Fatal(f"PostgreSQL {setting} is not on: durability weakened")

    def create_ledgers(self) -> None:
        """Accounts acct-0 .. acct-99999: a PostgreSQL template database, the
        same ledger over two shards (a template database on each server), a
        SQLite template file, and the baselines' tables (bench/tables.sql)."""
        say(f"creating the ledgers: {ACCOUNTS} accounts ({self.elapsed()})")
        csv = self.work / "accounts.csv"
        csv.write_text("id,balance\n" + "".join(f"acct-{i},{BALANCE}\n" for i in range(ACCOUNTS)))
        sagactl = self.bin / "sagactl"
        self.pg.psql("sagapool", "CREATE DATABASE saga_template")
        run_checked([sagactl, "--store", self.pg.url("saga_template"), "init"], "sagactl init on PostgreSQL")
        for server in (self.pg, self.pg2):
            server.psql("sagapool", f"CREATE DATABASE {SHARD_TEMPLATE}")
        shards = ledgers.shard_store_args(self.pg, self.pg2, SHARD_TEMPLATE)
        run_checked([sagactl, *shards, "init"], "sagactl init on two PostgreSQL shards")
        # The PostgreSQL imports (one durable commit per chunk) run while the rest is built.
        imports = [(self.work / "import-pg.out", ["--store", self.pg.url("saga_template")]),
                   (self.work / "import-pg-shards.out", shards)]
        importing = [self.s.procs.start([sagactl, *stores, "accounts", "import", csv], log) for log, stores in imports]
        sqlite = f"sqlite:{self.work / 'template.db'}"
        run_checked([sagactl, "--store", sqlite, "init"], "sagactl init on SQLite")
        run_checked([sagactl, "--store", sqlite, "accounts", "import", csv], "sagactl accounts import on SQLite")
        # Runs copy the template's file alone: its WAL is folded in first.
        with contextlib.closing(sqlite3.connect(self.work / "template.db")) as db:
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        tables = subprocess.run([self.pg.bin / "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1",
                                 "-v", f"naccounts={ACCOUNTS}", "-v", f"balance={BALANCE}",
                                 "-d", self.pg.url("sagapool"), "-f", self.bench_dir / "tables.sql"],
                                capture_output=True, text=True)
        for line in (tables.stdout + tables.stderr).splitlines():
            if not re.search(r"NOTICE: .* does not exist, skipping", line):
                print(line)
        if self.pg.psql("sagapool", "SELECT count(*) FROM plain_accounts") != str(ACCOUNTS):
            raise Fatal("the baselines' tables were not created")
        for proc, (log, _) in zip(importing, imports):
            if self.s.procs.wait(proc) != 0:
                show_tail(log, lines=50)
                raise Fatal("sagactl accounts import failed on PostgreSQL")

    def uniform_file(self, n: int) -> Path:
        """N uniform requests (saga-producer's generator is always
        Zipf-skewed), from bench/uniform.awk: the same file on every run."""
        path = self.work / f"uniform-{n}.jsonl"
        if not path.exists() or path.stat().st_size == 0:
            with open(path, "w") as out:
                subprocess.run(["awk", "-v", f"n={n}", "-v", f"m={ACCOUNTS}", "-f", self.bench_dir / "uniform.awk"],
                               stdout=out, check=True)
        return path

    # ---- (a), (b): pgbench --------------------------------------------------------
    def pgbench(self, script: str, zipf: int, clients: int, seconds: int, log: bool = False):
        """One pgbench run: (tps, transactions, CPU seconds of pgbench and
        every server process, p50 ms, p99 ms); latencies only with log."""
        self._pgbench_seq += 1
        folder = self.work / f"pgbench-{self._pgbench_seq}"
        folder.mkdir()
        self.pg.psql("sagapool", "VACUUM plain_accounts", "VACUUM tpc_accounts", "CHECKPOINT")
        argv = [self.pg.bin / "pgbench", "-n", "-M", "prepared", "-c", clients, "-j", min(clients, nproc()),
                "-T", seconds, "-D", f"zipf={zipf}", "-D", f"naccounts={ACCOUNTS}"]
        if log:
            argv += ["-l", "--log-prefix", folder / "tx"]
        argv += ["-f", self.bench_dir / script, self.pg.url("sagapool")]
        [(tps, n)], [cpu_s] = self.run_pgbench([(argv, folder / "out")], [self.pg],
                                               f"pgbench {script} (clients {clients})")
        p50 = p99 = "NaN"
        if log:
            logs = sorted(folder.glob("tx.*"))
            p50, p99 = measure.pgbench_latencies(logs)
            for path in logs:
                path.unlink()
        return tps, n, cpu_s, p50, p99

    def run_pgbench(self, runs: list[tuple[list, Path]], servers: list[Postgres],
                    what: str) -> tuple[list[tuple[float, int]], list[float]]:
        """pgbench runs side by side to their ends, each one's output in its
        path, the i-th run against servers[i]: each run's (tps,
        transactions), and each run's CPU seconds, its pgbench's and every
        process of its server's."""
        server_t0 = [server.ticks() for server in servers]
        procs = [self.s.procs.start(argv, out) for argv, out in runs]
        waited = [self.s.procs.wait_with_usage(proc) for proc in procs]
        server_s = [(server.ticks() - t0) / measure.TICKS_PER_S for server, t0 in zip(servers, server_t0)]
        results = []
        for (code, _), (_, out) in zip(waited, runs):
            text = out.read_text(errors="replace")
            if code != 0:
                print("\n".join(text.splitlines()[-20:]))
                raise Fatal(f"{what} failed")
            result = measure.pgbench_result(text)
            if result is None:
                print(text)
                raise Fatal(f"{what}: no result")
            results.append(result)
        return results, [s + u.ru_utime + u.ru_stime for s, (_, u) in zip(server_s, waited)]

    def pgbench_config(self, label: str, script: str, zipf: int) -> None:
        """Probes the client counts, then REPS runs at the best."""
        best, best_c = 0.0, 1
        for clients in self.opts.clients:
            tps = self.pgbench(script, zipf, clients, self.opts.probe_s)[0]
            note(f"{label}: {clients} client(s): {tps:.0f} transfers/s")
            if tps > best:
                best, best_c = tps, clients
            elif tps < 0.9 * best:
                break  # past the peak
        self.best_clients[label] = best_c
        for rep in range(1, self.opts.reps + 1):
            tps, n, cpu_s, p50, p99 = self.pgbench(script, zipf, best_c, self.opts.pgbench_s, log=True)
            self.results.add(label, rep, f"{tps:.0f}", p50, p99, f"{cpu_s / n * 1000:.3f}", "-", "-", "-")
            note(f"{label}: run {rep} at {best_c} clients: {tps:.0f} transfers/s, p50 {p50} ms, p99 {p99} ms")

    def baselines(self) -> None:
        self.phase("(a)", "(a) plain ACID transfers and (b) the naive two-phase-commit recipe, pgbench "
                   f"({self.elapsed()})")
        self.pgbench_config("a-uniform", "plain_transfer.sql", 0)
        self.pgbench_config("a-zipf", "plain_transfer.sql", 1)
        self.pgbench_config("b-uniform", "tpc_transfer.sql", 0)
        self.pgbench_config("b-zipf", "tpc_transfer.sql", 1)
        # The baselines' own audit: money conserved, nothing left half-done.
        total = f"{ACCOUNTS}::numeric * {BALANCE}"
        balanced = self.pg.psql("sagapool", f"""SELECT
          (SELECT sum(balance) FROM plain_accounts) = {total}
          AND (SELECT sum(balance) FROM tpc_accounts) = {total}
          AND NOT EXISTS (SELECT 1 FROM tpc_accounts WHERE pending <> '{{}}')
          AND NOT EXISTS (SELECT 1 FROM tpc_transfers WHERE state <> 'done')""")
        if balanced != "t":
            raise Fatal("the baselines' ledgers do not balance after pgbench")
        note("baselines audited: balances conserved, no pending entry or unfinished transfer left")

    # ---- (c), (d), (e): sagapool end to end ------------------------------------------
    def wait_outcomes(self, ledger, want: int, what: str, workers: list, ports: list[int], run: Path) -> None:
        """Until the store holds `want` transfers, every one terminal and published.
        The store is asked only once the workers' counters say `want` have
        finished (or every 10 s), and the whole table is counted only when
        nothing is left unfinished: a question whose cost grows with the
        table (its server CPU counts as the run's) made the run look slower
        at its end than at its start."""
        deadline = time.time() + 60 + want // 200
        asked = time.time()
        seen, unfinished = 0, "?"
        while True:
            if self.workers_finished(ports) >= want or time.time() - asked >= 10:
                asked = time.time()
                try:
                    unfinished = str(ledgers.count_unfinished(ledger))
                except Exception:
                    unfinished = "?"
                if unfinished == "0":
                    try:
                        seen = ledgers.count(ledger)
                    except Exception:
                        seen = 0
                if seen >= want and unfinished == "0":
                    return
            if time.time() >= deadline:
                raise Fatal(f"{what}: timed out waiting for outcomes ({seen} of {want} ingested, "
                            f"{unfinished} unfinished)")
            if any(w.poll() is not None for w in workers):
                show_tail(*sorted(run.glob("worker-*.log")))
                raise Fatal(f"{what}: a worker died")
            broker_log = run / "broker.log"
            if broker_log.exists() and "transfers.requests: the mock broker DROPPED" in broker_log.read_text(
                    errors="replace"):
                show_tail(broker_log)
                raise Fatal(f"{what}: saga-broker dropped requests to stay within its retention")
            time.sleep(0.25)

    @staticmethod
    def workers_finished(ports: list[int]) -> int:
        """Transfers the workers have finished, by their /metrics; 0 for a
        worker that does not answer."""
        total = 0
        for port in ports:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    total += measure.finished_total(r.read().decode())
            except (OSError, http.client.HTTPException):
                pass
        return total

    def saga_run(self, config: str, rep: int, store: str, dist: str, workers: int, n: int,
                 rate: int = 0, broker: str = "mock") -> None:
        """A fresh ledger and worker pool, and a fresh saga-broker (or the
        bench's Kafka node, whose group resumes after the last run's
        requests); n requests; waits until every one is terminal and
        published; records the figures; drains the workers; audits."""
        procs = self.s.procs
        self._run_seq += 1
        seq = self._run_seq
        run = self.work / f"run-{seq}"
        run.mkdir()
        if store == "postgres":
            ledger = ledgers.PostgresLedger(self.pg, "saga_template", f"saga_run_{seq}")
        elif store == "postgres-shards":
            ledger = ledgers.ShardedPostgresLedger(self.pg, self.pg2, SHARD_TEMPLATE, f"saga_run_{seq}")
        else:
            ledger = ledgers.SqliteLedger(self.work / "template.db", run)
        if broker == "kafka":
            self.kafka.start()
            broker_proc, bootstrap = self.kafka.proc, self.kafka.bootstrap
        else:
            broker_proc, bootstrap = start_saga_broker(procs, self.bin, run, PARTITIONS)
        pool, ports = [], []
        for i in range(workers):
            ports.append(free_port(tuple(ports)))
            pool.append(procs.start([self.bin / "saga-worker", "--brokers", bootstrap, "--group", "bench",
                                     *ledger.store_args, "--worker-id", f"bench-{i}",
                                     "--metrics-addr", f"127.0.0.1:{ports[i]}", "--lease", "10s"],
                                    run / f"worker-{i}.log"))
        self.prometheus.start()
        self.prometheus.scrape(ports)
        # Publish once the group has settled (every partition assigned), so it
        # does not rebalance while the burst arrives.
        assigned = 0
        for _ in range(150):
            assigned = sum(_assigned(run / f"worker-{i}.log") for i in range(workers))
            if assigned == PARTITIONS:
                break
            if any(w.poll() is not None for w in pool):
                show_tail(*sorted(run.glob("worker-*.log")))
                raise Fatal("a worker exited at start")
            time.sleep(0.2)
        if assigned != PARTITIONS:
            note(f"warning: the group had {assigned} of {PARTITIONS} partitions assigned after 30 s")
        # Warm-up: transfers (ids warm-*) through the whole pipeline first, so
        # the figures leave out cold start (first fetches, cold caches); they
        # are not counted, but audited with the rest.
        warmup = self.opts.warmup_n
        run_checked([self.bin / "saga-producer", "--brokers", bootstrap, "--generate", warmup,
                     "--accounts", ACCOUNTS, "--seed", 999, "--id-prefix", "warm", *NO_INVALID],
                    "saga-producer (warm-up)", log=run / "warmup.out")
        self.wait_outcomes(ledger, warmup, f"{config} warm-up", pool, ports, run)

        worker_ticks = -sum(measure.proc_ticks(w.pid) for w in pool)
        broker_ticks = -measure.proc_ticks(broker_proc.pid)
        servers = {"postgres": [self.pg], "postgres-shards": [self.pg, self.pg2]}.get(store, [])
        server_ticks = -sum(server.ticks() for server in servers)
        window = measure.BusyCores()  # the whole machine, over the same window
        producer = [self.bin / "saga-producer", "--brokers", bootstrap]
        if dist == "uniform":
            producer += ["--file", self.uniform_file(n)]
        else:
            producer += ["--generate", n, "--accounts", ACCOUNTS, "--seed", seq, *NO_INVALID]
        if rate:
            producer += ["--rate", rate]
        run_checked(producer, "saga-producer", log=run / "producer.out")
        self.wait_outcomes(ledger, warmup + n, config, pool, ports, run)
        server_ticks += sum(server.ticks() for server in servers)
        worker_ticks += sum(measure.proc_ticks(w.pid) for w in pool)
        rss_max = max(measure.proc_hwm_kb(w.pid) for w in pool)
        broker_ticks += measure.proc_ticks(broker_proc.pid)
        busy = str(window)

        fig = measure.run_figures(ledgers.measured_times(ledger), STEADY_AFTER_MS)
        secs = max(1, round(fig.span_ms / 1000))
        scraped = min(self.prometheus.scrapes(p, secs) for p in ports) / secs
        if scraped < 0.8:
            note(f"warning: {config}: Prometheus scraped a worker {scraped:.2f} times a second")
        if fig.done != n:
            note(f"warning: {config}: {fig.done} of {n} transfers done (the rest canceled)")
        # Drain: SIGTERM, and each worker must exit 0.
        for w in pool:
            w.terminate()
        for w in pool:
            try:
                code = procs.wait(w, timeout=60)
            except subprocess.TimeoutExpired:
                code = None
            if code != 0:
                raise Fatal(f"{config}: a worker did not exit cleanly (logs: run-{seq})")
        if broker == "mock":
            procs.stop([broker_proc])
        run_checked([self.bin / "sagactl", *ledger.store_args, "audit"],
                    f"{config} run {rep}: sagactl audit", log=run / "audit.out")
        ticks = worker_ticks + broker_ticks + server_ticks

        def per_1k(t: int) -> str:
            return f"{t / measure.TICKS_PER_S / fig.seen * 1000:.3f}"
        cpu = per_1k(ticks)
        s50 = "-" if fig.steady_p50 is None else fig.steady_p50
        s99 = "-" if fig.steady_p99 is None else fig.steady_p99
        self.results.add(config, rep, fig.transfers_per_s, fig.p50, fig.p99, cpu, rss_max, s50, s99,
                         secs, fig.sustained, f"{scraped:.2f}", busy)
        note(f"{config} run {rep}: {n} transfers in {secs} s, {fig.transfers_per_s} transfers/s "
             f"(last third / first third {fig.sustained}), p50 {fig.p50} ms, "
             f"p99 {fig.p99} ms (after the first {STEADY_AFTER_MS // 1000} s: {s50} / {s99} ms), "
             f"{cpu} CPU s/1k (workers {per_1k(worker_ticks)}, broker {per_1k(broker_ticks)}, "
             f"PostgreSQL {per_1k(server_ticks)}), worker peak RSS {rss_max // 1024} MiB, "
             f"scraped {scraped:.2f}/s, {busy} cores busy; audit passed")
        ledger.drop()

    def floor_run(self, config: str, rep: int, dist: str, batch: int, *flags: str) -> None:
        """(f): bench/sqlite_floor.py on a fresh copy of the SQLite ledger,
        as many transfers as a (d) run on real Kafka."""
        run = self.work / f"floor-{config}-{rep}"
        run.mkdir()
        ledger = ledgers.SqliteLedger(self.work / "template.db", run)
        n = self.run_n["sqlite"]
        window = measure.BusyCores()
        out = run_checked([sys.executable, self.bench_dir / "sqlite_floor.py", ledger.path, "--accounts", ACCOUNTS,
                           "--transfers", n, "--batch", batch, "--dist", dist, "--seed", rep, *flags],
                          f"{config} run {rep}: bench/sqlite_floor.py")
        tput, cpu, secs, third = out.split()
        busy = str(window)
        self.results.add(config, rep, tput, "-", "-", cpu, "-", "-", "-", f"{float(secs):.0f}", third, "-", busy)
        how = " ".join((f"{batch} per commit",) + flags)
        note(f"{config} run {rep}: {n} transfers, {how}, in {secs} s: {tput} "
             f"transfers/s (last third / first third {third}), {cpu} CPU s/1k, {busy} cores busy; balanced")
        ledger.drop()

    def floor_template(self, server: Postgres, database: str, ledger: str, setup: str) -> None:
        """A floor's template on `server`: a copy of the `ledger` database
        with the floor's 50 batches, from the bench/ script `setup`
        (pg_floor_batches.sql: Zipf, for (h); pg_floor_shards_batches.sql:
        uniform, for (gf))."""
        server.psql("sagapool", f"CREATE DATABASE {database} TEMPLATE {ledger}")
        run_checked([server.bin / "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", f"naccounts={ACCOUNTS}",
                     "-v", f"batch={PG_FLOOR_BATCH}", "-d", server.url(database), "-f", self.bench_dir / setup],
                    f"bench/{setup}")

    def pg_floor_run(self, config: str, rep: int, targets: list[tuple[Postgres, str, int]], clients: int) -> None:
        """(h), (gf): bench/pg_floor.sql by pgbench at once on each of
        `targets` (server, template, home: 1 where the transfers' rows go),
        on fresh copies of the templates, `clients` transactions in flight
        on each, for as long as (a)'s runs. A batch is done when every
        server committed it, so transfers/s is the slowest server's; the
        CPU per transfer is each server's over its own batches."""
        database = f"floor_{self._run_seq}"
        self._run_seq += 1
        for server, template, _ in targets:
            server.psql("sagapool", f"CREATE DATABASE {database} TEMPLATE {template}")
        servers = [server for server, _, _ in targets]
        window = measure.BusyCores()
        counts, cpu_s = self.run_pgbench(
            [([server.bin / "pgbench", "-n", "-c", clients, "-j", min(clients, nproc()), "-T", self.opts.pgbench_s,
               "-D", f"home={home}", "-f", self.bench_dir / "pg_floor.sql", server.url(database)],
              self.work / f"{config}-{rep}-{i}.out")
             for i, (server, _, home) in enumerate(targets)],
            servers, f"{config} run {rep}: pgbench bench/pg_floor.sql")
        busy = str(window)
        tps = min(r[0] for r in counts)
        tput = f"{tps * PG_FLOOR_BATCH:.0f}"
        cpu = f"{measure.floor_cpu_per_1k([(n, c) for (_, n), c in zip(counts, cpu_s)], PG_FLOOR_BATCH):.3f}"
        self.results.add(config, rep, tput, "-", "-", cpu, "-", "-", "-", str(self.opts.pgbench_s), "-", "-", busy)
        where = "" if len(targets) == 1 else f" on each of {len(targets)} servers"
        note(f"{config} run {rep}: {' and '.join(str(r[1]) for r in counts)} transactions of {PG_FLOOR_BATCH} "
             f"transfers, {clients} at a time{where}: {tput} transfers/s, {cpu} CPU s/1k, {busy} cores busy")
        for server in servers:
            server.psql("sagapool", f"DROP DATABASE {database}")

    def run_size(self, store: str) -> None:
        """--transfers N, else what the store finishes in about RUN_S
        seconds, measured by a short calibration run (so the bench keeps to
        its time budget however fast the binaries are)."""
        if self.opts.transfers:
            self.run_n[store] = self.opts.transfers
            return
        self.saga_run(f"calibrate-{store}", 1, store, "zipf", self.opts.workers, CALIBRATE_N)
        self.run_n[store] = run_size(float(self.results.of(f"calibrate-{store}")[0].tput))

    def size_sustained_runs(self) -> None:
        """The real-Kafka runs (the sustained ones) sized again from the
        median of the store's saga-broker runs, where that is faster than
        the calibration: one slow calibration run made every PostgreSQL run
        of 2026-11-27 too short (28-40 s) to count as sustained."""
        if self.opts.transfers:
            return
        for store, label in (("postgres", "c"), ("sqlite", "d")):
            rates = [r.tput for dist in ("uniform", "zipf") for r in self.results.of(f"{label}-{dist}")]
            if rates:
                self.run_n[store] = max(self.run_n[store], run_size(float(measure.median(rates))))
        note(f"real-Kafka runs: {self.run_n['postgres']} transfers on PostgreSQL, {self.run_n['sqlite']} on SQLite")

    def mock_n(self, store: str) -> int:
        """saga-broker keeps at most 5 MiB per partition, and Zipf puts about a
        fifth of the requests on one: a run on it moves at most MOCK_TRANSFERS_MAX."""
        return min(self.run_n[store], MOCK_TRANSFERS_MAX)

    def sagapool(self) -> None:
        """(c), (d), (e), (g), the half-load runs, (f) and (h). What is left of
        the budget is shared out: (c) to 35 %, (d) to 50 %, real Kafka ((c),
        (d) and (g)) to 76 %, (e) to 89 %, (gf) to 91 %, the half-load runs to
        95 %, (f) to 98 %, (h) to 99 %, the rest for the report. The floors
        come last: they are references, not targets, and the sustained runs
        before them can overrun their shares."""
        o, b = self.opts, self.budget
        b.share_out()
        for store, name, label in (("postgres", "PostgreSQL", "c"), ("sqlite", "SQLite", "d")):
            self.phase(f"({label})", f"({label}) sagapool on {name}, {o.workers} workers ({self.elapsed()})")
            end = b.phase_end(35 if label == "c" else 50)
            self.run_size(store)
            note(f"{self.run_n[store]} transfers per run ({self.mock_n(store)} on saga-broker)")
            for rep in range(1, o.reps + 1):
                if not b.rep_ok(rep, end, f"({label})"):
                    break
                for dist in ("uniform", "zipf"):
                    self.saga_run(f"{label}-{dist}", rep, store, dist, o.workers, self.mock_n(store))
        self.size_sustained_runs()
        # (g), two PostgreSQL shards, against (c) on real Kafka, uniform (with
        # Zipf the hot worker's backlog, see "sustained", would decide both),
        # with as many transfers: a run's rate falls as its tables grow. Each
        # (g) runs next to its (c), first in every other round: one store's
        # rate drifts from one minute to the next by more than the two differ
        # (REPORT.md, "The twenty-ninth session").
        self.phase("real Kafka", "(c), (d) and (g) (two PostgreSQL shards on two servers) on a real Kafka node "
                   f"({self.elapsed()})")
        end = b.phase_end(76)
        for rep in range(1, o.reps + 1):
            if not b.rep_ok(rep, end, "(c), (d), (g) on real Kafka"):
                break
            pair = [("ck-uniform", "postgres"), ("g-uniform", "postgres-shards")]
            for config, store in pair if rep % 2 else reversed(pair):
                self.saga_run(config, rep, store, "uniform", o.workers, self.run_n["postgres"], 0, "kafka")
            self.saga_run("dk-uniform", rep, "sqlite", "uniform", o.workers, self.run_n["sqlite"], 0, "kafka")
            self.saga_run("ck-zipf", rep, "postgres", "zipf", o.workers, self.run_n["postgres"], 0, "kafka")
            self.saga_run("dk-zipf", rep, "sqlite", "zipf", o.workers, self.run_n["sqlite"], 0, "kafka")
        self.phase("(e)", f"(e) scaling on {o.scale_store}: 1, 2 and 4 workers, Zipf ({self.elapsed()})")
        end = b.phase_end(89)
        # Worker counts take turns, so a machine that drifts during the phase
        # weighs on each count alike.
        for rep in range(1, o.reps + 1):
            if not b.rep_ok(rep, end, "(e)"):
                break
            for workers in SCALE_WORKERS:
                self.saga_run(f"e-{workers}", rep, o.scale_store, "zipf", workers, self.run_n[o.scale_store], 0,
                              "kafka")
        end = b.phase_end(91)
        # What the servers alone can write: (g)'s rows with no saga, on one
        # server with (c)'s transactions in flight and on both with (g)'s.
        self.phase("(gf)", f"(gf) the two-shard floor: bare SQL, {PG_FLOOR_BATCH:,} uniform transfers per "
                   f"transaction, one server and two ({self.elapsed()})")
        one, first, second = (f"{SHARD_FLOOR_TEMPLATE}_{k}" for k in ("one", 0, 1))
        for server, database, ledger in ((self.pg, one, "saga_template"), (self.pg, first, SHARD_TEMPLATE),
                                         (self.pg2, second, SHARD_TEMPLATE)):
            self.floor_template(server, database, ledger, "pg_floor_shards_batches.sql")
        for rep in range(1, o.reps + 1):
            if not b.rep_ok(rep, end, "(gf)"):
                break
            self.pg_floor_run("gf-1", rep, [(self.pg, one, 1)], 2 * o.workers)
            self.pg_floor_run("gf-2", rep, [(self.pg, first, 1), (self.pg2, second, 0)], o.workers)
        self.phase("half load", f"half-load latency: (c) and (d) at half their measured Zipf throughput, for "
                   f"{o.half_s} s, on saga-broker and on real Kafka ({self.elapsed()})")
        # The target holds in each of the runs, so they are repeated too. Half
        # of each broker's own measured rate: (c) on saga-broker, ck on Kafka.
        half = [(f"{prefix}-{which}", store, broker,
                 int(float(self.results.median(f"{which}{suffix}-zipf", "tput") or 0) / 2))
                for which, store in (("c", "postgres"), ("d", "sqlite"))
                for prefix, suffix, broker in (("half", "", "mock"), ("halfk", "k", "kafka"))]
        self.half_rates = [(config, rate) for config, _, _, rate in half]
        end = b.phase_end(95)
        for rep in range(1, o.reps + 1):
            if not b.rep_ok(rep, end, "the half-load runs"):
                break
            for config, store, broker, rate in half:
                self.saga_run(config, rep, store, "zipf", o.workers, half_load_n(rate, o.half_s, broker), rate,
                              broker)
        self.phase("(f)", f"(f) the SQLite floor: bare SQL, {WORKER_BATCH:,} and {FLOOR_BATCH_MAX:,} "
                   f"transfers per commit ({self.elapsed()})")
        end = b.phase_end(98)
        for rep in range(1, o.reps + 1):
            if not b.rep_ok(rep, end, "(f)"):
                break
            for dist in ("uniform", "zipf"):
                self.floor_run(f"f-{dist}", rep, dist, WORKER_BATCH)
                self.floor_run(f"fx-{dist}", rep, dist, FLOOR_BATCH_MAX)
                # Schema version 3's rows are a historical comparison that
                # takes 87-196 s a run and slows within it: once is enough.
                if rep == 1:
                    self.floor_run(f"fi-{dist}", rep, dist, WORKER_BATCH, "--account-index")
        self.phase("(h)", f"(h) the PostgreSQL floor: bare SQL, {PG_FLOOR_BATCH:,} transfers per transaction, "
                   f"Zipf, {', '.join(map(str, PG_FLOOR_CLIENTS))} at a time ({self.elapsed()})")
        end = b.phase_end(99)
        self.floor_template(self.pg, PG_FLOOR_TEMPLATE, "saga_template", "pg_floor_batches.sql")
        for rep in range(1, o.reps + 1):
            if not b.rep_ok(rep, end, "(h)"):
                break
            for clients in PG_FLOOR_CLIENTS:
                self.pg_floor_run(f"h-{clients}", rep, [(self.pg, PG_FLOOR_TEMPLATE, 1)], clients)
