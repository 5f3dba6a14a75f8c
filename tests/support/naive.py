"""Independent brute-force references for the dense semantics (docs/design.md, "How we test").

Nothing here imports znni: the strided network is applied to every
field-of-view window separately with plain loops and scipy.
"""

from __future__ import annotations

import numpy as np
from scipy import signal


def naive_activation(x: np.ndarray, kind: str, slope: float = 0.01) -> np.ndarray:
    x = x.astype(np.float64)
    if kind == "relu":
        return np.where(x > 0, x, 0.0)
    if kind == "sigmoid":
        return 1.0 / (1.0 + np.exp(-x))
    if kind == "tanh":
        return np.tanh(x)
    if kind == "elu":
        return np.where(x > 0, x, np.exp(x) - 1.0)
    if kind == "leaky_relu":
        return np.where(x > 0, x, slope * x)
    if kind == "linear":
        return x
    raise AssertionError(kind)


def naive_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(Cin, Z, Y, X) valid cross-correlation via scipy.signal.correlate, in float64."""
    out = []
    for o in range(w.shape[0]):
        acc = sum(
            signal.correlate(x[c].astype(np.float64), w[o, c].astype(np.float64), mode="valid")
            for c in range(x.shape[0])
        )
        out.append(acc + b[o])
    return np.stack(out)


def naive_conv_batch(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`naive_conv` over each sample of (S, Cin, Z, Y, X)."""
    return np.stack([naive_conv(x[i], w, b) for i in range(x.shape[0])])


def naive_pool(x: np.ndarray, p: tuple[int, int, int]) -> np.ndarray:
    c, nz, ny, nx = x.shape
    out = np.empty((c, nz // p[0], ny // p[1], nx // p[2]))
    for i in range(out.shape[1]):
        for j in range(out.shape[2]):
            for k in range(out.shape[3]):
                out[:, i, j, k] = x[
                    :,
                    i * p[0] : (i + 1) * p[0],
                    j * p[1] : (j + 1) * p[1],
                    k * p[2] : (k + 1) * p[2],
                ].max(axis=(1, 2, 3))
    return out


def naive_strided_network(layers: list[dict], params: dict, x: np.ndarray) -> np.ndarray:
    """The ordinary (strided) network on one input window (C, Z, Y, X)."""
    for i, layer in enumerate(layers):
        kind = layer["kind"]
        if kind == "conv":
            x = naive_conv(x, params[f"{i}.weight"], params[f"{i}.bias"])
        elif kind == "maxpool":
            x = naive_pool(x, tuple(layer["window"]))
        else:
            x = naive_activation(x, kind, layer.get("slope", 0.01))
    return x


def naive_fov(layers: list[dict]) -> tuple[int, int, int]:
    fov, stride = np.ones(3, int), np.ones(3, int)
    for layer in layers:
        if layer["kind"] == "conv":
            fov += (np.array(layer["kernel"]) - 1) * stride
        elif layer["kind"] == "maxpool":
            fov += (np.array(layer["window"]) - 1) * stride
            stride *= np.array(layer["window"])
    return tuple(int(v) for v in fov)


def naive_dense(layers: list[dict], params: dict, x: np.ndarray) -> np.ndarray:
    """Dense output of a (C, Z, Y, X) patch: the strided network on every fov window."""
    fz, fy, fx = naive_fov(layers)
    _, nz, ny, nx = x.shape
    out = None
    for i in range(nz - fz + 1):
        for j in range(ny - fy + 1):
            for k in range(nx - fx + 1):
                y = naive_strided_network(layers, params, x[:, i : i + fz, j : j + fy, k : k + fx])
                if out is None:
                    out = np.empty((y.shape[0], nz - fz + 1, ny - fy + 1, nx - fx + 1))
                out[:, i, j, k] = y[:, 0, 0, 0]
    assert out is not None
    return out


def naive_dense_at(
    layers: list[dict], params: dict, x: np.ndarray, positions: list[tuple[int, int, int]]
) -> np.ndarray:
    """Dense output at chosen output positions only: (len(positions), Cout)."""
    fz, fy, fx = naive_fov(layers)
    rows = []
    for i, j, k in positions:
        y = naive_strided_network(layers, params, x[:, i : i + fz, j : j + fy, k : k + fx])
        rows.append(y[:, 0, 0, 0])
    return np.array(rows)


def naive_border_pad(volume: np.ndarray, lo: tuple, hi: tuple, mode: str) -> np.ndarray:
    """Pad the spatial axes of (C, Z, Y, X) with numpy's reflect or constant zero."""
    pad = [(0, 0)] + [(a, b) for a, b in zip(lo, hi)]
    if mode == "reflect":
        return np.pad(volume, pad, mode="reflect")
    return np.pad(volume, pad, mode="constant")


def close(out: np.ndarray, ref: np.ndarray) -> bool:
    """docs/design.md tolerance: max|out - ref| <= 1e-4 * max(1, max|ref|)."""
    if out.shape != ref.shape:
        raise AssertionError(f"shape {out.shape} != {ref.shape}")
    return float(np.max(np.abs(out - ref))) <= 1e-4 * max(1.0, float(np.max(np.abs(ref))))


def random_network(
    rng: np.random.Generator, in_channels: int, max_pools: int = 3
) -> tuple[list[dict], dict]:
    """A random small network: anisotropic kernels 1-5, pools 1-3, 0-`max_pools` pools, 1-6 channels."""
    acts = ["relu", "sigmoid", "tanh", "elu", "leaky_relu", "linear"]
    n_pools = int(rng.integers(0, max_pools + 1))
    layers: list[dict] = []
    c = in_channels
    blocks = n_pools + 1
    for b in range(blocks):
        k = [int(v) for v in rng.integers(1, 4 if b else 6, size=3)]
        layers.append({"kind": "conv", "out_channels": int(rng.integers(1, 7)), "kernel": k})
        act = acts[int(rng.integers(len(acts)))]
        layers.append({"kind": act, "slope": 0.1} if act == "leaky_relu" else {"kind": act})
        if b < n_pools:
            layers.append(
                {"kind": "maxpool", "window": [int(v) for v in rng.integers(1, 4, size=3)]}
            )
    params = {}
    for i, layer in enumerate(layers):
        if layer["kind"] == "conv":
            shape = (layer["out_channels"], c, *layer["kernel"])
            params[f"{i}.weight"] = (
                rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))
            ).astype(np.float32)
            params[f"{i}.bias"] = (0.1 * rng.standard_normal(layer["out_channels"])).astype(
                np.float32
            )
            c = layer["out_channels"]
    return layers, params
