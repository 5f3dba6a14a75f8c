"""Instance, group and batch normalization, and folding BatchNorm into a Conv.

Instance and group norm read the volume twice, in cache-sized tiles on all cores
(`_rowwise`): once for per-row moments, each tile centred on its own mean and
merged in float64 (one-pass E[x^2] - E[x]^2 in float32 loses the variance when
|mean| >> std, which happens on raw EM intensities), once for the fused affine
map and the following activation, in place when the caller allows. Inference
BatchNorm is a per-channel affine map, and after a Conv it folds into the
weights for free.
"""

from __future__ import annotations

import numpy as np

from znni.primitives.base import Activation
from znni.primitives.cpu.graph_ops._rowwise import affine_rows, row_moments
from znni.primitives.graph_args import as_volume, channel_vector


def _normalize(
    x: np.ndarray,
    groups: int,
    scale: np.ndarray | None,
    bias: np.ndarray | None,
    epsilon: float,
    activation: Activation | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """act((x - mean) / sqrt(biased var + eps) * scale + bias) per (n, group) -> float32.

    Rows far from zero (|mean| > std) are shifted by their float32 mean before the
    scale, so the float32 products never cancel; the shift's rounding goes into the
    (float64-computed) offset.
    """
    n, c = x.shape[:2]
    x = np.ascontiguousarray(x)
    mean, var = row_moments(x.reshape(n * groups, -1))  # (N*G,) each
    inv = 1.0 / np.sqrt(var + epsilon)
    centre = np.where(np.abs(mean) * inv > 1.0, mean.astype(np.float32), 0.0)  # (N*G,)
    per_channel = c // groups
    inv_c, mean_c, centre_c = (  # (N, C): each channel's group
        np.repeat(v, per_channel).reshape(n, c) for v in (inv, mean, centre)
    )
    factor = inv_c if scale is None else inv_c * scale[None, :]
    shift = (centre_c - mean_c) * factor
    if bias is not None:
        shift = shift + bias[None, :]
    dst = np.empty(x.shape, np.float32) if out is None else out
    shifted = centre_c.reshape(-1) if centre.any() else None  # (N*C,)
    rows, dst_rows = x.reshape(n * c, -1), dst.reshape(n * c, -1)  # (N*C, Z*Y*X)
    affine_rows(rows, dst_rows, factor.reshape(-1), shift.reshape(-1), shifted, activation)
    return dst


def _epsilon(epsilon: float) -> float:
    eps = float(epsilon)
    if not eps >= 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon!r}")
    return eps


def _out(x: np.ndarray, out: np.ndarray | None) -> np.ndarray | None:
    """`out` checked as a destination for x's result (x itself allowed: in place)."""
    if out is None:
        return None
    if out.shape != x.shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(
            f"out must be a C-contiguous float32 array of shape {x.shape}, "
            f"got {out.dtype} {out.shape}"
        )
    if out is not x and np.shares_memory(out, x):
        raise ValueError("out overlaps x without being x")
    return out


def instance_norm(
    x: np.ndarray,
    scale: np.ndarray | None,
    bias: np.ndarray | None,
    epsilon: float = 1e-5,
    *,
    activation: Activation | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """ONNX InstanceNormalization: per (n, c) over Z, Y, X, biased variance -> float32.

    `activation` is applied to the result in the same pass; `out` (which may be x
    itself, when the caller no longer needs x) receives it instead of a new array."""
    x = as_volume(x)
    n, c = x.shape[:2]
    sc, b = channel_vector(scale, c, "scale"), channel_vector(bias, c, "bias")
    return _normalize(x, c, sc, b, _epsilon(epsilon), activation, _out(x, out))


def group_norm(
    x: np.ndarray,
    num_groups: int,
    scale: np.ndarray | None,
    bias: np.ndarray | None,
    epsilon: float = 1e-5,
    *,
    activation: Activation | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """torch GroupNorm: stats over (C/G, Z, Y, X) per (n, group), per-channel affine.

    `activation` and `out` as for `instance_norm`."""
    x = as_volume(x)
    n, c = x.shape[:2]
    g = int(num_groups)
    if g < 1 or c % g:
        raise ValueError(f"num_groups={num_groups} must be >= 1 and divide C={c}")
    sc, b = channel_vector(scale, c, "scale"), channel_vector(bias, c, "bias")
    return _normalize(x, g, sc, b, _epsilon(epsilon), activation, _out(x, out))


def _bn_coefficients(
    c: int,
    scale: np.ndarray,
    bias: np.ndarray,
    mean: np.ndarray,
    var: np.ndarray,
    epsilon: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel (a, b) in float64 with BN(x) = a * x + b."""
    params = {"scale": scale, "bias": bias, "mean": mean, "var": var}
    vec = {}
    for name, v in params.items():
        arr = np.asarray(v, dtype=np.float64).reshape(-1)
        if arr.size != c:
            raise ValueError(f"{name} must have {c} entries, got shape {np.shape(v)}")
        vec[name] = arr
    if np.any(vec["var"] + _epsilon(epsilon) <= 0):
        raise ValueError(f"var + epsilon must be > 0, got min var {vec['var'].min()}")
    a = vec["scale"] / np.sqrt(vec["var"] + epsilon)
    return a, vec["bias"] - vec["mean"] * a


def batch_norm(
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    mean: np.ndarray,
    var: np.ndarray,
    epsilon: float = 1e-5,
) -> np.ndarray:
    """Inference BatchNormalization with running statistics -> float32."""
    x = as_volume(x)
    a, b = _bn_coefficients(x.shape[1], scale, bias, mean, var, epsilon)
    y = x * a.astype(np.float32)[None, :, None, None, None]
    y += b.astype(np.float32)[None, :, None, None, None]
    return y


def fold_batch_norm_into_conv(
    weight: np.ndarray,
    bias: np.ndarray | None,
    scale: np.ndarray,
    bn_bias: np.ndarray,
    mean: np.ndarray,
    var: np.ndarray,
    epsilon: float = 1e-5,
) -> tuple[np.ndarray, np.ndarray]:
    """(weight, bias) of Conv -> BatchNorm as one Conv; weight is (Cout, ...), float32 out."""
    w = np.asarray(weight, dtype=np.float64)
    if w.ndim < 2:
        raise ValueError(f"weight must be (Cout, Cin/groups, ...), got shape {w.shape}")
    cout = w.shape[0]
    a, b = _bn_coefficients(cout, scale, bn_bias, mean, var, epsilon)
    if bias is None:
        conv_b = np.zeros(cout)
    else:
        conv_b = np.asarray(bias, np.float64).reshape(-1)
        if conv_b.size != cout:
            raise ValueError(f"bias must have {cout} entries, got shape {np.shape(bias)}")
    w_f = w * a.reshape((cout,) + (1,) * (w.ndim - 1))
    return w_f.astype(np.float32), (conv_b * a + b).astype(np.float32)
