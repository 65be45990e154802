#!/usr/bin/env python3
"""Side-by-side benchmarks (issue #7), in one run on one throwaway PostgreSQL
server (loopback, default durability: fsync, synchronous_commit and
full_page_writes on) and this machine, over 100,000 accounts, with uniform
and Zipf-skewed (s = 1.1) account choice:
  (a) plain ACID transfer (BEGIN; UPDATE; UPDATE; COMMIT), pgbench
  (b) the two-phase-commit recipe done naively: 8 autocommitted writes
      per transfer, one transfer at a time per client, pgbench
  (c) sagapool end to end on that PostgreSQL: producer -> saga-broker ->
      saga-worker pool -> PostgreSQL
  (d) sagapool end to end on SQLite
  (e) sagapool with 1, 2 and 4 workers (on SQLite unless --scale-store postgres)
  (f) the SQLite floor: a finished transfer's rows written by bare SQL
      (bench/sqlite_floor.py), with and without the per-account index
  and a latency run of (c) and (d) at half their measured throughput.
(c) and (d) run on saga-broker (librdkafka's mock cluster) and again on a
real one-node Apache Kafka (tools/kafka/kafka.sh), side by side.
pgbench runs at its best client count (probed first). Every sagapool run
ends with `sagactl audit`, and the bench fails if it does not pass.
Writes bench/REPORT.md (the part above its hand-written marker) and
bench/throughput.png, or into --out DIR; --quick (small sizes, one
repetition) writes into a temporary folder unless --out is given.
Each sagapool run moves N transfers: --transfers N, else as many as a
calibration run says the store finishes in about 75 s (20,000..1,000,000):
the targets ask for sustained runs, 60 s or 1,000,000 transfers at least.
A real Prometheus scrapes every worker once a second throughout.
The bench keeps to a budget of 90 minutes (SAGA_BENCH_BUDGET_S=5400): once a
phase is past its share, its remaining repetitions are skipped, and the
report says so.
Usage: bench/run.py BIN_DIR [--quick] [--reps N] [--transfers N] [--workers N]
                    [--clients "1 2 4 ..."] [--scale-store sqlite|postgres]
                    [--out DIR] [--keep]
"""
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sagabench import machine, options, report  # noqa: E402
from sagabench.console import Fatal, Stopped, error, note, say  # noqa: E402
from sagabench.runs import Bench  # noqa: E402
from sagabench.session import Session  # noqa: E402

BENCH = Path(__file__).resolve().parent


def bench(opts: options.Options, bin_dir: Path, s: Session) -> Path:
    """The whole bench in the session s; the report's path."""
    started = time.time()
    load_at_start = machine.load_average()
    b = Bench(opts, bin_dir, BENCH, s, started)
    b.start_postgres()
    dsync_rate = machine.dsync_writes_per_s(s.work)
    note(f"disk: {dsync_rate} synchronous 8 kB writes/s")
    b.create_ledgers()
    b.baselines()
    b.sagapool()

    b.phase("the report", f"writing the report ({b.elapsed()})")
    # A --quick report goes to a folder of its own that outlives the bench's.
    out = Path(opts.out) if opts.out else (
        Path(tempfile.mkdtemp(prefix="sagapool-bench-report-")) if opts.quick else BENCH)
    out.mkdir(parents=True, exist_ok=True)
    facts = report.Facts(
        opts=opts, run_n=b.run_n, best_clients=b.best_clients, skipped=b.budget.skipped,
        half_rates=b.half_rates, pg_version=b.pg_version, pg_settings=b.pg_settings, dsync_rate=dsync_rate,
        machine=machine.describe(BENCH.parent, s.work, load_at_start),
        speed=b.speed,
        generated_at=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), wall_s=int(time.time() - started))
    path = out / "REPORT.md"
    report.write(path, b.results, facts)
    # The chart: one bar per configuration, transfers/s.
    report.chart(b.results, facts, BENCH / "throughput.gp", s.work, out)
    say(f"done in {b.elapsed()}: {path}")
    return path


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stdout if argv else sys.stderr)
        return 0 if argv else 2
    try:
        opts = options.parse(argv[1:], dict(os.environ))
    except options.UsageError as e:
        print(f"bench: {e}", file=sys.stderr)
        return 2
    bin_dir = Path(argv[0]).resolve()
    if not (bin_dir / "saga-worker").exists():
        print(f"bench: {argv[0]} holds no saga-worker: BIN_DIR is the build's bin/ folder", file=sys.stderr)
        return 2
    for tool in ("awk", "dd", "kcat"):
        if not shutil.which(tool):
            print(f"bench: {tool} is needed (./dev installs it)", file=sys.stderr)
            return 1
    try:
        with Session(opts.keep) as s:
            try:
                path = bench(opts, bin_dir, s)
            except Fatal as e:  # said before the cleanup says where the files are
                error(str(e))
                raise
    except Fatal:
        return 1
    except Stopped as e:
        return e.code
    # The targets and figures, on stdout.
    text = path.read_text()
    print(text[text.index("## Targets"):text.index("## Machine")], end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
