"""The servers a bench runs on: one throwaway PostgreSQL server, a real
one-node Kafka (tools/kafka/kafka.sh), saga-broker (librdkafka's mock
cluster) and Prometheus. Every one listens on loopback only, and the
session stops it."""
import json
import os
import pwd
import re
import secrets
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

from . import measure
from .console import Fatal, note, show_tail
from .session import Processes, free_port, run_checked


def _postgres_bin() -> Path:
    """SAGA_PG_BIN_DIR, else the newest /usr/lib/postgresql/<version>/bin."""
    given = os.environ.get("SAGA_PG_BIN_DIR")
    found = [given] if given else sorted(
        (str(p) for p in Path("/usr/lib/postgresql").glob("*/bin")),
        key=lambda p: [int(x) for x in re.findall(r"\d+", Path(p).parent.name)] or [0])[-1:]
    if not found or not os.access(Path(found[0]) / "postgres", os.X_OK):
        raise Fatal("PostgreSQL server programs not found under /usr/lib/postgresql/<version>/bin"
                    " (install Debian's postgresql package, or set SAGA_PG_BIN_DIR)")
    return Path(found[0])


class Postgres:
    """A PostgreSQL server in WORK/NAME, on a free loopback port, with
    database `sagapool`. It refuses to run as root, so as root it runs as the
    `postgres` system user (Debian's package creates it), else `nobody`.
    Trust on its own unix socket, scram-sha-256 over TCP; the password
    reaches every client (workers, sagactl, psql, pgbench) through the
    pgpass file PGPASSFILE names, never a flag or a log line."""

    def __init__(self, work: Path, name: str, options: list[str]):
        self.bin = _postgres_bin()
        self.dir = work / name
        self.options = options
        self.port = 0
        self._as: list[str] = []
        self._user: pwd.struct_passwd | None = None
        self.pgpass = work / "pgpass"
        if os.geteuid() == 0:
            try:
                self._user = pwd.getpwnam("postgres")
            except KeyError:
                self._user = pwd.getpwnam("nobody")
            self._as = ["runuser", "-u", self._user.pw_name, "--"]
            os.chmod(work, 0o711)  # the server's user must reach its folder inside
        os.environ["PGPASSFILE"] = str(self.pgpass)
        self.pgpass.touch(mode=0o600)

    def _as_server(self, argv: list, log: Path) -> bool:
        with open(log, "ab") as out:
            return subprocess.run(self._as + [str(a) for a in argv], cwd="/", stdin=subprocess.DEVNULL,
                                  stdout=out, stderr=subprocess.STDOUT).returncode == 0

    def start(self) -> None:
        data, sockets = self.dir / "data", self.dir / "socket"
        for d in (data, sockets):
            d.mkdir(parents=True)
            d.chmod(0o700)
        password = secrets.token_hex(16)
        pwfile = self.dir / "pwfile"
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(password + "\n")
        if self._user:
            for path in [self.dir, *self.dir.rglob("*")]:
                os.chown(path, self._user.pw_uid, self._user.pw_gid)
        ok = self._as_server([self.bin / "initdb", "-D", data, "-U", "saga", f"--pwfile={pwfile}",
                              "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8",
                              "--locale=C", "--no-sync"], self.dir / "initdb.log")
        pwfile.unlink()
        if not ok:
            show_tail(self.dir / "initdb.log", lines=20)
            raise Fatal("initdb failed")
        # A port free a moment ago can be taken when the server binds it: try a few.
        for _ in range(5):
            port = free_port(low=20000, high=50000)
            server_opts = " ".join([f"-h 127.0.0.1 -p {port} -k {sockets}", *self.options])
            if self._as_server([self.bin / "pg_ctl", "-D", data, "-l", self.dir / "server.log", "-w",
                                "-t", "60", "-s", "start", "-o", server_opts], self.dir / "pg_ctl.log"):
                break
        else:
            show_tail(self.dir / "server.log", self.dir / "pg_ctl.log", lines=20)
            raise Fatal(f"the PostgreSQL server in {self.dir} did not start")
        self.port = port
        with open(self.pgpass, "a") as f:
            f.write(f"127.0.0.1:{port}:*:saga:{password}\n")
        run_checked([self.bin / "createdb", "-h", "127.0.0.1", "-p", port, "-U", "saga", "sagapool"],
                    "creating the database", log=self.dir / "pg_ctl.log")

    def stop(self) -> None:
        """Fast shutdown, immediate if that hangs."""
        data = self.dir / "data"
        if not (data / "postmaster.pid").exists():
            return
        log = self.dir / "pg_ctl.log"
        if not self._as_server([self.bin / "pg_ctl", "-D", data, "-m", "fast", "-t", "20", "-s", "stop"], log):
            self._as_server([self.bin / "pg_ctl", "-D", data, "-m", "immediate", "-t", "10", "-s", "stop"], log)

    def url(self, database: str) -> str:
        return f"postgresql://saga@127.0.0.1:{self.port}/{database}"

    def psql(self, database: str, *commands: str) -> str:
        """The unaligned, header-less output of commands, run in order."""
        argv = [self.bin / "psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", self.url(database)]
        for command in commands:
            argv += ["-c", command]
        return run_checked(argv, f"psql ({commands[0][:60]})").strip()

    def version(self) -> str:
        out = run_checked([self.bin / "postgres", "--version"], "postgres --version").strip()
        return out.removeprefix("postgres (PostgreSQL) ")

    def ticks(self) -> int:
        """CPU ticks of the server: the postmaster and its children."""
        postmaster = int((self.dir / "data" / "postmaster.pid").read_text().split()[0])
        return measure.proc_tree_ticks(postmaster)


