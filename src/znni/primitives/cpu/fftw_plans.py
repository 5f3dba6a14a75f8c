"""pyFFTW plans with their aligned workspaces, cached by shape; FFTW wisdom on disk.

A plan is only valid for arrays of the exact layout it was made for, and a
pyFFTW object keeps references to its arrays, so plans live together with
the buffers they own: a `Workspace`. Workspaces are checked out exclusively,
returned after use and kept in an LRU bounded in bytes; reusing them also
avoids first-touch page faults on big fresh arrays. Wisdom (what
FFTW_MEASURE learned) is saved under `$XDG_CACHE_HOME/znni` so a new process
re-plans a known shape in well under a millisecond. Several processes (and venvs) share
that file: a save merges what is on disk under a lock first, so none loses another's
plans; whether a transform is already planned is asked of FFTW's wisdom itself
(`in_wisdom`: FFTW_WISDOM_ONLY fails fast where FFTW would have to measure).
"""

from __future__ import annotations

import fcntl
import logging
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


def _import_pyfftw() -> Any:
    """`import pyfftw` without the scipy and dask interfaces its __init__ imports wherever
    those packages are installed: scipy.fftpack and dask.array took 0.45 s of every znni
    process's start (a `segment`, each job or Dask worker; Intel host of the CI kind,
    2026-11-24), and znni calls pyfftw.FFTW only. Each is blocked (its import raises
    ImportError, which pyfftw catches) only while pyfftw imports, and only if no one has
    imported it yet."""
    blocked = [m for m in ("scipy.fftpack", "dask") if m not in sys.modules]
    for m in blocked:
        sys.modules[m] = None  # type: ignore[assignment]  # None blocks an import; typeshed omits it
    try:
        import pyfftw as module
    finally:
        for m in blocked:
            if m in sys.modules and sys.modules[m] is None:
                del sys.modules[m]
    return module


_pyfftw: Any = None
_import_lock = threading.Lock()


def fftw() -> Any:
    """The pyfftw module, imported when the first FFT is planned or wisdom is read: importing
    this package (the planner does, for its cost constants) must not pay for pyFFTW."""
    global _pyfftw
    if _pyfftw is None:
        with _import_lock:
            if _pyfftw is None:
                _pyfftw = _import_pyfftw()
    return _pyfftw


def __getattr__(name: str) -> Any:
    """`fftw_plans.pyfftw`, imported on first use (`fftw()`)."""
    if name == "pyfftw":
        return fftw()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

FFT_EFFORTS = ("FFTW_ESTIMATE", "FFTW_MEASURE", "FFTW_PATIENT", "FFTW_EXHAUSTIVE")
_WISDOM_NAMES = ("double", "single", "longdouble")
_wisdom_lock = threading.Lock()
_wisdom_loaded: set[Path] = set()


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/znni, defaulting to ~/.cache/znni."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "znni"


def load_wisdom(directory: Path | None = None) -> None:
    """Import saved FFTW wisdom once per directory and process; a bad file is ignored."""
    directory = directory or cache_dir()
    with _wisdom_lock:
        if directory in _wisdom_loaded:
            return
        _wisdom_loaded.add(directory)
        _import_files(directory)


def save_wisdom(directory: Path | None = None) -> None:
    """Export all wisdom gathered so far, merged with what other processes saved meanwhile
    (under an exclusive lock on the directory's lock file; atomic rename; best effort)."""
    directory = directory or cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / ".fftw-wisdom.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            _import_files(directory)  # FFTW merges imported wisdom into what it holds
            for name, data in zip(_WISDOM_NAMES, fftw().export_wisdom(), strict=True):
                tmp = directory / f".fftw-wisdom-{name}.{os.getpid()}.tmp"
                tmp.write_bytes(data)
                tmp.replace(directory / f"fftw-wisdom-{name}.dat")
    except OSError as e:
        log.warning("could not save FFTW wisdom to %s: %s", directory, e)


def refresh_wisdom(directory: Path | None = None) -> None:
    """Import the saved wisdom again: another process may have added to it since."""
    _import_files(directory or cache_dir())


