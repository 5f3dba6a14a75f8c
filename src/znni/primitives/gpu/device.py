"""The device interface the GPU backend is written against, and its numpy stand-in.

A `Device` owns an array module (`xp`), a memory cap with exact accounting of
every buffer the backend allocates, two streams (copy and compute, as ZNNi's
GPU + host RAM algorithm uses), pinned host buffers and asynchronous copies.
`CupyDevice` (cupy_device.py) maps this thinly onto CUDA. `HostDevice` runs
the same backend code on numpy: each stream is a worker thread executing its
queue in order, events are real cross-thread signals, so a missing wait shows
up as a wrong result (especially with `jitter_s`), and every copy and launch
is logged so tests can check the ordering and count the sub-batches.
"""

from __future__ import annotations

import queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from math import prod
from types import ModuleType
from typing import Any

import numpy as np

from znni.primitives.gpu.pinned_pool import DEFAULT_PINNED_BYTES, PinnedPool

WAIT_TIMEOUT_S = 600.0  # an event that never fires is a bug; fail instead of hanging


class DeviceOutOfMemory(MemoryError):
    """An allocation would take the device above its memory cap."""


class StandinNativeOOM(MemoryError):
    """The stand-in's version of a library's own out-of-memory error (CuPy's
    OutOfMemoryError on a GPU): raised by injected failures, translated by callers."""


class DeviceStreamError(RuntimeError):
    """Work queued on a stream failed; raised where the stream is waited on."""


def nbytes_of(shape: tuple[int, ...], dtype: Any = np.float32) -> int:
    return int(prod(shape)) * np.dtype(dtype).itemsize


@dataclass(frozen=True)
class LogEntry:
    """One step as the device saw it: issued on the host, or started/ended on a stream."""

    seq: int
    phase: str  # "issue", "start", "end"
    stream: str
    kind: str  # "h2d", "d2h", "launch", "wait", "record"
    tag: str


