"""bench/REPORT.md and throughput.png from the results. The part above the
marker line is generated; everything after it is hand-written and kept."""
import dataclasses
import subprocess
from pathlib import Path

from .console import note
from .machine import Machine
from .options import (ACCOUNTS, BALANCE, CALIBRATE_N, FLOOR_BATCH_MAX, MOCK_TRANSFERS_MAX, PARTITIONS,
                      PG_FLOOR_BATCH, PG_FLOOR_CLIENTS, PG_LANES, RUN_S, SCALE_WORKERS, SPEED_CLIENTS,
                      STEADY_AFTER_MS, SUSTAINED_S, MOCK_HALF_LOAD_MAX, WORKER_BATCH, Options, half_load_n)
from .results import Results

MARKER = "<!-- Hand-written below this line: bench/run.py keeps everything after it. -->"
MARKER_START = "<!-- Hand-written below this line:"  # older reports named bench/run.sh
DEFAULT_HAND = """
## Where the time goes

Profile notes (perf, pg_stat_statements, the workers' stage histograms):
what dominates each of (c) and (d), and what would move it.

- (to be filled in)"""
# Rows of "Figures" and bars of the chart, in this order where measured.
CONFIGS = ("a-uniform", "a-zipf", "b-uniform", "b-zipf", "c-uniform", "c-zipf", "ck-uniform", "ck-zipf",
           "d-uniform", "d-zipf", "dk-uniform", "dk-zipf", *(f"e-{n}" for n in SCALE_WORKERS),
           "g-uniform", "gf-1", "gf-2", "f-uniform", "f-zipf", "fx-uniform", "fx-zipf", "fi-uniform", "fi-zipf",
           *(f"h-{n}" for n in PG_FLOOR_CLIENTS))


@dataclasses.dataclass
class Facts:
    """What the report says besides the results."""
    opts: Options
    run_n: dict[str, int]
    best_clients: dict[str, int]
    skipped: list[str]
    half_rates: list[tuple[str, int]]  # (half-c, halfk-c, half-d, halfk-d; rate offered)
    pg_version: str
    pg_settings: str
    dsync_rate: str
    machine: Machine
    generated_at: str  # UTC, "%Y-%m-%d %H:%M UTC"
    wall_s: int
    # (phase, CPU s / 1,000 plain transfers at its start): the host's speed
    speed: list[tuple[str, float]] = dataclasses.field(default_factory=list)


# Beyond this, slowest ÷ fastest of the host's speed probes, the report
# says its figures are not comparable across phases: the 1-second probes
# of one --quick run spread 1.30 ×, the slowdowns seen were 2-3.6 ×.
SPEED_DRIFT_MAX = 1.5


def _missing(v) -> bool:
    return v is None or v in ("", "-", "–", "NaN")


def fmt(v, decimals: int = 0) -> str:
    return "–" if _missing(v) else f"{float(v):.{decimals}f}"


def thousands(v) -> str:
    return "–" if _missing(v) else f"{int(f'{float(v):.0f}'):,}"


def rss_mib(kb) -> str:
    return "–" if _missing(kb) else f"{float(kb) / 1024:.0f}"


def ratio(a, b) -> str:
    return "–" if _missing(a) or _missing(b) else f"{(float(a) / float(b) if float(b) > 0 else 0):.2f}"


def verdict(met: bool, blocked: bool = False) -> str:
    """blocked: missed, and out of reach on this machine by a measured limit."""
    return "**met**" if met else "**blocked**" if blocked else "**missed**"


def _all(values, test) -> bool:
    """test holds for every value, each a figure as printed (none missing)."""
    return all(not _missing(v) and test(float(v)) for v in values)


