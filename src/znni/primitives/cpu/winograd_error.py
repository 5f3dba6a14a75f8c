"""How F(m, 3) rounds for one layer: its float32 result against the exact conv on a few
tiles, with the layer's own weights (winograd.py). The planner offers F(6, 3), ten times
less accurate than F(4, 3), only to layers whose check stays within its bound."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

import numpy as np

from znni.primitives.cpu.winograd import winograd_conv3d
from znni.primitives.reference import conv3d_reference

ERROR_CACHE_ENTRIES = 1024  # layers' tile errors (a float each), by weight digest and m
_errors: OrderedDict[tuple[bytes, tuple[int, ...], int], float] = OrderedDict()
_lock = threading.Lock()


def layer_tile_error(weight: np.ndarray, m: int) -> float:
    """`tile_error` with 2 tiles per axis, remembered by the weight's bytes: a planner
    weighs the same layers for every candidate window."""
    w = np.ascontiguousarray(weight, np.float32)
    key = (hashlib.blake2b(w.tobytes(), digest_size=16).digest(), w.shape, m)
    with _lock:
        if key in _errors:
            return _errors[key]
    err = tile_error(w, m)
    with _lock:
        _errors[key] = err
        while len(_errors) > ERROR_CACHE_ENTRIES:
            _errors.popitem(last=False)
    return err


def tile_error(weight: np.ndarray, m: int, tiles: int = 2, seed: int = 0) -> float:
    """max |F(m,3) - exact| / max |exact| of the conv with `weight` (Cout, Cin, 3, 3, 3) on
    a seeded N(0, 1) input of `tiles` tiles per axis, exact in float64: the error of F(m,3)
    is per tile, so a few tiles with the layer's own weights show how its float32
    transforms round for that layer."""
    w = np.asarray(weight, np.float32)
    n = tiles * m + 2
    x = np.random.default_rng(seed).standard_normal((1, w.shape[1], n, n, n)).astype(np.float32)
    out = winograd_conv3d(x, w, np.zeros(w.shape[0], np.float32), m=m)
    exact = conv3d_reference(x.astype(np.float64), w.astype(np.float64), np.zeros(w.shape[0]))
    return float(np.abs(out - exact).max() / max(np.abs(exact).max(), 1e-30))
