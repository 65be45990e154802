"""What the report says of the machine: CPUs, memory, kernel, the file
system under the bench's folder and how fast it makes a small write
durable, and the versions of the libraries the programs use."""
import dataclasses
import os
import re
import sqlite3
import subprocess
from pathlib import Path

from .measure import dd_seconds
from .session import nproc


@dataclasses.dataclass
class Machine:
    cpus: int
    cpu_model: str
    mem_gib: str
    kernel: str
    fs_type: str
    load_at_start: str
    sqlite_version: str
    rdkafka_version: str
    sqlite_journal: str  # as the SQLite store configures it
    sqlite_sync: str


def mount_type(mounts: str, path: str) -> str:
    """The file system type of path, from /proc/mounts text: that of the
    longest mount point above it."""
    best, kind = "", "?"
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = path == point or path.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def _first(pattern: str, text: str, default: str = "?") -> str:
    m = re.search(pattern, text, re.M)
    return m.group(1) if m else default


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def dsync_writes_per_s(folder: Path) -> str:
    """How many synchronous 8 kB writes a second the disk under folder takes
    (`dd oflag=dsync`, one writer): every commit waits for one."""
    target = folder / "dsync-test"
    done = subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=8k", "count=300", "oflag=dsync"],
                          capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"})
    target.unlink(missing_ok=True)
    seconds = dd_seconds(done.stderr)
    return f"{300 / seconds:.0f}" if seconds else "?"


def describe(root: Path, work: Path, load_at_start: str) -> Machine:
    try:
        store_source = (root / "store/sqlite/src/sqlite_store.cpp").read_text()
    except OSError:
        store_source = ""
    try:
        rdkafka = subprocess.run(["pkg-config", "--modversion", "rdkafka"], capture_output=True, text=True)
    except FileNotFoundError:
        rdkafka = subprocess.CompletedProcess([], 1, "", "")
    mem_kb = int(_first(r"^MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text(), "0"))
    return Machine(
        cpus=nproc(),
        cpu_model=_first(r"^model name\s*: (.*)$", Path("/proc/cpuinfo").read_text(), ""),
        mem_gib=f"{mem_kb / 1048576:.0f}",
        kernel=os.uname().release,
        fs_type=mount_type(Path("/proc/mounts").read_text(), str(work.resolve())),
        load_at_start=load_at_start,
        # the library Python's sqlite3 module links: Debian's libsqlite3, as the workers' is
        sqlite_version=sqlite3.sqlite_version,
        rdkafka_version=rdkafka.stdout.strip() if rdkafka.returncode == 0 else "?",
        sqlite_journal=_first(r"PRAGMA journal_mode=([A-Z]*)", store_source),
        sqlite_sync=_first(r"PRAGMA synchronous=([A-Z]*)", store_source))