def scaling_falls_with_the_floor(scale: list, pg_floor: list) -> bool:
    """(e) on PostgreSQL (scale: SCALE_WORKERS) falls, and the floor (h)
    (pg_floor: PG_FLOOR_CLIENTS in flight) falls at least as much over each
    such step, at the transactions in flight of those workers' lanes: bare
    SQL on this server loses as much, so the target is out of reach here."""
    if any(map(_missing, scale)):
        return False
    workers = dict(zip(SCALE_WORKERS, map(float, scale)))
    floor = dict(zip(PG_FLOOR_CLIENTS, pg_floor))
    falls = [(a, b) for a, b in zip(SCALE_WORKERS, SCALE_WORKERS[1:]) if workers[b] < workers[a]]
    return bool(falls) and all(
        not _missing(floor.get(a * PG_LANES)) and not _missing(floor.get(b * PG_LANES))
        and workers[b] / workers[a] >= float(floor[b * PG_LANES]) / float(floor[a * PG_LANES])
        for a, b in falls)


def hand_written(existing: str | None) -> str:
    """Everything after the marker line of an existing report, else the
    placeholder section."""
    if existing:
        lines = existing.split("\n")
        for i, line in enumerate(lines):
            if line.startswith(MARKER_START):
                kept = "\n".join(lines[i + 1:]).rstrip("\n")
                if kept:
                    return kept
                break
    return DEFAULT_HAND


def _store(config: str, f: Facts) -> str:
    kind = config.partition("-")[0]
    return f.opts.scale_store if kind == "e" else "postgres" if kind in ("c", "ck") else "sqlite"


def describe(config: str, f: Facts) -> str:
    kind, _, rest = config.partition("-")
    workers = f.opts.workers
    return {
        "a": f"(a) plain ACID transfer, pgbench, {f.best_clients.get(config)} clients",
        "b": f"(b) naive 2PC recipe, 8 autocommits, pgbench, {f.best_clients.get(config)} clients",
        "c": f"(c) sagapool on PostgreSQL, {workers} workers, saga-broker",
        "d": f"(d) sagapool on SQLite, {workers} workers, saga-broker",
        "ck": f"(c) sagapool on PostgreSQL, {workers} workers, real Kafka",
        "dk": f"(d) sagapool on SQLite, {workers} workers, real Kafka",
        "e": f"(e) sagapool on {f.opts.scale_name}, {rest} worker{'' if rest == '1' else 's'}, real Kafka",
        "g": f"(g) sagapool on two PostgreSQL shards (two servers), {workers} workers, real Kafka",
        "gf": f"(gf) the two-shard floor: bare SQL, (g)'s rows, {thousands(PG_FLOOR_BATCH)} per transaction, "
              + (f"one server, {2 * workers} at a time" if rest == "1" else f"two servers, {workers} at a time on each"),
        "f": f"(f) the SQLite floor: bare SQL, a finished transfer's rows, {thousands(WORKER_BATCH)} per commit",
        "fx": f"(f) the SQLite floor: bare SQL, a finished transfer's rows, {thousands(FLOOR_BATCH_MAX)} per commit",
        "fi": f"(f) the same rows as schema version 3 wrote them (indexed by account and time), "
              f"{thousands(WORKER_BATCH)} per commit",
        "h": f"(h) the PostgreSQL floor: bare SQL, a finished transfer's rows, {thousands(PG_FLOOR_BATCH)} per "
             f"transaction, {rest} at a time",
    }[kind]