class Kafka:
    """The bench's real Kafka: one KRaft node (replication 1: one machine)
    and the three topics, started once, on first use."""

    def __init__(self, root: Path, work: Path, procs: Processes, partitions: int):
        self.script = root / "tools" / "kafka" / "kafka.sh"
        self.dir = work / "kafka"
        self.procs = procs
        self.partitions = partitions
        self.proc: subprocess.Popen | None = None
        self.bootstrap = ""

    def start(self) -> None:
        if self.proc:
            return
        run_checked([self.script, "configure", "--brokers", "1", "--dir", self.dir],
                    "tools/kafka/kafka.sh configure", log=self.dir.parent / "kafka-configure.log")
        self.bootstrap = (self.dir / "bootstrap").read_text().strip()
        log = self.dir / "node-1.log"
        # kafka.sh node execs the JVM: this pid is the broker's.
        self.proc = self.procs.start([self.script, "node", "--dir", self.dir, "--node", "1"], log)
        for _ in range(120):
            if subprocess.run(["kcat", "-b", self.bootstrap, "-L", "-m", "2"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL).returncode == 0:
                break
            time.sleep(0.5)
        topics = subprocess.run([str(self.script), "topics", "--bootstrap", self.bootstrap, "--partitions",
                                 str(self.partitions), "--replication", "1", "transfers.requests",
                                 "transfers.results", "transfers.dlq"], stdout=2)
        if topics.returncode != 0:
            show_tail(log)
            raise Fatal("Kafka did not start")


def start_saga_broker(procs: Processes, bin_dir: Path, run: Path, partitions: int) -> tuple[subprocess.Popen, str]:
    """A fresh saga-broker for one run: its process and bootstrap servers."""
    bootstrap = run / "bootstrap"
    proc = procs.start([bin_dir / "saga-broker", "--partitions", partitions, "--bootstrap-file", bootstrap],
                       run / "broker.log")
    for _ in range(100):
        if bootstrap.exists() and bootstrap.stat().st_size > 0:
            return proc, bootstrap.read_text().strip()
        time.sleep(0.1)
    show_tail(run / "broker.log")
    raise Fatal("saga-broker did not start")


class Prometheus:
    """A real Prometheus scraping every worker of the run under way once a
    second, as the targets ask: started once, on first use; each run names
    its workers in a file Prometheus watches (file-based discovery, applied
    within its 5 s update interval, before a run's warm-up is over)."""

    def __init__(self, work: Path, procs: Processes):
        self.dir = work / "prometheus"
        self.procs = procs
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self) -> None:
        if self.proc:
            return
        self.dir.mkdir()
        self.targets = self.dir / "workers.json"
        self.targets.write_text("[]")
        config = self.dir / "prometheus.yml"
        config.write_text("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
                          "scrape_configs:\n  - job_name: saga-worker\n    file_sd_configs:\n"
                          f"      - files: ['{self.targets}']\n")
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        log = self.dir / "prometheus.log"
        self.proc = self.procs.start(["prometheus", f"--config.file={config}",
                                      f"--storage.tsdb.path={self.dir / 'data'}",
                                      f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"], log)
        for _ in range(60):
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        show_tail(log)
        raise Fatal("Prometheus did not start")

    def scrape(self, ports: list[int]) -> None:
        """From now on, these workers (and no others): returns once each has
        been scraped, so the measured part of a run is scraped throughout."""
        want = {f"127.0.0.1:{p}" for p in ports}
        tmp = self.targets.with_suffix(".tmp")
        tmp.write_text(json.dumps([{"targets": sorted(want)}]))
        tmp.replace(self.targets)
        for _ in range(60):
            try:
                with urllib.request.urlopen(self.url + "/api/v1/targets?state=active", timeout=5) as r:
                    active = json.load(r)["data"]["activeTargets"]
                if want <= {t["labels"]["instance"] for t in active if t.get("health") == "up"}:
                    return
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.5)
        note(f"warning: Prometheus did not scrape workers {sorted(want)} within 30 s")

    def scrapes(self, port: int, seconds: int) -> int:
        """Successful scrapes of one worker over the last `seconds`."""
        query = urllib.parse.quote(f'sum_over_time(up{{instance="127.0.0.1:{port}"}}[{max(seconds, 1)}s])')
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/query?query={query}", timeout=10) as r:
                result = json.load(r)["data"]["result"]
        except (OSError, ValueError, KeyError):
            return 0
        return int(float(result[0]["value"][1])) if result else 0
