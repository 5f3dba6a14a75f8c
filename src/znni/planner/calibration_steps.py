"""A calibration as named steps, each kept as soon as it is measured, with its progress.

A step measures one thing (a primitive at one layer shape, or a group of graph primitives)
and returns a JSON value. calibrate.py writes every finished step into the machine's cache
file at once, so a calibration that is interrupted (Ctrl-C, a killed process) resumes
where it stopped. On a terminal a one-line bar says how many steps are done, what is
being measured and about how many seconds are left (the steps' estimates, scaled by how
fast the finished ones went); elsewhere the caller logs a line when it starts and ends.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

BAR_CELLS = 20
SCALE_AFTER, SCALE_BOUNDS = 0.2, (0.5, 3.0)  # seconds_left's scaling of the estimates


@dataclass(frozen=True)
class Step:
    key: str  # its name among the cache's measured steps
    label: str  # what it measures, as the progress line shows it
    estimate_s: float  # its expected seconds (the progress line's time left)
    run: Callable[[], Any]  # measures; returns a JSON value


class StepProgress:
    """The one-line bar on `stream` where it is a terminal and not `quiet`; otherwise
    nothing (the caller's log lines say when a calibration starts and ends)."""

    def __init__(self, total: int, done: int, estimates_s: float, *, quiet: bool = False,
                 stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.shown = not quiet and self.stream.isatty()
        self.total, self.done = total, done
        self.left_s = estimates_s  # estimated seconds of the steps not done
        self.spent_s = self.done_estimate_s = 0.0
        self._t0 = time.perf_counter()

    def seconds_left(self) -> float:
        """The steps left's estimate, scaled by the finished steps' measured/estimated once
        they are a fifth of the estimate (the first, tiny steps are mostly overhead)."""
        if self.done_estimate_s < SCALE_AFTER * (self.done_estimate_s + self.left_s):
            return self.left_s
        lo, hi = SCALE_BOUNDS
        return self.left_s * min(max(self.spent_s / self.done_estimate_s, lo), hi)

    def line(self, label: str) -> str:
        filled = BAR_CELLS * self.done // max(self.total, 1)
        bar = "#" * filled + "-" * (BAR_CELLS - filled)
        return (f"calibrating [{bar}] {self.done}/{self.total} {label}, "
                f"~{self.seconds_left():.0f} s left")

    def starting(self, label: str) -> None:
        self._t0 = time.perf_counter()
        if self.shown:
            width = max(shutil.get_terminal_size((100, 20)).columns - 1, 20)
            self.stream.write("\r" + self.line(label)[:width].ljust(width))
            self.stream.flush()

    def finished(self, estimate_s: float) -> None:
        self.done += 1
        self.spent_s += time.perf_counter() - self._t0
        self.done_estimate_s += estimate_s
        self.left_s = max(self.left_s - estimate_s, 0.0)

    def close(self) -> None:
        if self.shown:
            width = max(shutil.get_terminal_size((100, 20)).columns - 1, 20)
            self.stream.write("\r" + " " * width + "\r")
            self.stream.flush()


def run_steps(steps: Sequence[Step], measured: dict[str, Any],
              save: Callable[[dict[str, Any]], None], *, quiet: bool = False,
              stream: TextIO | None = None) -> dict[str, Any]:
    """Every step's value: those in `measured` as they are, the others measured now, each
    passed to `save` (with all measured so far) as soon as it is done."""
    out = dict(measured)
    todo = [s for s in steps if s.key not in out]
    progress = StepProgress(len(steps), len(steps) - len(todo),
                            sum(s.estimate_s for s in todo), quiet=quiet, stream=stream)
    try:
        for step in todo:
            progress.starting(step.label)
            out[step.key] = step.run()
            progress.finished(step.estimate_s)
            save(out)
    finally:
        progress.close()
    return out
