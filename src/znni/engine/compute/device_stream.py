"""Batches of windows streamed to the device while the previous batch computes.

Two reusable pinned host buffers and two device input buffers alternate (slot k % 2):
the host gathers batch k's windows into pinned[k % 2] while the device still computes
batch k - 1, the copy stream uploads it, and the compute stream waits for that copy
only. Events order the reuse: the host refills a pinned buffer only after the copy
that read it, and an upload overwrites a device buffer only after the compute that
read it (ZNNi's GPU pipeline, as primitives/gpu/streaming.py does for layers).

Everything a batch does on the device (the graph, blending, keeping outputs) is
queued on the compute stream as one launch, so the host never waits for compute
until a block's output comes back. `on_device_oom` says whether a failure was the
device running out of memory, which the callers answer with a smaller batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from znni.primitives.gpu.device import Device, DeviceOutOfMemory, DeviceStreamError

log = logging.getLogger("znni.engine")
Fill = Callable[[np.ndarray], None]  # writes a batch's inputs into a (B, C, *W) host buffer
Work = Callable[[Any], None]  # runs on the compute stream with the (B, C, *W) device batch


def on_device_oom(error: BaseException) -> bool:
    """Whether `error` (raised by a launch or by waiting on a stream) is an exhausted device."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, DeviceOutOfMemory | MemoryError):
            return True
        if not isinstance(seen, DeviceStreamError):
            return False
        seen = seen.__cause__
    return False


def _root(error: BaseException) -> BaseException:
    """The first cause that is not a stream's wrapper."""
    while isinstance(error, DeviceStreamError) and error.__cause__ is not None:
        error = error.__cause__
    return error


class InputStream:
    """Pinned and device input slots for batches of up to `batch` items of `item_shape`."""

    def __init__(self, device: Device, batch: int, item_shape: tuple[int, ...],
                 dtype: np.dtype[Any]) -> None:
        self.device, self.batch, self.item_shape, self.dtype = device, batch, item_shape, dtype
        shape = (batch, *item_shape)  # (B, C, Z, Y, X)
        self._pinned = [device.pinned(shape, dtype) for _ in range(2)]
        self._dev: list[Any] = []
        try:
            for _ in range(2):
                self._dev.append(device.alloc(shape, dtype, "input batch"))
        except BaseException:
            device.free(*self._dev)
            raise
        self._copied: list[Any] = [None, None]  # the upload that last read pinned[slot]
        self._computed: list[Any] = [None, None]  # the compute that last read dev[slot]
        self._k = 0
        self.uploads = 0

    def submit(self, count: int, fill: Fill, work: Work, tag: str = "batch") -> None:
        """Gather `count` items with `fill`, upload them on the copy stream, and queue
        `work` on the compute stream behind that upload."""
        if not 1 <= count <= self.batch:
            raise ValueError(f"a batch of {count} items does not fit slots of {self.batch}")
        dev = self.device
        copy, comp = dev.stream("copy"), dev.stream("compute")
        slot, self._k = self._k % 2, self._k + 1
        if self._copied[slot] is not None:
            dev.host_wait(self._copied[slot])  # the previous upload from this buffer is done
        host = self._pinned[slot][:count]
        fill(host)
        if self._computed[slot] is not None:
            dev.wait(copy, self._computed[slot])  # nothing reads dev[slot] any more
        target = self._dev[slot][:count]
        dev.copy_to_device(target, host, copy, tag)
        self._copied[slot] = dev.record(copy)
        dev.wait(comp, self._copied[slot])
        dev.launch(comp, lambda: work(target), tag)
        self._computed[slot] = dev.record(comp)
        self.uploads += 1

    def close(self) -> None:
        """Give the device buffers back (after the work that reads them has run)."""
        self.device.free(*self._dev)
        self._dev = []


def download(device: Device, array: Any, tag: str = "block") -> np.ndarray:
    """A device array's values on the host, copied on the copy stream after everything
    queued on the compute stream (the block's last blend) has run."""
    copy, comp = device.stream("copy"), device.stream("compute")
    host = device.pinned(tuple(array.shape), array.dtype)
    device.wait(copy, device.record(comp))
    device.copy_to_host(host, array, copy, tag)
    device.host_wait(device.record(copy))
    return np.array(host, copy=True)  # the pinned buffer may be reused


class DeviceBlocks:
    """What the windowed and exact device runners share: the input slots, the arrays a
    block made, and the retry with a smaller batch after an allocation failure."""

    def __init__(self, device: Device, batch: int, dtype: np.dtype[Any]) -> None:
        self.device, self.batch, self.dtype = device, max(1, int(batch)), dtype
        self.shrinks: list[int] = []  # the batch after each allocation failure
        self._stream: InputStream | None = None

    def with_retries(self, run: Callable[[list[Any]], np.ndarray], what: str) -> np.ndarray:
        """run(made) until it does not run out of device memory, halving the batch after
        each failure; at a batch of one, ValueError naming `what` and the cap."""
        while True:
            made: list[Any] = []
            try:
                return run(made)
            except BaseException as e:
                self.recover(made)
                if not on_device_oom(e):
                    raise
                if self.batch == 1:
                    raise ValueError(
                        f"{what} does not fit the {self.device.memory_cap_bytes}-byte device "
                        "memory cap; use a smaller --window or a larger --memory-limit"
                    ) from e
                self.batch //= 2
                self.shrinks.append(self.batch)
                log.warning("the device ran out of memory (%s); running %d at a time",
                            _root(e), self.batch)

    def inputs(self, item_shape: tuple[int, ...]) -> InputStream:
        """The input slots for the current batch (made again after the batch shrank)."""
        if self._stream is None or self._stream.batch != self.batch:
            if self._stream is not None:
                self._stream.close()
            self._stream = InputStream(self.device, self.batch, item_shape, self.dtype)
        return self._stream

    def free_made(self, made: list[Any]) -> None:
        """Free what a block allocated that is still counted (a batch's output that its
        last reader freed on the compute stream is no longer on the device's books)."""
        for arr in made:
            if self.device.counted(arr):
                self.device.free(arr)
        made.clear()

    def recover(self, made: list[Any]) -> None:
        """After a failure: wait for the streams (their errors dropped: the first failure
        is the one being handled), free the block's arrays and the input slots."""
        try:
            self.device.synchronize()
        except Exception:  # noqa: BLE001 - the failure being handled is the one to report
            pass
        self.free_made(made)
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def close(self) -> None:
        """Give back the input slots (the device and its other caches stay the caller's)."""
        self.recover([])
