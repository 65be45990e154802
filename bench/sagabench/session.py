"""The bench's lifetime: its temporary folder, every process and server it
starts, and their end. Whatever way the bench ends (done, failed, Ctrl-C,
SIGTERM), each process is stopped and each server shut down; the folder is
kept when asked (--keep) or when the bench failed, else removed."""
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Protocol

from .console import Fatal, Stopped


class Server(Protocol):
    def stop(self) -> None: ...


class Processes:
    """The processes started and not yet waited for."""

    def __init__(self) -> None:
        self._live: list[subprocess.Popen] = []

    def start(self, argv: list, log: Path, **kwargs) -> subprocess.Popen:
        """Starts argv with stdout and stderr into log."""
        with open(log, "ab") as out:
            proc = subprocess.Popen([str(a) for a in argv], stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT, **kwargs)
        self._live.append(proc)
        return proc

    def wait(self, proc: subprocess.Popen, timeout: float | None = None) -> int:
        """Its exit status once it exits (TimeoutExpired after timeout)."""
        code = proc.wait(timeout)
        self._live.remove(proc)
        return code

    def wait_with_usage(self, proc: subprocess.Popen):
        """Its exit status and resource usage (wait4: its own user and
        system time, and that of its children it reaped)."""
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        self._live.remove(proc)
        return proc.returncode, usage

    def stop(self, procs: list[subprocess.Popen], grace_s: float = 30) -> None:
        """SIGTERM, up to grace_s to exit (a worker whose broker is gone may
        take long to leave its group), then SIGKILL. Popen signals only a
        process it has not reaped, so a reused pid is never hit."""
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + grace_s
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.1)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc in self._live:
                self._live.remove(proc)

    def stop_all(self) -> None:
        self.stop(list(self._live))


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(used: tuple[int, ...] = (), low: int = 20000, high: int = 32000) -> int:
    """A free loopback port in [low, high), not one of used. The default
    range stays below Linux's ephemeral ports (32768 and up), which client
    sockets take."""
    for _ in range(50):
        port = random.randrange(low, high)
        if port not in used and port_free(port):
            return port
    raise Fatal("no free port found")


def _stop_on_signal(signum, _frame):
    raise Stopped(128 + signum)


class Session:
    """`with Session(keep) as s:` the folder s.work, s.procs, s.servers."""

    def __init__(self, keep: bool) -> None:
        self.keep = keep
        self.work = Path(tempfile.mkdtemp(prefix="sagapool-bench-"))
        self.procs = Processes()
        self.servers: list[Server] = []

    def __enter__(self) -> "Session":
        signal.signal(signal.SIGINT, _stop_on_signal)
        signal.signal(signal.SIGTERM, _stop_on_signal)
        return self

    def __exit__(self, kind, exc, _tb) -> bool:
        # A second Ctrl-C must not cut the cleanup short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            self.procs.stop_all()
            for server in reversed(self.servers):
                server.stop()
        finally:
            failed = exc is not None and not isinstance(exc, Stopped)
            if self.keep or failed:
                print(f"bench files kept in {self.work}", file=sys.stderr)
            else:
                shutil.rmtree(self.work, ignore_errors=True)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        return False


def run_checked(argv: list, what: str, log: Path | None = None, **kwargs) -> str:
    """Runs argv to its end; its stdout, or Fatal(`what failed`) after
    showing its output. With log, the output goes there instead."""
    argv = [str(a) for a in argv]
    if log is not None:
        with open(log, "ab") as out:
            code = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=subprocess.STDOUT, **kwargs).returncode
        if code != 0:
            print(Path(log).read_text(errors="replace")[-4000:], file=sys.stderr, end="")
            raise Fatal(f"{what} failed")
        return ""
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, **kwargs)
    if done.returncode != 0:
        print(done.stdout + done.stderr, file=sys.stderr, end="")
        raise Fatal(f"{what} failed")
    return done.stdout


def nproc() -> int:
    return len(os.sched_getaffinity(0))
