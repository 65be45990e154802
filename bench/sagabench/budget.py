"""The time budget: once a phase is past its share, its repetitions after
the first are skipped, and the report says which."""
import time
from typing import Callable

from .console import note


class Budget:
    def __init__(self, started: float, seconds: int, clock: Callable[[], float] = time.time):
        self.started, self.seconds, self.clock = started, seconds, clock
        self.t0 = self.left = 0.0
        self.skipped: list[str] = []

    def share_out(self) -> None:
        """From now on, what is left of the budget is shared out by phase_end."""
        self.t0 = self.clock()
        self.left = max(0.0, self.started + self.seconds - self.t0)

    def phase_end(self, percent: int) -> float:
        """When a phase must end: at `percent` of what was left at share_out."""
        return self.t0 + self.left * percent // 100

    def rep_ok(self, rep: int, deadline: float, what: str) -> bool:
        """The first run always; later ones while the phase has time left."""
        if rep == 1 or self.clock() < deadline:
            return True
        note(f"skipping run {rep} of {what} and later: past this phase's share of the {self.seconds} s budget")
        self.skipped.append(f"{what} from run {rep}")
        return False
