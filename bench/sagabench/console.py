"""Progress messages on stderr, and the two ways a bench ends early."""
import sys
from pathlib import Path


class Fatal(Exception):
    """The bench failed: it says why, keeps its files for a look, exits 1."""


class Stopped(BaseException):
    """SIGINT or SIGTERM: everything is stopped, the files removed, and the
    bench exits 128 + the signal. A BaseException, so that no `except
    Exception` on the way swallows it."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def say(message: str) -> None:
    print(f"\033[1m==> {message}\033[0m", file=sys.stderr, flush=True)


def note(message: str) -> None:
    print(f"    {message}", file=sys.stderr, flush=True)


def error(message: str) -> None:
    print(f"\033[1;31mbench: {message}\033[0m", file=sys.stderr, flush=True)


def show_tail(*paths: Path, lines: int = 10) -> None:
    """The last lines of logs, on stderr, before a Fatal that names them."""
    for path in paths:
        try:
            text = Path(path).read_text(errors="replace").splitlines()
        except OSError:
            continue
        if len(paths) > 1:
            print(f"==> {path} <==", file=sys.stderr)
        print("\n".join(text[-lines:]), file=sys.stderr, flush=True)
