"""The figures of every measured run, one row a run, kept as the text the
report prints ("-" where a figure does not apply)."""
import dataclasses
from pathlib import Path

from .measure import median


@dataclasses.dataclass
class Row:
    config: str  # a-uniform, c-zipf, e-4, half-d, calibrate-sqlite, ...
    rep: str
    tput: str  # transfers/s
    p50: str  # ms
    p99: str
    cpu: str  # CPU s / 1,000 transfers
    rss: str  # worker peak RSS, kB
    s50: str  # ms, requests after the first STEADY_AFTER_MS
    s99: str
    secs: str = "-"  # sagapool: first request to last outcome, s
    third: str = "-"  # sagapool: last third's rate / first third's
    scraped: str = "-"  # sagapool: Prometheus scrapes per second of its least scraped worker
    busy: str = "-"  # sagapool and the floors: the whole machine's cores busy (measure.BusyCores)


class Results:
    def __init__(self, save_to: Path | None = None):
        self.rows: list[Row] = []
        self._file = save_to  # a copy for a look at a kept folder

    def add(self, *fields) -> None:
        row = Row(*(str(f) for f in fields))
        self.rows.append(row)
        if self._file:
            with open(self._file, "a") as f:
                f.write(" ".join(dataclasses.astuple(row)) + "\n")

    def of(self, config: str) -> list[Row]:
        return [r for r in self.rows if r.config == config]

    def median(self, config: str, column: str) -> str | None:
        return median(v for r in self.of(config)
                      if (v := getattr(r, column)) not in ("-", "NaN"))

    def max(self, config: str, column: str) -> int:
        return max((int(v) for r in self.of(config) if (v := getattr(r, column)) != "-"), default=0)
