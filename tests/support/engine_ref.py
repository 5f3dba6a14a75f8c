"""An independent whole-volume dense reference for engine tests (no znni imports).

Dense semantics (docs/design.md) written directly: every maxpool becomes a
stride-1 max filter and every later kernel is dilated by the product of the
earlier pool windows. Fast enough for 40x50x60 volumes; checked against
tests/support/naive.py's brute-force windows in test_engine_ref.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view
from scipy import signal

from support.naive import naive_activation, naive_border_pad, naive_fov


def _dilate(w: np.ndarray, d: tuple[int, int, int]) -> np.ndarray:
    kz, ky, kx = w.shape
    out = np.zeros(((kz - 1) * d[0] + 1, (ky - 1) * d[1] + 1, (kx - 1) * d[2] + 1))
    out[:: d[0], :: d[1], :: d[2]] = w
    return out


def dense_padded(layers: list[dict], params: dict, x: np.ndarray) -> np.ndarray:
    """Dense output of an already-padded (C, Z, Y, X) float64 input (valid mode)."""
    dil = [1, 1, 1]
    x = x.astype(np.float64)
    for i, layer in enumerate(layers):
        kind = layer["kind"]
        if kind == "conv":
            w, b = params[f"{i}.weight"].astype(np.float64), params[f"{i}.bias"]
            x = np.stack([
                sum(
                    signal.correlate(x[c], _dilate(w[o, c], tuple(dil)), mode="valid",
                                     method="direct")
                    for c in range(x.shape[0])
                ) + float(b[o])
                for o in range(w.shape[0])
            ])
        elif kind == "maxpool":
            p = layer["window"]
            span = tuple((p[a] - 1) * dil[a] + 1 for a in range(3))
            win = sliding_window_view(x, span, axis=(1, 2, 3))
            x = win[..., :: dil[0], :: dil[1], :: dil[2]].max(axis=(-3, -2, -1))
            dil = [dil[a] * p[a] for a in range(3)]
        else:
            x = naive_activation(x, kind, layer.get("slope", 0.01))
    return x


def dense_volume(
    layers: list[dict], params: dict, volume: np.ndarray, border: str,
    scale: float = 1.0, shift: float = 0.0,
) -> np.ndarray:
    """(Cout, Z, Y, X) dense output of a whole (C, Z, Y, X) raw volume with its border mode."""
    fov = naive_fov(layers)
    lo = tuple((f - 1) // 2 for f in fov)
    hi = tuple(f - 1 - a for f, a in zip(fov, lo))
    padded = naive_border_pad(volume, lo, hi, border)
    x = padded.astype(np.float32) * np.float32(scale) + np.float32(shift)
    return dense_padded(layers, params, x)


def write_network(tmp: Path, layers: list[dict], params: dict, in_channels: int = 1,
                  scale: float = 1.0, shift: float = 0.0, name: str = "net") -> Path:
    """Write spec JSON + weights npz; returns the spec path."""
    np.savez(tmp / f"{name}.npz", **params)
    spec = {"name": name, "in_channels": in_channels, "weights": f"{name}.npz",
            "input": {"scale": scale, "shift": shift}, "layers": layers}
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(spec))
    return path


def slow_network(rng: np.random.Generator, width: int = 8,
                 pool: bool = True) -> tuple[list[dict], dict]:
    """conv-relu-[maxpool]-conv-tanh-conv-sigmoid, `width` channels, 2 out: heavy enough
    that a block takes tens of milliseconds on the reference backend (kill-and-resume
    tests)."""
    layers = [
        {"kind": "conv", "out_channels": width, "kernel": [3, 3, 3]}, {"kind": "relu"},
        *([{"kind": "maxpool", "window": [2, 2, 2]}] if pool else []),
        {"kind": "conv", "out_channels": width, "kernel": [3, 3, 3]}, {"kind": "tanh"},
        {"kind": "conv", "out_channels": 2, "kernel": [1, 1, 1]}, {"kind": "sigmoid"},
    ]
    convs = [i for i, layer in enumerate(layers) if layer["kind"] == "conv"]
    params = {}
    for i, (cout, cin, k) in zip(convs, ((width, 1, 3), (width, width, 3), (2, width, 1)),
                                 strict=True):
        w = rng.standard_normal((cout, cin, k, k, k)) / np.sqrt(cin * k**3)
        params[f"{i}.weight"] = w.astype(np.float32)
        params[f"{i}.bias"] = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    return layers, params


def small_network(rng: np.random.Generator, in_channels: int = 1) -> tuple[list[dict], dict]:
    """conv-relu-maxpool(2,1,2)-conv-sigmoid, anisotropic kernels: fov (6, 4, 6)."""
    layers = [
        {"kind": "conv", "out_channels": 3, "kernel": [3, 2, 3]},
        {"kind": "relu"},
        {"kind": "maxpool", "window": [2, 1, 2]},
        {"kind": "conv", "out_channels": 2, "kernel": [2, 3, 2]},
        {"kind": "sigmoid"},
    ]
    w0 = rng.standard_normal((3, in_channels, 3, 2, 3)) / np.sqrt(18 * in_channels)
    w3 = rng.standard_normal((2, 3, 2, 3, 2)) / np.sqrt(36)
    params = {
        "0.weight": w0.astype(np.float32),
        "0.bias": (0.1 * rng.standard_normal(3)).astype(np.float32),
        "3.weight": w3.astype(np.float32),
        "3.bias": (0.1 * rng.standard_normal(2)).astype(np.float32),
    }
    return layers, params


def write_volume(path: Path, volume: np.ndarray, zarr_format: int, chunks: tuple) -> str:
    import zarr

    arr = zarr.create_array(
        store=str(path), shape=volume.shape, chunks=chunks, dtype=volume.dtype,
        zarr_format=zarr_format,
    )
    arr[...] = volume
    return str(path)