def in_wisdom(build: Callable[[PlanCache], Workspace], threads: int, effort: str) -> bool:
    """Whether every transform `build` plans is in FFTW's wisdom for `threads` and `effort`
    (the saved wisdom loaded first), so planning it costs no measuring. Its arrays are
    allocated but never touched (no pages), and no plan is kept. FFTW_ESTIMATE never
    measures: always True."""
    if effort == "FFTW_ESTIMATE":
        return True
    probe = PlanCache(threads, effort, max_bytes=0, wisdom_only=True)
    try:
        build(probe)
    except RuntimeError:  # pyFFTW: "No FFTW wisdom is known for this plan."
        return False
    return True


def _import_files(directory: Path) -> None:
    """Import the wisdom files in `directory` (a bad file is ignored)."""
    parts = []
    for name in _WISDOM_NAMES:
        path = directory / f"fftw-wisdom-{name}.dat"
        parts.append(path.read_bytes() if path.exists() else b"")
    if any(parts):
        try:
            fftw().import_wisdom(tuple(parts))
        except (ValueError, RuntimeError, TypeError) as e:  # stale or corrupt wisdom
            log.warning("ignoring unreadable FFTW wisdom in %s: %s", directory, e)


class Workspace:
    """Aligned buffers plus the FFTW plans built on them (used by one thread at a time)."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.plans: dict[str, Any] = {}  # pyfftw.FFTW objects

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    def array(self, name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        arr = fftw().empty_aligned(shape, dtype=dtype)
        self.arrays[name] = arr
        return arr


class PlanCache:
    """Workspaces keyed by (key, threads, effort); LRU bounded by `max_bytes`."""

    def __init__(self, threads: int, effort: str, max_bytes: int = 2**30,
                 wisdom_only: bool = False) -> None:
        if effort not in FFT_EFFORTS:
            raise ValueError(f"unknown FFTW effort {effort!r}; expected one of {FFT_EFFORTS}")
        self.threads = threads
        self.effort = effort
        self.wisdom_only = wisdom_only  # plans fail (RuntimeError) unless in the wisdom
        self.max_bytes = max_bytes
        self._free: OrderedDict[Hashable, list[Workspace]] = OrderedDict()
        self._lock = threading.Lock()
        self._new_plans = 0
        load_wisdom()

    def fftw(
        self, src: np.ndarray, dst: np.ndarray, axis: int, direction: str = "FFTW_FORWARD"
    ) -> Any:
        """Plan one batched 1D transform along `axis` (arrays are overwritten when measuring)."""
        self._new_plans += 1
        flags = (self.effort, "FFTW_DESTROY_INPUT") + (
            ("FFTW_WISDOM_ONLY",) if self.wisdom_only else ())
        return fftw().FFTW(
            src, dst, axes=(axis,), direction=direction, flags=flags, threads=self.threads)

    def checkout(self, key: Hashable, build: Callable[[PlanCache], Workspace]) -> Workspace:
        """A free workspace for `key`, or a new one made by `build(self)`."""
        full = (key, self.threads, self.effort)
        with self._lock:
            free = self._free.get(full)
            if free:
                ws = free.pop()
                if not free:
                    del self._free[full]
                return ws
        ws = build(self)
        if self._new_plans and self.effort != "FFTW_ESTIMATE":
            self._new_plans = 0
            save_wisdom()
        return ws

    def checkin(self, key: Hashable, ws: Workspace) -> None:
        """Return a workspace for reuse, evicting least recently used ones beyond the bound."""
        if ws.nbytes > self.max_bytes:
            return
        full = (key, self.threads, self.effort)
        with self._lock:
            self._free.setdefault(full, []).append(ws)
            self._free.move_to_end(full)
            while self.cached_bytes() > self.max_bytes:
                _, lst = next(iter(self._free.items()))
                lst.pop(0)
                if not lst:
                    self._free.popitem(last=False)

    def cached_bytes(self) -> int:
        return sum(ws.nbytes for lst in self._free.values() for ws in lst)

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
