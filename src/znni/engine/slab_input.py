"""A block's input that arrives in z-slabs, so that its first windows start early.

The sweep's first block is the one read with nothing to hide it but the setup
(`segment._set_up`), and a windowed block reads every window that touches it: at 256^3
with 64^3 windows, 160 x 256 x 256 voxels, 320 requests of 32^3 chunks on an object
store. A windowed worker runs its windows in MONAI's scan order, z outermost, so its
first row of windows needs only the lowest z rows of that input. `SlabInput` is the
block's float32 input, filled on the reader thread a chunk row at a time; the worker
waits, per window group, for the rows the group reads (`windowed.WindowedWorker`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

import numpy as np


class SlabInput:
    """A (C, RZ, RY, RX) float32 block input whose z rows arrive in order."""

    def __init__(self, shape: tuple[int, int, int, int]) -> None:
        self.array = np.empty(shape, np.float32)  # (C, RZ, RY, RX)
        self.waited_s = 0.0  # how long the worker waited for rows
        self._rows = 0  # z rows filled, from the first
        self._error: BaseException | None = None
        self._cond = threading.Condition()

    def fill(self, slabs: Sequence[tuple[int, int]],
             read: Callable[[int, int], np.ndarray]) -> SlabInput:
        """On the reader thread: rows [z0, z1) of each slab, in order, from `read(z0, z1)`.
        A failure is kept for the waiting worker, and raised here too."""
        try:
            for z0, z1 in slabs:
                self.array[:, z0:z1] = read(z0, z1)
                with self._cond:
                    self._rows = z1
                    self._cond.notify_all()
        except BaseException as e:
            with self._cond:
                self._error = e
                self._cond.notify_all()
            raise
        return self

    def wait_rows(self, rows: int) -> np.ndarray:
        """The array, once its first `rows` z rows are in; the reader's error if its fill
        failed before them."""
        t0 = time.perf_counter()
        with self._cond:
            while self._rows < rows and self._error is None:
                self._cond.wait()
            self.waited_s += time.perf_counter() - t0
            if self._rows < rows and self._error is not None:
                raise self._error
        return self.array


def slab_rows(lo: int, hi: int, step: int) -> list[tuple[int, int]]:
    """Rows [z0, z1) of a box spanning volume z [lo, hi), relative to lo, cut where the
    input's chunk rows (multiples of `step`) begin: each slab reads whole chunks once."""
    if step < 1 or hi <= lo:
        raise ValueError(f"need step >= 1 and lo < hi, got step {step}, z [{lo}, {hi})")
    cuts = [lo, *range((lo // step + 1) * step, hi, step), hi]
    return [(a - lo, b - lo) for a, b in zip(cuts, cuts[1:], strict=False)]
