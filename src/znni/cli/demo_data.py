"""A synthetic EM-like volume and a hand-set membrane-detector network for `znni demo`.

The volume is a Voronoi tessellation of cells with bright, slightly varying
interiors, dark membranes, blur and noise, anisotropic like serial-section EM.
The network is small and hand-set: a local-darkness filter and an in-plane
valley (positive Laplacian) filter, a max-pool, and a combining layer with a
sigmoid, so its output is a boundary probability that visibly means something.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

DEMO_SHAPE = (64, 192, 192)
VOXEL_SIZE = (3.0, 1.0, 1.0)  # z is coarser, as in serial-section EM


def synthetic_em(
    shape: tuple[int, int, int] = DEMO_SHAPE, n_cells: int = 70, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Return (uint8 image, bool true-membrane mask)."""
    rng = np.random.default_rng(seed)
    seeds = rng.uniform(0, 1, size=(n_cells, 3)) * np.array(shape)
    axes = [np.arange(n, dtype=np.float64) for n in shape]
    best = np.full(shape, np.inf, np.float32)
    second = np.full(shape, np.inf, np.float32)
    label = np.zeros(shape, np.int32)
    d2 = np.empty(shape, np.float64)
    d = np.empty(shape, np.float32)
    for i, s in enumerate(seeds):
        # squared distance per axis, broadcast: a (Z, Y, X, 3) grid per cell took 12 s
        dz2, dy2, dx2 = (((a - c) * v) ** 2 for a, c, v in zip(axes, s, VOXEL_SIZE, strict=True))
        np.add(dz2[:, None, None], dy2[None, :, None], out=d2)  # (Z, Y, X)
        d2 += dx2[None, None, :]
        np.copyto(d, np.sqrt(d2, out=d2), casting="same_kind")
        closer = d < best
        np.minimum(second, d, out=second)
        np.copyto(second, best, where=closer)  # the old nearest becomes the second
        np.copyto(label, i, where=closer)
        np.minimum(best, d, out=best)
    membrane = (second - best) < 2.2
    interior = rng.uniform(165, 205, n_cells)[label]
    image = np.where(membrane, 55.0, interior)
    image = _box_blur(image, (1, 3, 3))
    image += rng.normal(0, 16, shape)
    return np.clip(np.rint(image), 0, 255).astype(np.uint8), membrane


def _box_blur(a: np.ndarray, size: tuple[int, int, int]) -> np.ndarray:
    """Separable box filter with edge padding (cumulative sums), same shape."""
    for axis, k in enumerate(size):
        if k == 1:
            continue
        pad = [(0, 0)] * 3
        pad[axis] = (k // 2, k // 2)
        c = np.cumsum(np.pad(a, pad, mode="edge"), axis=axis)
        c = np.concatenate([np.zeros_like(c.take([0], axis=axis)), c], axis=axis)
        n = a.shape[axis]
        a = (c.take(range(k, n + k), axis=axis) - c.take(range(0, n), axis=axis)) / k
    return a


def demo_network() -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The hand-set membrane detector: (spec dict, weights dict in state_dict layout)."""
    spec = {
        "name": "demo-membranes",
        "in_channels": 1,
        "weights": "demo-membranes.npz",
        "input": {"scale": 1 / 255, "shift": 0.0},
        "layers": [
            {"kind": "conv", "out_channels": 2, "kernel": [1, 3, 3]},
            {"kind": "relu"},
            {"kind": "maxpool", "window": [1, 2, 2]},
            {"kind": "conv", "out_channels": 1, "kernel": [3, 3, 3]},
            {"kind": "sigmoid"},
        ],
    }
    w0 = np.zeros((2, 1, 1, 3, 3), np.float32)
    w0[0, 0, 0] = -1.0 / 9  # local darkness: relu(0.5 - mean)
    w0[1, 0, 0] = [[0, 1, 0], [1, -4, 1], [0, 1, 0]]  # valley: positive in-plane Laplacian
    b0 = np.array([0.5, 0.0], np.float32)
    w1 = np.zeros((1, 2, 3, 3, 3), np.float32)
    w1[0, 0] = 24.0 / 27  # smoothed darkness evidence
    w1[0, 1] = 6.0 / 27  # smoothed valley evidence
    b1 = np.array([-4.5], np.float32)
    weights = {"0.weight": w0, "0.bias": b0, "3.weight": w1, "3.bias": b1}
    return spec, weights


def write_demo_network(directory: Path) -> Path:
    spec, weights = demo_network()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "demo-membranes.json"
    path.write_text(json.dumps(spec, indent=2) + "\n")
    npz = directory / spec["weights"]
    np.savez(npz, **weights)  # type: ignore[arg-type]  # numpy's stub: a key may be allow_pickle
    return path
