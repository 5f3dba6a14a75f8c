"""The parsed, checked ONNX models of this process, for the files as they are on disk.

Choosing a window or tile resolves the model once per candidate window (11 for the valid
U-Net over 128^3), and loading a model probes several windows. Reading, checking and
digesting the file took 38 of the 117 ms those 11 resolutions spent, and the reference
evaluator's runs of shape arithmetic that does not depend on the window 47 ms more
(2026-11-24, CI kind). An entry is reused while the model file and every external data
file it names keep their size and modification time; bounded by count and file bytes.
A file changed within the clock tick of its last change can keep both, so files
modified less than SETTLED_NS before they are read are never kept (as git treats its
"racily clean" entries).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

MODEL_CACHE_ENTRIES = 2
MODEL_CACHE_BYTES = 64 * 2**20  # model and external files: larger ones are read each
# time rather than held beside the graph's own copies of their weights
MEMO_FEED_BYTES = 64 * 2**10  # constant nodes with larger inputs are evaluated each time
MEMO_ENTRIES = 65536  # per model
SETTLED_NS = 2 * 10**9


@dataclass
class ParsedModel:
    """One model file read and checked, with its external files and content digest."""

    stamp: tuple[tuple[int, int], ...]  # (size, mtime_ns) of the model and each external file
    model: Any  # onnx.ModelProto, its external weights loaded; never modified
    files: list[Path]
    digest: str
    # (outputs, (name, dtype, shape, bytes) of each feed) -> the outputs
    evaluated: dict[tuple[Hashable, ...], list[np.ndarray]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def nbytes(self) -> int:
        return sum(size for size, _ in self.stamp)

    def evaluate(self, outputs: tuple[str, ...], feeds: dict[str, np.ndarray],
                 run: Callable[[], list[np.ndarray]]) -> list[np.ndarray]:
        """run()'s outputs for the constant node writing `outputs` from `feeds`, remembered
        for small feeds: the same values give the same outputs whatever the window."""
        if sum(v.nbytes for v in feeds.values()) > MEMO_FEED_BYTES:
            return run()
        key = (outputs, *((name, v.dtype.str, v.shape, v.tobytes())
                          for name, v in sorted(feeds.items())))
        with self.lock:
            hit = self.evaluated.get(key)
        if hit is not None:
            return [np.array(v) for v in hit]  # copies: a caller may not change ours
        outs = [np.asarray(v) for v in run()]
        with self.lock:
            if len(self.evaluated) < MEMO_ENTRIES:
                self.evaluated[key] = [np.array(v) for v in outs]
        return outs


_MODELS: OrderedDict[str, ParsedModel] = OrderedDict()
_LOCK = threading.Lock()


def file_stamp(path: Path, files: list[Path]) -> tuple[tuple[int, int], ...]:
    """(size, mtime_ns) of the model file and each external file; OSError if one is gone."""
    stats = [p.stat() for p in (path, *files)]
    return tuple((s.st_size, s.st_mtime_ns) for s in stats)


def parsed_model(path: Path, read: Callable[[Path], tuple[Any, list[Path], str]]) -> ParsedModel:
    """The cached parse of `path` while its files are unchanged, else read(path) -> (model,
    external files, digest), kept when it fits the cache."""
    key = str(path.resolve())
    with _LOCK:
        hit = _MODELS.get(key)
    try:
        if hit is not None and hit.stamp == file_stamp(path, hit.files):
            with _LOCK:
                _MODELS.move_to_end(key)
            return hit
    except OSError:
        pass  # a file is gone: read() says which
    (before,) = file_stamp(path, [])  # the model file as read() is about to read it
    read_ns = time.time_ns()
    model, files, digest = read(path)
    stamp = file_stamp(path, files)
    parsed = ParsedModel(stamp, model, files, digest)
    settled = all(read_ns - mtime_ns > SETTLED_NS for _, mtime_ns in stamp)
    if settled and stamp[0] == before and parsed.nbytes <= MODEL_CACHE_BYTES:
        with _LOCK:
            _MODELS[key] = parsed
            while len(_MODELS) > MODEL_CACHE_ENTRIES or \
                    sum(m.nbytes for m in _MODELS.values()) > MODEL_CACHE_BYTES:
                _MODELS.popitem(last=False)
    return parsed


def clear() -> None:
    """Forget every cached model (tests)."""
    with _LOCK:
        _MODELS.clear()
