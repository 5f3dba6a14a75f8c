"""Progress of a run: stage timers, a tqdm bar on a terminal, log lines otherwise."""

from __future__ import annotations

import logging
import shutil
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from znni.engine.job import ProgressEvent

log = logging.getLogger("znni.engine")

STAGES = ("read", "compute", "write", "wait")
LOG_INTERVAL_S = 2.0


class StageTimer:
    """Seconds spent per stage, summed over threads (read and write run in the background)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.seconds = dict.fromkeys(STAGES, 0.0)

    def add(self, stage: str, seconds: float) -> None:
        with self._lock:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds

    def merge(self, other: dict[str, float]) -> None:
        for stage, s in other.items():
            self.add(stage, s)


class Progress:
    """Counts finished blocks; drives the callback, the bar or the log lines."""

    def __init__(
        self, blocks_total: int, voxels_total: int, *, quiet: bool,
        callback: Callable[[ProgressEvent], None] | None, blocks_done: int = 0,
        voxels_done: int = 0,
    ) -> None:
        self.blocks_total, self.voxels_total = blocks_total, voxels_total
        self.blocks_done, self.voxels_done = blocks_done, voxels_done
        self.voxels_this_run = 0
        # blocks written as the fill value without compute (mask, --skip-empty): they count
        # as done, but not towards the rate, so the ETA stays that of the compute left
        self.blocks_skipped, self.voxels_skipped = 0, 0
        self.callback = callback
        self.quiet = quiet
        self.start = time.perf_counter()
        self._last_log = self.start
        self._bar: Any = None
        if not quiet and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(
                total=blocks_total, initial=blocks_done, unit="block", desc="segment",
                ncols=shutil.get_terminal_size((100, 20)).columns,  # a pty may report width 0
            )

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.start

    def voxels_per_second(self) -> float:
        """Computed output voxels per second (skipped blocks' voxels left out)."""
        computed = self.voxels_this_run - self.voxels_skipped
        return computed / max(self.elapsed_s(), 1e-9)

    def block_done(self, voxels: int, skipped: bool = False) -> None:
        self.blocks_done += 1
        self.voxels_done += voxels
        self.voxels_this_run += voxels
        if skipped:
            self.blocks_skipped += 1
            self.voxels_skipped += voxels
        rate = self.voxels_per_second()
        if self.callback is not None:
            self.callback(
                ProgressEvent(
                    self.blocks_done, self.blocks_total, self.voxels_done, self.voxels_total,
                    self.elapsed_s(), rate,
                )
            )
        if self._bar is not None:
            self._bar.set_postfix_str(f"{rate:,.0f} vox/s", refresh=False)
            self._bar.update(1)
        elif not self.quiet:
            now = time.perf_counter()
            if now - self._last_log >= LOG_INTERVAL_S or self.blocks_done == self.blocks_total:
                self._last_log = now
                log.info(
                    "%d/%d blocks, %s output voxels/s, %.1f s",
                    self.blocks_done, self.blocks_total, f"{rate:,.0f}", self.elapsed_s(),
                )

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