class Device(ABC):
    """Memory accounting and the stream vocabulary shared by every device."""

    name: str = "device"
    xp: ModuleType = np
    # the array library's own out-of-memory errors, which callers translate to
    # DeviceOutOfMemory so that a job shrinks its batch instead of failing
    native_oom: tuple[type[BaseException], ...] = (StandinNativeOOM,)
    tf32 = False  # whether cuBLAS float32 matmuls may use TF32 tensor cores

    def __init__(self, memory_cap_bytes: int) -> None:
        if memory_cap_bytes <= 0:
            raise ValueError(f"device memory cap must be positive, got {memory_cap_bytes} bytes")
        self.memory_cap_bytes = int(memory_cap_bytes)
        self.in_use_bytes = 0
        self.peak_bytes = 0
        self._live: dict[int, int] = {}  # id(array) -> bytes
        self._lock = threading.Lock()
        self.log: list[LogEntry] = []
        self._seq = 0

    # -- memory accounting -------------------------------------------------
    def reserve(self, nbytes: int, what: str) -> None:
        """Account `nbytes` (a buffer or a kernel's workspace); refuse past the cap."""
        with self._lock:
            if self.in_use_bytes + nbytes > self.memory_cap_bytes:
                raise DeviceOutOfMemory(
                    f"{what} needs {nbytes} bytes but only "
                    f"{self.memory_cap_bytes - self.in_use_bytes} of the "
                    f"{self.memory_cap_bytes}-byte device cap are free"
                )
            self.in_use_bytes += nbytes
            self.peak_bytes = max(self.peak_bytes, self.in_use_bytes)

    def release(self, nbytes: int) -> None:
        with self._lock:
            self.in_use_bytes -= nbytes

    def alloc(self, shape: tuple[int, ...], dtype: Any = np.float32, what: str = "buffer") -> Any:
        """An uninitialised device array, counted against the cap until `free`."""
        size = nbytes_of(shape, dtype)
        self.reserve(size, what)
        try:
            arr = self._empty(shape, dtype)
        except BaseException:
            self.release(size)
            raise
        with self._lock:
            self._live[id(arr)] = size
        return arr

    def adopt(self, arr: Any, what: str = "result") -> Any:
        """Count an array that `xp` created (e.g. a kernel's result) until `free`."""
        size = int(arr.nbytes)
        self.reserve(size, what)
        with self._lock:
            self._live[id(arr)] = size
        return arr

    def free(self, *arrays: Any) -> None:
        """Stop counting arrays from `alloc`; the caller drops its references."""
        for arr in arrays:
            with self._lock:
                size = self._live.pop(id(arr), None)
            if size is None:
                raise ValueError("free() of an array this device did not allocate")
            self.release(size)

    def counted(self, arr: Any) -> bool:
        """Whether `arr` is counted (allocated or adopted and not yet freed)."""
        with self._lock:
            return id(arr) in self._live

    def reset_peak(self) -> None:
        with self._lock:
            self.peak_bytes = self.in_use_bytes

    # -- logging -----------------------------------------------------------
    def _note(self, phase: str, stream: str, kind: str, tag: str) -> None:
        with self._lock:
            self.log.append(LogEntry(self._seq, phase, stream, kind, tag))
            self._seq += 1

    def clear_log(self) -> None:
        with self._lock:
            self.log = []

    # -- what a concrete device provides ------------------------------------
    @abstractmethod
    def _empty(self, shape: tuple[int, ...], dtype: Any) -> Any: ...

    @abstractmethod
    def pinned(self, shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
        """A page-locked host buffer (a plain numpy array on the stand-in)."""

    @abstractmethod
    def stream(self, name: str) -> Any:
        """The device's stream called `name` ("copy" or "compute"), created on first use."""

    @abstractmethod
    def copy_to_device(self, dst: Any, src: np.ndarray, stream: Any, tag: str = "") -> None:
        """Queue dst[...] = src (host, pinned) on `stream`."""

    @abstractmethod
    def copy_to_host(self, dst: np.ndarray, src: Any, stream: Any, tag: str = "") -> None:
        """Queue dst[...] = src (dst host, pinned) on `stream`."""

    @abstractmethod
    def launch(self, stream: Any, fn: Callable[[], None], tag: str = "") -> None:
        """Queue device work `fn` (written against `xp`) on `stream`."""

    @abstractmethod
    def record(self, stream: Any) -> Any:
        """An event that fires when everything queued so far on `stream` has run."""

    @abstractmethod
    def wait(self, stream: Any, event: Any) -> None:
        """Work queued on `stream` from now on waits for `event`."""

    @abstractmethod
    def host_wait(self, event: Any) -> None:
        """Block the calling thread until `event` fired; raises if its stream failed."""

    @abstractmethod
    def synchronize(self) -> None:
        """Wait for every stream; raises the first failure of queued work."""

    def set_tf32(self, enabled: bool) -> None:
        """Allow (or forbid) TF32 tensor-core math in cuBLAS float32 matmuls."""
        self.tf32 = bool(enabled)

    def native_conv3d(self, x: Any, w: Any, b: Any, out: Any) -> bool:
        """A vendor convolution (cuDNN) into `out`; False when the device has none."""
        return False

    @abstractmethod
    def close(self) -> None:
        """Release streams and threads; the device is unusable afterwards."""


class _HostEvent:
    def __init__(self) -> None:
        self.fired = threading.Event()
        self.error: BaseException | None = None

    def fire(self, error: BaseException | None) -> None:
        self.error = error
        self.fired.set()


class _HostStream:
    """An in-order work queue run by one thread: the stand-in for a CUDA stream."""

    def __init__(self, name: str, device: HostDevice) -> None:
        self.name = name
        self._device = device
        self._queue: queue.Queue[tuple[str, str, Callable[[], None]] | None] = queue.Queue()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"znni-{name}", daemon=True)
        self._thread.start()

    def submit(self, kind: str, tag: str, fn: Callable[[], None]) -> None:
        self._device._note("issue", self.name, kind, tag)
        self._queue.put((kind, tag, fn))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            kind, tag, fn = item
            if self.error is not None and kind != "record":
                continue  # a failed stream skips its work, like a CUDA error
            self._device._jitter()
            self._device._note("start", self.name, kind, tag)
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - handed to whoever waits
                self.error = self.error or e
            self._device._note("end", self.name, kind, tag)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=WAIT_TIMEOUT_S)


