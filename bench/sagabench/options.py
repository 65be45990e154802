"""The command line and the sizes it picks: flags, defaults, what --quick
shrinks, and the time budget from SAGA_BENCH_BUDGET_S."""
import dataclasses
import re

ACCOUNTS = 100_000
BALANCE = 1_000_000_000_000  # per account: no run can overdraw one, even under Zipf
PARTITIONS = 12
STEADY_AFTER_MS = 2000  # steady-state latency leaves out the requests of a run's first 2 s
# sagapool run sizes: what a store finishes in about RUN_S seconds, measured
# by a CALIBRATE_N-transfer run (for the real-Kafka runs, by the median of
# the store's saga-broker runs when that is faster), within
# TRANSFERS_MIN..TRANSFERS_MAX. The
# targets ask for sustained runs: SUSTAINED_S seconds or 1,000,000
# transfers at least; RUN_S leaves room for a calibration run that is slower
# than the long ones. The cap is above 1,000,000 so that a fast store still
# runs about RUN_S: at 35,000/s a million took 28 s, and its thirds' rates
# varied by 0.3 between repeats of one configuration (bench/REPORT.md, "The
# twenty-second session").
SUSTAINED_S = 60
RUN_S = 75
CALIBRATE_N = 50_000
TRANSFERS_MIN = 20_000
TRANSFERS_MAX = 3_000_000
MOCK_TRANSFERS_MAX = 150_000  # saga-broker's retention: see Bench.mock_n
# A half-load run, paced, reaches saga-broker in smaller message sets, and
# the mock keeps at most 100,000 a partition: 961,520 Zipf requests fitted
# (48,076/s for 20 s), 1,014,880 did not (the thirty-eighth session).
MOCK_HALF_LOAD_MAX = 800_000


def half_load_n(rate: int, seconds: int, broker: str) -> int:
    """Requests of a half-load run: `seconds` of `rate`, on saga-broker at
    most what its retention keeps."""
    n = max(rate * seconds, 1000)
    return min(n, MOCK_HALF_LOAD_MAX) if broker == "mock" else n


def run_size(rate: float) -> int:
    """Transfers a store finishes in about RUN_S seconds at `rate`, within
    TRANSFERS_MIN..TRANSFERS_MAX."""
    return min(max(int(rate * RUN_S / 1000) * 1000, TRANSFERS_MIN), TRANSFERS_MAX)


# The floor (f) commits as many transfers at once as a worker does at full
# load: 5,000 (saga-worker's --batch-size default, workers/include/sagapool/
# worker.hpp; a SQLite worker's before the thirtieth session), and 10,000
# (its limit, and its default on one SQLite store, workers/src/main.cpp);
# bench/tests/test_options.py checks them against the worker's source.
WORKER_BATCH = 5000
FLOOR_BATCH_MAX = 10_000
# saga-worker's --store-lanes default on one PostgreSQL store: a batch runs
# as that many transactions side by side (workers/src/main.cpp).
PG_LANES = 2
# The PostgreSQL floor (h) writes a lane's share of such a batch per
# transaction, with as many transactions in flight as (e)'s 1, 2 and 4
# workers have (PG_LANES each), and one alone.
PG_FLOOR_BATCH = WORKER_BATCH // PG_LANES
PG_FLOOR_CLIENTS = (1, 2, 4, 8)
# (e)'s pool sizes, in the order they run and the target compares them.
SCALE_WORKERS = (1, 2, 4)
# The host's speed, taken at each phase's start: CPU per (a) transfer, uniform,
# with this many pgbench clients.
SPEED_CLIENTS = 8

# Seconds the bench may take (the build comes on top); past a phase's share,
# its later repetitions are skipped, and the report says so.
BUDGET_S = 5400
QUICK_BUDGET_S = 300

_POSITIVE = re.compile(r"[1-9][0-9]*")
_VALUED = ("--reps", "--transfers", "--workers", "--clients", "--scale-store", "--out")


class UsageError(Exception):
    """A flag the bench does not take, or a value it cannot use (exit 2)."""


@dataclasses.dataclass
class Options:
    quick: bool = False
    reps: int = 3
    transfers: int | None = None  # None: calibrated per store
    workers: int = 2
    clients: tuple[int, ...] = (2, 4, 8, 16, 32, 64)
    scale_store: str = "sqlite"
    out: str | None = None
    keep: bool = False
    args: tuple[str, ...] = ()  # as given, for the report's "Run as"
    # seconds: client-count probes, measured pgbench runs, half-load runs
    probe_s: int = 2
    pgbench_s: int = 8
    half_s: int = 20
    warmup_n: int = 2000  # per sagapool run, before the measured transfers
    budget_s: int = BUDGET_S

    @property
    def clients_text(self) -> str:
        return " ".join(str(c) for c in self.clients)

    @property
    def scale_name(self) -> str:
        return "PostgreSQL" if self.scale_store == "postgres" else "SQLite"


def parse(argv: list[str], env: dict[str, str]) -> Options:
    """Options from the flags after BIN_DIR; raises UsageError."""
    given: dict[str, str] = {}
    opts = Options(args=tuple(argv))
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag == "--quick":
            opts.quick = True
        elif flag == "--keep":
            opts.keep = True
        elif flag in _VALUED:
            if i + 1 >= len(argv):
                raise UsageError(f"{flag} needs a value")
            i += 1
            given[flag] = argv[i]
        else:
            raise UsageError(f"unknown option {flag}")
        i += 1

    # --quick: small sizes and one repetition; explicit flags still win.
    if opts.quick:
        opts.reps, opts.transfers, opts.clients = 1, 5000, (4, 16)
        opts.probe_s, opts.pgbench_s, opts.half_s, opts.warmup_n = 1, 2, 4, 1000
        opts.budget_s = QUICK_BUDGET_S
    opts.scale_store = given.get("--scale-store", opts.scale_store)
    if opts.scale_store not in ("sqlite", "postgres"):
        raise UsageError("--scale-store takes sqlite or postgres")
    for flag in ("--reps", "--workers", "--transfers"):
        if flag in given:
            if not _POSITIVE.fullmatch(given[flag]):
                raise UsageError(f"{flag} takes a positive integer")
            setattr(opts, flag[2:], int(given[flag]))
    if "--clients" in given:
        words = given["--clients"].split()
        if not words or not all(_POSITIVE.fullmatch(w) for w in words):
            raise UsageError('--clients takes positive integers, as in "1 2 4"')
        opts.clients = tuple(int(w) for w in words)
    opts.out = given.get("--out")
    budget = env.get("SAGA_BENCH_BUDGET_S", "")
    if budget:  # empty counts as unset
        if not budget.isdigit():
            raise UsageError("SAGA_BENCH_BUDGET_S takes a whole number of seconds")
        opts.budget_s = int(budget)
    return opts
