"""Faults met reading or writing a volume during a run, named in one sentence.

Zarr reports a torn chunk as a bare `RuntimeError: Zstd decompression error` and a full disk
as `OSError: [Errno 28]`, neither naming the array nor the chunk. The io room catches them
where the read or write happens and raises a `VolumeFault`: the array, the chunk key (reads)
or block (writes), the cause and the exit status (2 bad data, 1 the environment). The CLI
prints its sentence; the job server stores it as the job's error.
"""

from __future__ import annotations

import errno
import threading
from typing import Any

from znni.engine.io.retry import StoreError, is_refused
from znni.engine.location import Location
from znni.engine.scheduler import Scheduler

EXIT_BAD_DATA = 2
EXIT_ENVIRONMENT = 1
BAD_CHUNK_POLICIES = ("fail", "fill")

# errno -> (kind, the cause in words)
ERRNO_CAUSES: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("no-space", "no space left on the device"),
    errno.EDQUOT: ("no-space", "the disk quota is exceeded"),
    errno.EFBIG: ("no-space", "the file size limit is exceeded"),
    errno.EACCES: ("permission", "permission denied"),
    errno.EPERM: ("permission", "operation not permitted"),
    errno.EROFS: ("read-only", "the file system is read-only"),
    errno.EIO: ("io", "an I/O error of the device"),
}


class VolumeFault(Exception):
    """A read or write of a volume that failed mid-run; `str()` is the one sentence."""

    done: tuple[int, int] | None = None  # (blocks done, blocks in all), set by the sweep

    def __init__(self, kind: str, path: Location | str, key: str, cause: str, *,
                 what: str = "input chunk", exit_code: int = EXIT_ENVIRONMENT,
                 hint: str = "") -> None:
        # the volume's location as text: the fault is a message that crosses processes
        self.kind, self.path, self.key, self.cause = kind, str(path), key, cause
        self.what, self.exit_code, self.hint = what, exit_code, hint
        verb = "read" if what.startswith("input") else "write"
        text = f"cannot {verb} {what} {key} of {path}: {cause}"
        super().__init__(text + (f"; {hint}" if hint else ""))

    def __reduce__(self) -> tuple[Any, ...]:  # a Dask worker's fault reaches the client whole
        return (_rebuild, (self.kind, self.path, self.key, self.cause, self.what,
                           self.exit_code, self.hint))


def _rebuild(kind: str, path: str, key: str, cause: str, what: str, exit_code: int,
             hint: str) -> VolumeFault:
    return VolumeFault(kind, path, key, cause, what=what, exit_code=exit_code, hint=hint)


def codec_names(array: Any) -> str:
    """The array's codecs in words, e.g. 'ZstdCodec' (for a decode error's sentence)."""
    try:
        codecs = list(getattr(array, "compressors", ()) or ()) + list(
            getattr(array, "filters", ()) or ())
    except Exception:  # noqa: BLE001 - only for the sentence
        return "its codec"
    return ", ".join(type(c).__name__ for c in codecs) or "no codec"


def chunk_key(array: Any, index: tuple[int, ...]) -> str:
    """The store key of the chunk at grid `index` ('c/1/0/1' in format 3, '1.0.1' in 2)."""
    try:
        return str(array.metadata.encode_chunk_key(tuple(int(i) for i in index)))
    except Exception:  # noqa: BLE001 - a non-zarr array: the grid index says it
        return "/".join(str(i) for i in index)


def read_fault(e: BaseException, path: Location, key: str, array: Any) -> VolumeFault:
    """The fault of a chunk that failed to read: missing store, refusal, or bad bytes."""
    if isinstance(e, VolumeFault):
        return e
    if isinstance(e, StoreError):
        return VolumeFault("store", path, key, str(e))
    if isinstance(e, FileNotFoundError | NotADirectoryError):
        return VolumeFault("missing", path, key, "the store is gone (deleted or unmounted "
                           f"mid-run: {e.strerror or e})")
    if is_refused(e):
        return VolumeFault("credentials", path, key, f"access refused ({e})")
    if isinstance(e, OSError) and e.errno in ERRNO_CAUSES:
        kind, cause = ERRNO_CAUSES[e.errno]
        return VolumeFault(kind, path, key, cause)
    if isinstance(e, OSError):
        return VolumeFault("io", path, key, f"{type(e).__name__}: {e}")
    return VolumeFault(
        "corrupt", path, key,
        f"its bytes do not decode with {codec_names(array)} ({type(e).__name__}: {e})",
        exit_code=EXIT_BAD_DATA, hint="the chunk is corrupt")


def write_fault(e: BaseException, path: Location, key: str,
                what: str = "output block") -> VolumeFault:
    """The fault of a write that failed: no space, permission, read-only, a gone store."""
    if isinstance(e, VolumeFault):
        return e
    if isinstance(e, StoreError):
        return VolumeFault("store", path, key, str(e), what=what)
    if isinstance(e, OSError) and e.errno in ERRNO_CAUSES:
        kind, cause = ERRNO_CAUSES[e.errno]
        return VolumeFault(kind, path, key, cause, what=what)
    if isinstance(e, FileNotFoundError | NotADirectoryError):
        return VolumeFault("missing", path, key, "the output is gone (deleted or unmounted "
                           "mid-run)", what=what)
    if is_refused(e):
        return VolumeFault("credentials", path, key, f"access refused ({e})", what=what)
    return VolumeFault("io", path, key, f"{type(e).__name__}: {e}", what=what)


def raise_setup_fault(e: BaseException, path: Location) -> None:
    """Name a failure creating the output's metadata or ledger (a full disk, a refusal, a
    read-only file system) as a `VolumeFault`; return for anything else."""
    if isinstance(e, OSError) and e.errno in ERRNO_CAUSES:
        raise write_fault(e, path, "metadata", what="output") from e


def check_bad_chunk_policy(policy: str, scheduler: Scheduler | None) -> None:
    """'fail' or 'fill'; 'fill' runs locally (a Dask worker's reads keep no list)."""
    if policy not in BAD_CHUNK_POLICIES:
        raise ValueError(f"on_bad_chunk {policy!r} is not one of {', '.join(BAD_CHUNK_POLICIES)}")
    if policy == "fill" and scheduler is not None:
        raise ValueError("--on-bad-chunk fill runs locally in this version; drop --scheduler "
                         f"{scheduler} or use fail")


class BadChunks:
    """An input's policy for chunks that fail to decode ('fail' or 'fill') and the keys of
    those filled with the fill value (thread-safe: the reader thread adds to it)."""

    def __init__(self, policy: str = "fail") -> None:
        self.policy = policy
        self._keys: set[str] = set()
        self._new: list[str] = []
        self._lock = threading.Lock()

    def add(self, key: str) -> None:
        with self._lock:
            if key not in self._keys:
                self._keys.add(key)
                self._new.append(key)

    def take_new(self) -> list[str]:
        """The keys added since the last call (for the ledger)."""
        with self._lock:
            new, self._new = self._new, []
        return new

    @property
    def keys(self) -> list[str]:
        with self._lock:
            return sorted(self._keys)
