"""Figures from raw text: /proc's stat and status files, pgbench's output
and logs, dd's report, a run's (requested, finished) times. The parsers are
pure; the few readers of /proc sit next to them."""
import dataclasses
import os
import re
import time
from pathlib import Path
from typing import Iterable, Sequence


def median(values: Iterable[str | float]) -> str | float | None:
    """The middle value (the lower middle of an even count), as given; None
    when there is none."""
    ordered = sorted(values, key=float)
    return ordered[(len(ordered) - 1) // 2] if ordered else None


def pick(ordered: Sequence, percent: int):
    """The value at `percent` of a sorted list, as `ORDER BY ... OFFSET
    n * percent / 100` picks it."""
    return ordered[len(ordered) * percent // 100]


def finished_total(metrics: str) -> int:
    """saga_transfers_finished_total summed over its label sets, from a
    worker's /metrics text (Prometheus' text format)."""
    return sum(int(float(m.group(1))) for m in
               re.finditer(r"^saga_transfers_finished_total(?:\{[^}]*\})? (\S+)$", metrics, re.M))


# ---- CPU and memory, from /proc ---------------------------------------------

def stat_ticks(text: str) -> tuple[int, int, int]:
    """(pid, parent pid, CPU ticks) of a /proc/PID/stat line. The ticks are
    user + system time of the process and of its children already reaped.
    The command name may hold spaces and parentheses: fields are counted
    after its last ") "."""
    pid = int(text.split(None, 1)[0])
    fields = text[text.rindex(") ") + 2:].split()
    # fields[0] is the state; 1 the parent; 11..14 utime, stime, cutime, cstime
    return pid, int(fields[1]), sum(int(f) for f in fields[11:15])


def tree_ticks(stats: Iterable[str], root: int) -> int:
    """CPU ticks of a process and its live children. The PostgreSQL server
    is the postmaster, whose children (backends, checkpointer, WAL writer,
    autovacuum) add their times to it when they exit."""
    total = 0
    for text in stats:
        pid, parent, ticks = stat_ticks(text)
        if root in (pid, parent):
            total += ticks
    return total


def vm_hwm_kb(status: str) -> int:
    """Peak resident set size (VmHWM) in kB from /proc/PID/status text."""
    m = re.search(r"^VmHWM:\s+(\d+)", status, re.M)
    return int(m.group(1)) if m else 0


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:  # the process exited meanwhile
        return ""


def proc_ticks(pid: int) -> int:
    text = _read(f"/proc/{pid}/stat")
    return stat_ticks(text)[2] if text else 0


def proc_tree_ticks(root: int) -> int:
    stats = (_read(f"/proc/{d}/stat") for d in os.listdir("/proc") if d.isdigit())
    return tree_ticks((s for s in stats if s), root)


def busy_ticks(proc_stat: str) -> int:
    """CPU ticks the whole machine spent busy, from /proc/stat's first line
    ("cpu  user nice system idle iowait irq softirq steal guest ..."): all
    but idle and iowait (guest time is inside user already)."""
    fields = [int(v) for v in proc_stat.split("\n", 1)[0].split()[1:9]]
    return sum(fields) - fields[3] - fields[4]


def machine_busy_ticks() -> int:
    return busy_ticks(_read("/proc/stat"))


class BusyCores:
    """The whole machine's busy CPU seconds per second from now on: how
    many of its cores a run kept busy, and so whether it had one to spare."""

    def __init__(self):
        self._ticks, self._t0 = machine_busy_ticks(), time.monotonic()

    def __str__(self) -> str:
        seconds = max(time.monotonic() - self._t0, 1e-3)
        return f"{(machine_busy_ticks() - self._ticks) / TICKS_PER_S / seconds:.2f}"


def proc_hwm_kb(pid: int) -> int:
    return vm_hwm_kb(_read(f"/proc/{pid}/status"))


TICKS_PER_S = os.sysconf("SC_CLK_TCK")


# ---- pgbench and dd -----------------------------------------------------------

def pgbench_result(out: str) -> tuple[float, int] | None:
    """(tps, transactions) from pgbench's summary; None without a result."""
    tps = re.search(r"^tps = ([0-9.]+) \(without initial connection time\)", out, re.M)
    n = re.search(r"^number of transactions actually processed: (\d+)", out, re.M)
    if not tps or not n or int(n.group(1)) == 0:
        return None
    return float(tps.group(1)), int(n.group(1))


def floor_cpu_per_1k(parts: Iterable[tuple[int, float]], per_transaction: int) -> float:
    """CPU seconds per 1,000 transfers of a floor whose every transaction
    runs on each of several servers, from each server's (transactions, CPU
    seconds): the sum of each one's CPU over its own transactions. A server
    that ran ahead pays for its extra transactions itself, not the ones
    every server finished."""
    return sum(cpu / (n * per_transaction) for n, cpu in parts) * 1000


def pgbench_latencies(logs: Iterable[Path]) -> tuple[str, str]:
    """p50 and p99 in ms ("%.1f", or "NaN") of pgbench's per-transaction
    logs, whose third column is a transaction's latency in microseconds."""
    micros = sorted(int(line.split()[2]) for log in logs
                    for line in log.read_text().splitlines() if line.strip())
    if not micros:
        return "NaN", "NaN"
    return f"{pick(micros, 50) / 1000:.1f}", f"{pick(micros, 99) / 1000:.1f}"


def dd_seconds(report: str) -> float | None:
    """Seconds from dd's last line ("... copied, 0.0412 s, 59.6 MB/s")."""
    m = re.search(r"copied, ([0-9.]+) s\b", report)
    return float(m.group(1)) if m else None


# ---- a sagapool run's transfers ------------------------------------------------

@dataclasses.dataclass
class RunFigures:
    seen: int  # measured transfers in the store
    done: int  # transfers in state done, the first request's too
    span_ms: int  # last terminal-state time - first counted request's timestamp
    p50: int
    p99: int
    steady_p50: int | None  # over the requests after the first steady_after_ms
    steady_p99: int | None
    first_third: int  # transfers finished in the first third of the span
    last_third: int  # and in its last third

    @property
    def transfers_per_s(self) -> str:
        return f"{self.seen * 1000 / (self.span_ms if self.span_ms > 0 else 1):.0f}"

    @property
    def sustained(self) -> str:
        """The rate over the span's last third over that of its first third."""
        return f"{self.last_third / self.first_third:.2f}" if self.first_third else "-"


def run_figures(rows: Iterable[tuple[int, int, bool]], steady_after_ms: int) -> RunFigures:
    """Figures of (requested ms, finished ms, done) rows, one a transfer.

    The first request is left out: saga-producer sends it alone and waits
    for its delivery before the rest (a fresh client's connection and
    idempotent id, at times a second), so the span would count the load
    generator's start."""
    rows = list(rows)
    if not rows:
        raise ValueError("no transfers")
    done = sum(1 for r in rows if r[2])
    if len(rows) > 1:
        del rows[rows.index(min(rows))]
    first = min(r[0] for r in rows)
    last = max(r[1] for r in rows)
    third = (last - first) / 3
    latencies = sorted(fin - req for req, fin, _ in rows)
    steady = sorted(fin - req for req, fin, _ in rows if req >= first + steady_after_ms)
    return RunFigures(
        seen=len(rows), done=done,
        span_ms=last - first,
        p50=pick(latencies, 50), p99=pick(latencies, 99),
        steady_p50=pick(steady, 50) if steady else None,
        steady_p99=pick(steady, 99) if steady else None,
        first_third=sum(1 for r in rows if r[1] <= first + third),
        last_third=sum(1 for r in rows if r[1] > last - third))