class HostDevice(Device):
    """A numpy stand-in for a GPU with `memory_cap_bytes` of memory and threaded streams."""

    name = "host-standin"
    xp = np

    def __init__(self, memory_cap_bytes: int = 2**30, jitter_s: float = 0.0, seed: int = 0,
                 pinned_bytes: int = DEFAULT_PINNED_BYTES, fail_at: int = 0) -> None:
        super().__init__(memory_cap_bytes)
        self.pinned_pool = PinnedPool(bytearray, pinned_bytes)  # CupyDevice's pool, on RAM
        self._streams: dict[str, _HostStream] = {}
        self._jitter_s = float(jitter_s)
        self._rng = np.random.default_rng(seed)
        # the fail_at-th reservation fails (0: none), as a real allocator does when another
        # process takes the memory: recovery from it runs in CI (ZNNI_GPU_STANDIN_FAIL_AT)
        self.fail_at, self.reservations = int(fail_at), 0

    def reserve(self, nbytes: int, what: str) -> None:
        with self._lock:
            self.reservations += 1
            injected = self.reservations == self.fail_at
        if injected:
            raise DeviceOutOfMemory(f"{what}: the stand-in's injected allocation failure")
        super().reserve(nbytes, what)

    def _jitter(self) -> None:
        if self._jitter_s > 0:
            with self._lock:
                delay_s = float(self._rng.uniform(0, self._jitter_s))
            time.sleep(delay_s)

    def _empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return np.empty(shape, dtype=dtype)

    def pinned(self, shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
        return self.pinned_pool.take(shape, dtype)

    def stream(self, name: str) -> _HostStream:
        with self._lock:
            if name not in self._streams:
                self._streams[name] = _HostStream(name, self)
            return self._streams[name]

    def copy_to_device(self, dst: Any, src: np.ndarray, stream: Any, tag: str = "") -> None:
        stream.submit("h2d", tag, lambda: np.copyto(dst, src))

    def copy_to_host(self, dst: np.ndarray, src: Any, stream: Any, tag: str = "") -> None:
        stream.submit("d2h", tag, lambda: np.copyto(dst, src))

    def launch(self, stream: Any, fn: Callable[[], None], tag: str = "") -> None:
        stream.submit("launch", tag, fn)

    def record(self, stream: Any) -> _HostEvent:
        event = _HostEvent()
        stream.submit("record", "", lambda: event.fire(stream.error))
        return event

    def wait(self, stream: Any, event: Any) -> None:
        def block() -> None:
            if not event.fired.wait(WAIT_TIMEOUT_S):
                raise DeviceStreamError(f"stream {stream.name} waited {WAIT_TIMEOUT_S} s in vain")
            if event.error is not None:
                raise DeviceStreamError(f"an awaited stream failed: {event.error}") from event.error

        stream.submit("wait", "", block)

    def host_wait(self, event: Any) -> None:
        if not event.fired.wait(WAIT_TIMEOUT_S):
            raise DeviceStreamError(f"device work did not finish within {WAIT_TIMEOUT_S} s")
        if event.error is not None:
            raise DeviceStreamError(f"device work failed: {event.error}") from event.error

    def synchronize(self) -> None:
        with self._lock:
            streams = list(self._streams.values())
        errors = []
        for s in streams:
            event = self.record(s)
            event.fired.wait(WAIT_TIMEOUT_S)
            if s.error is not None:
                errors.append(s.error)
                s.error = None  # reported once; the stream is usable again
        if errors:
            first = errors[0]
            root = first.__cause__ if isinstance(first, DeviceStreamError) else first
            raise DeviceStreamError(f"device work failed: {root}") from root

    def close(self) -> None:
        with self._lock:
            streams, self._streams = list(self._streams.values()), {}
        for s in streams:
            s.close()
