"""The real thing the schema test runs against: one Apache Kafka node
(tools/kafka/kafka.sh, the launcher users run), a SQLite ledger made with
sagactl, and one saga-worker, all on loopback and in a temporary folder.
Everything started here is stopped on leaving the `with` block, failed or not."""
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

TOPICS = ("transfers.requests", "transfers.results", "transfers.dlq")


def die_with_parent():
    """In the child before exec: SIGTERM when this test dies, however it
    dies (a ctest timeout kills it), so the launcher still stops its node."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def free_loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    def __init__(self, source: Path, bin_dir: Path, accounts_csv: str, partitions: int = 3,
                 dlq_max_message_bytes: int = 200_000):
        self.source, self.bin = source, bin_dir
        self.accounts_csv = accounts_csv
        self.partitions = partitions
        self.dlq_max_message_bytes = dlq_max_message_bytes
        self.dir = Path(tempfile.mkdtemp(prefix="sagapool-schemas."))
        self.store = f"sqlite:{self.dir / 'ledger.db'}"
        self.bootstrap = ""
        self._kafka = None
        self._worker = None

    def __enter__(self):
        try:
            self._start_kafka()
            self._create_topics()
            self._make_ledger()
            self._start_worker()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        if self._worker and self._worker.poll() is None:
            self._worker.kill()
            self._worker.wait()
        self._stop_kafka()
        shutil.rmtree(self.dir, ignore_errors=True)
        return False

    def log(self, name: str, tail: int = 4000) -> str:
        path = self.dir / name
        return path.read_text(errors="replace")[-tail:] if path.exists() else f"({name}: none)"

    # --- Kafka: the launcher prints "bootstrap: HOST:PORT" once the node is live.
    def _start_kafka(self):
        out = open(self.dir / "kafka.log", "w")
        self._kafka = subprocess.Popen(
            [str(self.source / "tools/kafka/kafka.sh"), "run", "--brokers", "1", "--dir", str(self.dir / "kafka")],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for line in (self.dir / "kafka.log").read_text().splitlines():
                if line.startswith("bootstrap: "):
                    self.bootstrap = line.split(" ", 1)[1].strip()
                    return
            if self._kafka.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"Kafka did not start:\n{self.log('kafka.log')}")

    def _stop_kafka(self):
        if not self._kafka:
            return
        if self._kafka.poll() is None:
            self._kafka.terminate()  # the launcher stops its node and waits for it
            try:
                self._kafka.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self._kafka.pid, signal.SIGKILL)  # the group this class started
                self._kafka.wait()
        self._kafka = None

    def _create_topics(self):
        # A small dead-letter topic, so the worker's truncated form shows up too.
        dlq = {"max.message.bytes": str(self.dlq_max_message_bytes)}
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        futures = admin.create_topics([NewTopic(t, self.partitions, 1, config=dlq if t == "transfers.dlq" else {})
                                       for t in TOPICS])
        for f in futures.values():
            f.result(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            md = admin.list_topics(timeout=5).topics
            if all(t in md and len(md[t].partitions) == self.partitions
                   and all(p.leader >= 0 for p in md[t].partitions.values()) for t in TOPICS):
                return
            time.sleep(0.2)
        raise RuntimeError("topics have no leaders after 30 s")

    def _make_ledger(self):
        (self.dir / "accounts.csv").write_text(self.accounts_csv)
        for args in (["init"], ["accounts", "import", str(self.dir / "accounts.csv")]):
            r = subprocess.run([str(self.bin / "sagactl"), "--store", self.store, *args],
                               capture_output=True, text=True, timeout=60)
            if r.returncode != 0:
                raise RuntimeError(f"sagactl {' '.join(args)}: {r.stdout}{r.stderr}")

    def _start_worker(self):
        self._worker = subprocess.Popen(
            [str(self.bin / "saga-worker"), "--brokers", self.bootstrap, "--group", "schemas", "--store", self.store,
             "--worker-id", "w0", "--metrics-addr", f"127.0.0.1:{free_loopback_port()}"],
            stdout=open(self.dir / "worker.log", "w"), stderr=subprocess.STDOUT, preexec_fn=die_with_parent)

    def stop_worker(self) -> int:
        """SIGTERM: the worker drains and exits 0."""
        self._worker.terminate()
        try:
            return self._worker.wait(30)
        except subprocess.TimeoutExpired:
            self._worker.kill()
            return self._worker.wait()

    # --- Reading topics whole
    def consumer(self) -> Consumer:
        return Consumer({"bootstrap.servers": self.bootstrap, "group.id": "schemas-reader",
                         "enable.auto.commit": False, "fetch.max.bytes": 4 << 20})

    def read_all(self, consumer: Consumer, topic: str, since: dict) -> list:
        """Every message of `topic` from the offsets in `since` ((partition) ->
        next offset, updated) up to the end offsets as of now."""
        out = []
        for p in range(self.partitions):
            start = since.setdefault((topic, p), 0)
            end = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            if end <= start:
                continue
            consumer.assign([TopicPartition(topic, p, start)])
            while since[(topic, p)] < end:
                m = consumer.poll(15.0)
                if m is None:
                    raise RuntimeError(f"{topic}[{p}]: nothing read at offset {since[(topic, p)]} of {end}")
                if m.error():
                    continue
                out.append(m)
                since[(topic, p)] = m.offset() + 1
        return out