def render(results: Results, f: Facts, existing: str | None) -> str:
    """The whole report: the generated part, the marker, the kept part."""
    o, m = f.opts, f.machine
    med = results.median
    out: list[str] = []
    w = out.append

    a_u, a_z, b_u, b_z = (med(c, "tput") for c in ("a-uniform", "a-zipf", "b-uniform", "b-zipf"))
    c_u, c_z, d_u, d_z = (med(c, "tput") for c in ("c-uniform", "c-zipf", "d-uniform", "d-zipf"))
    ck_u, ck_z, dk_u, dk_z = (med(c, "tput") for c in ("ck-uniform", "ck-zipf", "dk-uniform", "dk-zipf"))
    floor_text = "; the floor (f) at {} per commit: uniform {}, Zipf {}; at {}: uniform {}, Zipf {}".format(
        thousands(WORKER_BATCH), *(thousands(med(c, "tput")) for c in ("f-uniform", "f-zipf")),
        thousands(FLOOR_BATCH_MAX), *(thousands(med(c, "tput")) for c in ("fx-uniform", "fx-zipf")))
    rss_full = max((int(r.rss) for r in results.rows if not r.config.startswith("half") and r.rss != "-"),
                   default=0)
    # On saga-broker (half-) and on real Kafka (halfk-): the target holds on both.
    half_p99 = {f"({which}){' on real Kafka' if prefix == 'halfk' else ''}":
                [r.s99 for r in results.of(f"{prefix}-{which}")]
                for which in ("c", "d") for prefix in ("half", "halfk")}
    c_a = ratio(c_u, a_u), ratio(c_z, a_z)
    c_b = ratio(c_u, b_u), ratio(c_z, b_z)
    ck_a = ratio(ck_u, a_u), ratio(ck_z, a_z)
    steady_s = STEADY_AFTER_MS // 1000
    probes = [cpu for _, cpu in f.speed]
    drift = max(probes) / min(probes) if probes and min(probes) > 0 else None

    w("# sagapool benchmarks")
    w("")
    w(f"Generated by `./dev bench` (`bench/run.py`) on {f.generated_at}; "
      f"the whole run took {f.wall_s // 60} min {f.wall_s % 60} s.")
    if o.quick:
        w("**A `--quick` smoke run: small sizes, one repetition; not figures to quote.**")
    w("")
    w(f"{thousands(ACCOUNTS)} accounts; account choice uniform or Zipf-skewed (s = 1.1: the most used account is")
    cut = f", except where the time budget cut repetitions: {'; '.join(f.skipped)}" if f.skipped else ""
    w(f"in about one transfer in seven). Figures are medians of {o.reps} run(s) each{cut}.")
    w("(f) as schema version 3 wrote its rows runs once, in the first repetition: a historical comparison.")
    w("Every sagapool run")
    w("ended with `sagactl audit` passing; the baselines' tables balanced after pgbench.")
    calibrated = "" if o.transfers else (f" (what each store finishes in about {RUN_S} s at the median rate of "
                                         f"its saga-broker runs, or of a {thousands(CALIBRATE_N)}-transfer "
                                         "calibration run where that is faster)")
    w(f"Each sagapool run on real Kafka moved N transfers: {thousands(f.run_n.get('postgres'))} on PostgreSQL "
      "(one store or two shards), "
      f"{thousands(f.run_n.get('sqlite'))} on SQLite{calibrated};")
    w(f"on saga-broker at most {thousands(MOCK_TRANSFERS_MAX)}, as its retention of 5 MiB per partition allows "
      f"(so only the real-Kafka runs are sustained), and at half load at most {thousands(MOCK_HALF_LOAD_MAX)}.")
    w("")
    if drift is not None and drift > SPEED_DRIFT_MAX:
        w(f"**The host's speed drifted during this run**: a plain ACID transfer cost up to {drift:.2f} × the CPU "
          "it cost at its cheapest (see Machine). Figures from different phases, and from other runs, are not "
          "comparable.")
        w("")
    w("## Targets")
    w("")
    w("| target | measured | |")
    w("| --- | --- | --- |")
    cpu_c_a = (ratio(med("c-uniform", "cpu"), med("a-uniform", "cpu")),
               ratio(med("c-zipf", "cpu"), med("a-zipf", "cpu")))
    w(f"| CPU per transfer: (c) ≤ 0.5 × (a) | uniform {cpu_c_a[0]}, Zipf {cpu_c_a[1]} | "
      f"{verdict(_all(cpu_c_a, lambda v: v <= 0.5))} |")
    w(f"| c/a ≥ 2 (sagapool on PostgreSQL vs plain ACID) | uniform {c_a[0]}, Zipf {c_a[1]} | "
      f"{verdict(_all(c_a, lambda v: v >= 2))} |")
    w(f"| c/b ≥ 8 (sagapool on PostgreSQL vs the naive recipe) | uniform {c_b[0]}, Zipf {c_b[1]} | "
      f"{verdict(_all(c_b, lambda v: v >= 8))} |")
    # The floor (f) writes the rows a finished transfer leaves with no saga:
    # if even its best figure is under the target, the target is out of reach.
    floors = [med(c, "tput") for c in ("f-uniform", "f-zipf", "fx-uniform", "fx-zipf")]
    under_floor = any(not _missing(v) for v in floors) and all(
        _missing(v) or float(v) < 50000 for v in floors)
    blocked_text = "; the floor is under the target" if under_floor else ""
    w(f"| d ≥ 50,000 transfers/s (sagapool on SQLite) | uniform {thousands(d_u)}, Zipf {thousands(d_z)}"
      f"{floor_text}{blocked_text} | {verdict(_all((d_u, d_z), lambda v: v >= 50000), under_floor)} |")
    w(f"| c/a ≥ 2 on real Kafka | uniform {ck_a[0]}, Zipf {ck_a[1]} | {verdict(_all(ck_a, lambda v: v >= 2))} |")
    w(f"| d ≥ 50,000 transfers/s on real Kafka | uniform {thousands(dk_u)}, Zipf {thousands(dk_z)}{blocked_text} | "
      f"{verdict(_all((dk_u, dk_z), lambda v: v >= 50000), under_floor)} |")
    scale = [med(f"e-{n}", "tput") for n in SCALE_WORKERS]
    # The floor (h) is the store's own ceiling with as many transactions in
    # flight as (e)'s workers have: where it falls as much as (e), bare SQL
    # does no better, and the target is blocked.
    pg_floor = [med(f"h-{n}", "tput") for n in PG_FLOOR_CLIENTS]
    pg_floor_text = "" if o.scale_store != "postgres" or all(map(_missing, pg_floor)) else (
        f"; the PostgreSQL floor (h) with {' / '.join(map(str, PG_FLOOR_CLIENTS))} transactions in flight: "
        f"{' / '.join(thousands(v) for v in pg_floor)}")
    scale_met = not any(map(_missing, scale)) and all(
        float(a) <= float(b) for a, b in zip(scale, scale[1:]))
    scale_blocked = o.scale_store == "postgres" and scaling_falls_with_the_floor(scale, pg_floor)
    scale_blocked_text = (f"; the floor falls as much at {PG_LANES} transactions in flight a worker"
                          if scale_blocked else "")
    w(f"| scaling on one {o.scale_name} store: transfers/s do not fall from "
      f"{' to '.join(map(str, SCALE_WORKERS))} workers (e) | "
      f"{' / '.join(thousands(v) for v in scale)}{pg_floor_text}{scale_blocked_text} | "
      f"{verdict(scale_met, scale_blocked)} |")
    g_tput = ratio(med("g-uniform", "tput"), ck_u)
    g_cpu = ratio(med("g-uniform", "cpu"), med("ck-uniform", "cpu"))
    # The floor (gf): what two servers write against one, with no saga.
    gf_tput = ratio(med("gf-2", "tput"), med("gf-1", "tput"))
    gf_text = "" if _missing(gf_tput) else (
        f"; the floor (gf), two servers against one: transfers/s {gf_tput} ×, "
        f"CPU {ratio(med('gf-2', 'cpu'), med('gf-1', 'cpu'))} ×")
    w(f"| two PostgreSQL shards (g) ≥ one store's transfers/s, CPU per transfer ≤ 1.3 × one store's "
      f"((c) on real Kafka, uniform) | transfers/s {g_tput} ×, CPU {g_cpu} ×{gf_text} | "
      f"{verdict(_all((g_tput,), lambda v: v >= 1) and _all((g_cpu,), lambda v: v <= 1.3))} |")
    each = "; ".join(f"{label} {', '.join(fmt(v) for v in p99s) or '–'} ms" for label, p99s in half_p99.items())
    w(f"| p99 ≤ 250 ms at half load, in each run | {each} | "
      f"{verdict(all(half_p99.values()) and _all(sum(half_p99.values(), []), lambda v: v <= 250))} |")
    w(f"| worker peak RSS ≤ 200 MiB at full load | {rss_mib(rss_full)} MiB | {verdict(rss_full <= 200 * 1024)} |")
    full = [r for r in results.rows if r.config.partition("-")[0] in ("ck", "dk", "e")]
    long_enough = [r.secs != "-" and (int(r.secs) >= SUSTAINED_S or f.run_n.get(_store(r.config, f), 0) >= 1_000_000)
                   for r in full]
    thirds = [r.third for r in full]
    shown = sorted(float(t) for t in thirds if not _missing(t))
    w(f"| sustained: each (c), (d), (e) run on real Kafka ≥ {SUSTAINED_S} s or 1,000,000 transfers, its last "
      f"third's rate ≥ 0.9 × its first third's | shortest {min((int(r.secs) for r in full if r.secs != '-'), default='–')} s; "
      f"last ÷ first third {fmt(shown[0] if shown else None, 2)} to {fmt(shown[-1] if shown else None, 2)} | "
      f"{verdict(bool(full) and all(long_enough) and _all(thirds, lambda v: v >= 0.9))} |")
    scraped = [r.scraped for r in results.rows if r.scraped != "-"]
    least = min((float(v) for v in scraped), default=None)
    w(f"| Prometheus scrapes every worker once a second | least scraped worker of a run: "
      f"{fmt(least, 2)} scrapes/s | {verdict(bool(scraped) and _all(scraped, lambda v: v >= 0.9))} |")
    w("")
    w("## Figures")
    w("")
    w("| | accounts | transfers/s | latency p50 | latency p99 | CPU s / 1,000 transfers | worker peak RSS |")
    w("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for config in CONFIGS:
        if not results.of(config):
            continue
        dist = ("zipf" if config.startswith(("e-", "h-")) else "uniform" if config.startswith("gf-")
                else config.partition("-")[2])
        rss = "–" if config[0] in "abfh" or config.startswith("gf-") else f"{rss_mib(results.max(config, 'rss'))} MiB"
        w(f"| {describe(config, f)} | {dist} | {thousands(med(config, 'tput'))} | {fmt(med(config, 'p50'))} ms | "
          f"{fmt(med(config, 'p99'))} ms | {fmt(med(config, 'cpu'), 3)} | {rss} |")
    for config, rate in f.half_rates:
        prefix, _, which = config.partition("-")
        kafka = prefix == "halfk"
        broker = "real Kafka" if kafka else "saga-broker"
        seconds = half_load_n(rate, o.half_s, "kafka" if kafka else "mock") / max(rate, 1)
        w(f"| ({which}) at half load, {broker}: {thousands(rate)}/s offered for {seconds:.0f} s; latency after its first "
          f"{steady_s} s | zipf | {thousands(med(config, 'tput'))} | {fmt(med(config, 's50'))} ms | "
          f"{fmt(med(config, 's99'))} ms | {fmt(med(config, 'cpu'), 3)} | {rss_mib(results.max(config, 'rss'))} MiB |")
    w("")
    w("![transfers per second](throughput.png)")
    w("")
    w("Definitions:")
    w("")
    w("- **transfers/s**: (a), (b) pgbench's tps (one transaction script = one transfer) over")
    w(f"  {o.pgbench_s} s at the best client count of those tried ({o.clients_text}; {o.probe_s} s each);")
    w("  sagapool: finished transfers / (last terminal-state time − first request timestamp).")
    w("  saga-producer sends a run's first request alone and waits for its delivery (a fresh client's")
    w("  connection and idempotent id, at times a second) before the rest: that request is left out of")
    w("  every figure, so the span starts with the load. The producer publishes the whole run at once, so")
    w("  full-load latencies of sagapool are mostly queueing; the half-load rows are the latency figures.")
    w(f"- **warm-up**: each sagapool run first sends {thousands(o.warmup_n)} transfers through the fresh pool "
      "and waits for")
    w("  them; they are audited but left out of every figure (time, latency, CPU).")
    w("- **latency**: sagapool: request timestamp (the Kafka message's) to the terminal state, from")
    w("  the transfers table; pgbench: each transaction script's latency from its per-transaction log.")
    w(f"  The half-load rows leave out the requests of the run's first {steady_s} s, the start of a fresh")
    w("  saga-producer (\"Every run\" has both figures).")
    w("- **CPU s / 1,000 transfers**: user + system CPU seconds, from /proc/PID/stat (children")
    w("  reaped included), per 1,000 transfers: (a), (b) pgbench + every PostgreSQL server process;")
    w("  (c) workers + broker + every PostgreSQL server process (both servers' for (g));")
    w("  (d), (e) on SQLite workers + broker.")
    w("  (f): its own process; (h): pgbench + every PostgreSQL server process.")
    w("  The producer's CPU is not counted (it is the load generator).")
    w("- **the floor (f)**: `bench/sqlite_floor.py` on a copy of the SQLite ledger: the rows a finished")
    w("  transfer leaves (transfer row, two postings linked to their accounts' chains, two accounts), set-based")
    w("  SQL on one connection with the workers' settings, no saga and no broker; transfers/s from its")
    w(f"  first batch to its last commit. {thousands(FLOOR_BATCH_MAX)} per commit is the SQLite workers' batch at")
    w(f"  full load, and the most a worker takes; {thousands(WORKER_BATCH)}, their batch before the thirtieth session")
    w("  (and still PostgreSQL's). \"As schema version 3 wrote them\": with")
    w("  `--account-index`, postings unlinked and indexed by (account, time) in postings_account instead.")
    w("- **the floor (h)**: `bench/pg_floor.sql` by pgbench on a copy of the PostgreSQL ledger: per")
    w(f"  transaction {thousands(PG_FLOOR_BATCH)} finished transfers (a lane's share of the workers' batch), Zipf:")
    w("  their accounts locked in id order, two postings each, each account's balance and batch link once, the")
    w("  batch's link row, the transfers' rows")
    w("  in their final state. No checks, no outcomes to decide, no broker or worker on the machine;")
    w(f"  {', '.join(map(str, PG_FLOOR_CLIENTS))} clients = transactions in flight ((e)'s "
      f"{', '.join(map(str, SCALE_WORKERS[:-1]))} and {SCALE_WORKERS[-1]} workers run {PG_LANES} lanes each), "
      f"{o.pgbench_s} s each. Scaling on PostgreSQL is **blocked** where (e) falls and")
    w("  the floor falls at least as much over the same transactions in flight: bare SQL does no better there.")
    w("- **the two-shard floor (gf)**: `bench/pg_floor.sql` by pgbench, the (h) floor's rows for")
    w(f"  {thousands(PG_FLOOR_BATCH)} uniform transfers a transaction, where (g) keeps them: on one server (a copy of")
    w(f"  the one-store ledger, {2 * o.workers} transactions in flight as (c)'s lanes), or at once on both servers")
    w(f"  (copies of the shards, {o.workers} in flight on each as (g)'s workers), the legs on the server of their")
    w("  account and the transfers' rows on the first. No cross-shard protocol. A batch counts when every server")
    w("  committed it; CPU per transfer is each server's (with its pgbench) over its own batches, summed.")
    w("- **sustained**: a run's span (first request to last outcome) cut in three; the transfers")
    w("  finished in its last third over those finished in its first (\"last ÷ first third\" in \"Every run\").")
    w("- **scrapes/s**: a real Prometheus scrapes every worker's /metrics once a second throughout;")
    w("  its successful scrapes of the least scraped worker over the run's span, per second.")
    w("- **cores busy**: the whole machine's busy CPU time (/proc/stat: all but idle and iowait) per second,")
    w(f"  of its {m.cpus} cores: for sagapool from the producer's start to the last outcome, for the floors over")
    w("  their script. Everything on the machine counts: the load generator, Prometheus and the bench too.")
    w("- **worker peak RSS**: VmHWM of each worker process (/proc/PID/status) at the end of the run,")
    w("  the largest of the workers and runs.")
    w(f"- **durability**: PostgreSQL with its defaults ({f.pg_settings}); the")
    w(f"  SQLite store as the workers configure it (journal_mode={m.sqlite_journal}, synchronous={m.sqlite_sync});")
    w("  requests through the broker with the producer's enable.idempotence=true (so acks=all).")
    w("")
    w("## Machine")
    w("")
    w(f"- {m.cpus} CPUs: {m.cpu_model}; {m.mem_gib} GiB memory; Linux {m.kernel}")
    w(f"- the data on {m.fs_type}; {f.dsync_rate} synchronous 8 kB writes per second there "
      "(`dd oflag=dsync`, one writer: what a commit's flush costs)")
    w(f"- PostgreSQL {f.pg_version}, one server on loopback (and a second, the other shard of (g)), "
      "max_connections=200, max_prepared_transactions=200, every autovacuum logged, otherwise defaults")
    w(f"- SQLite {m.sqlite_version}; librdkafka {m.rdkafka_version}; saga-broker (librdkafka's mock cluster, "
      f"{PARTITIONS} partitions);")
    w("  Apache Kafka 3.9.1, one KRaft node (tools/kafka/kafka.sh; JVM heap 256-512 MiB), topics of "
      f"{PARTITIONS} partitions, replication 1")
    w("- binaries: Release build (`./dev bench` builds into build-release/)")
    w(f"- load average when the bench started: {m.load_at_start}")
    if drift is not None:
        w("- the host's speed: CPU s per 1,000 plain ACID transfers ((a)'s script, uniform, "
          f"{SPEED_CLIENTS} clients, {o.probe_s} s of pgbench) at the start of each phase: "
          + ", ".join(f"{phase} {cpu:.3f}" for phase, cpu in f.speed) + f"; the slowest {drift:.2f} × the fastest")
    w("")
    w("## Commands")
    w("")
    w("Per sagapool run: a fresh copy of the ledger (CREATE DATABASE ... TEMPLATE, or a copy of the")
    w("SQLite file), a fresh broker and worker pool; `<...>` are the run's own values.")
    w("")
    pgbench = (f"pgbench -n -M prepared -c <best> -j <min(best, nproc)> -T {o.pgbench_s} -D zipf=<0|1> "
               f"-D naccounts={ACCOUNTS} -l -f")
    w("```sh")
    w(f"sagactl --store <store> init && sagactl --store <store> accounts import accounts.csv   "
      f"# {ACCOUNTS} accounts acct-0..acct-{ACCOUNTS - 1}")
    w(f"psql -v naccounts={ACCOUNTS} -v balance={BALANCE} -f bench/tables.sql                  # the baselines' tables")
    w(f"{pgbench} bench/plain_transfer.sql   # (a)")
    w(f"{pgbench} bench/tpc_transfer.sql     # (b)")
    w(f"saga-broker --partitions {PARTITIONS} --bootstrap-file <file>   "
      "# or, for the real-Kafka rows, once for the bench:")
    w("tools/kafka/kafka.sh configure --brokers 1 --dir <dir> && tools/kafka/kafka.sh node --dir <dir> --node 1")
    w(f"tools/kafka/kafka.sh topics --bootstrap <bootstrap> --partitions {PARTITIONS} --replication 1 "
      "transfers.requests transfers.results transfers.dlq")
    w("saga-worker --brokers <bootstrap> --group bench --store <postgresql://...|sqlite:...> --worker-id bench-<i> "
      "--metrics-addr 127.0.0.1:<port> --lease 10s   # × workers")
    w("  # (g): --store <shard 0's database> --store <shard 1's>, on two servers, for sagactl and the workers alike")
    w(f"saga-producer --brokers <bootstrap> --generate <N> --accounts {ACCOUNTS} --seed <run> --invalid-ratio 0 "
      "--overdraw-ratio 0 --unknown-ratio 0   # Zipf")
    w("saga-producer --brokers <bootstrap> --file uniform.jsonl   # uniform: N valid requests, accounts drawn "
      "uniformly (awk, seed 7)")
    w(f"saga-producer ... --rate <half of the median Zipf transfers/s on the same broker>   # half load, for {o.half_s} s "
      f"(on saga-broker at most {thousands(MOCK_HALF_LOAD_MAX)} requests)")
    w("prometheus --config.file <scrape_interval 1s; file_sd: the run's workers>   # once for the bench")
    w("sagactl --store <store> audit   # after the workers drained (SIGTERM, exit 0)")
    w(f"bench/sqlite_floor.py <copy of the SQLite ledger> --accounts {ACCOUNTS} --transfers <N> "
      "--batch <B> --dist <uniform|zipf> [--account-index]   # (f)")
    w(f"psql -v naccounts={ACCOUNTS} -v batch={PG_FLOOR_BATCH} -f bench/pg_floor_batches.sql   "
      "# (h), on a copy of the ledger")
    w(f"pgbench -n -c <1|2|4|8> -j <min(c, nproc)> -T {o.pgbench_s} -D home=1 -f bench/pg_floor.sql   "
      "# (h), each on a fresh copy of that")
    w(f"psql -v naccounts={ACCOUNTS} -v batch={PG_FLOOR_BATCH} -f bench/pg_floor_shards_batches.sql   "
      "# (gf), on a copy of the ledger or of each shard")
    w(f"pgbench -n -c <{2 * o.workers} | {o.workers} on each server> -T {o.pgbench_s} -D home=<1 on the first, "
      "0 on the second> -f bench/pg_floor.sql   # (gf), at once on each server, on fresh copies")
    w("```")
    w("")
    w(f"Run as: `./dev bench{''.join(' ' + a for a in o.args)}`.")
    w("")
    w("## Every run")
    w("")
    w(f"| config | run | transfers/s | p50 ms | p99 ms | p50 / p99 ms after {STEADY_AFTER_MS} ms | CPU s / 1k | "
      "worker peak RSS MiB | s | last ÷ first third | scrapes/s | cores busy |")
    w("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results.rows:
        steady = "–" if r.s50 == "-" else f"{r.s50} / {r.s99}"
        rss = "–" if r.rss == "-" else f"{int(r.rss) / 1024:.0f}"
        more = " | ".join("–" if v == "-" else v for v in (r.secs, r.third, r.scraped, r.busy))
        w(f"| {r.config} | {r.rep} | {r.tput} | {r.p50} | {r.p99} | {steady} | {r.cpu} | {rss} | {more} |")
    w("")
    w(MARKER)
    w(hand_written(existing))
    return "\n".join(out) + "\n"


def write(path: Path, results: Results, facts: Facts) -> None:
    """Writes the report over path, keeping its hand-written part."""
    existing = path.read_text() if path.exists() else None
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(render(results, facts, existing))
    tmp.replace(path)


def chart_lines(results: Results) -> list[str]:
    """gnuplot's data for bench/throughput.gp: "label" transfers/s group,
    one bar a configuration, group 1 = (a) ... 7 = (g) for its colour."""
    lines = []
    for config in CONFIGS:
        if not results.of(config):
            continue
        kind, _, rest = config.partition("-")
        if kind == "e":
            label = f"e: {rest} worker{'' if rest == '1' else 's'}"
        elif kind in ("f", "fx", "fi"):
            label = f"f: {rest}, {(FLOOR_BATCH_MAX if kind == 'fx' else WORKER_BATCH) // 1000}k/commit" + (
                ", schema 3" if kind == "fi" else "")
        elif kind == "g":
            label = "g: 2 shards, Kafka"
        elif kind == "gf":
            label = f"gf: floor, {rest} server{'' if rest == '1' else 's'}"
        elif kind == "h":
            label = f"h: PG floor, {rest} at a time"
        elif kind.endswith("k"):
            label = f"{kind[0]}: {rest}, Kafka"
        else:
            label = f"{kind}: {rest}"
        lines.append(f'"{label}" {results.median(config, "tput")} {ord(config[0]) - 96}')
    return lines


def chart(results: Results, facts: Facts, script: Path, work: Path, out: Path) -> None:
    data = work / "throughput.dat"
    data.write_text("".join(line + "\n" for line in chart_lines(results)))
    subtitle = (f"{ACCOUNTS} accounts, {facts.machine.cpus} CPUs, median of {facts.opts.reps}; "
                f"e on {facts.opts.scale_name}, zipf")
    try:
        done = subprocess.run(["gnuplot", "-e", f"datafile='{data}'; outfile='{out / 'throughput.png'}'; "
                               f"subtitle='{subtitle}'", str(script)], capture_output=True, text=True)
    except FileNotFoundError:
        note("no chart: gnuplot is not installed (Debian package gnuplot-nox)")
        return
    if done.returncode != 0:
        (work / "gnuplot.log").write_text(done.stderr)
        note(f"gnuplot failed: {(done.stderr.strip().splitlines() or [''])[-1]}")
