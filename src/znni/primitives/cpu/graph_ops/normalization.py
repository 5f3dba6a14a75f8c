"""Instance, group and batch normalization, and folding BatchNorm into a Conv.

Statistics take two float32 passes (mean, then the variance of the centred
copy): one-pass E[x^2] - E[x]^2 in float32 loses the variance when
|mean| >> std, which happens on raw EM intensities. Inference BatchNorm is a
per-channel affine map, and after a Conv it folds into the weights for free.
"""

from __future__ import annotations

import numpy as np

from znni.primitives.cpu.graph_ops._args import as_volume, channel_vector


def _normalize(
    x: np.ndarray,
    groups: int,
    scale: np.ndarray | None,
    bias: np.ndarray | None,
    epsilon: float,
) -> np.ndarray:
    """(x - mean) / sqrt(biased var + eps) per (n, group), then the per-channel affine.

    Float32 passes over the volume: a pairwise-summed mean, the centred copy (which
    becomes the output), its residual mean and per-row BLAS dot products (the
    corrected two-pass variance), then the scale and the shift in place. No
    float64 or squared temporary of the volume is made.
    """
    n, c = x.shape[:2]
    rows = x.reshape(n * groups, -1)  # (N*G, C/G*Z*Y*X)
    size = rows.shape[1]
    centred = rows - rows.sum(axis=1, keepdims=True) / np.float32(size)
    # the float32 mean is off by a residual that is tiny next to the spread: measure it
    resid = centred.sum(axis=1).astype(np.float64) / size  # (N*G,)
    sq = np.array([np.dot(r, r) for r in centred], dtype=np.float64)  # (N*G,)
    inv = 1.0 / np.sqrt(np.maximum(sq / size - resid**2, 0.0) + epsilon)
    per_channel = c // groups
    factor = np.repeat(inv, per_channel).reshape(n, c)  # (N, C): each channel's group
    shift = -np.repeat(resid * inv, per_channel).reshape(n, c)
    if scale is not None:
        factor, shift = factor * scale[None, :], shift * scale[None, :]
    if bias is not None:
        shift = shift + bias[None, :]
    y = centred.reshape(n * c, -1)  # (N*C, Z*Y*X)
    y *= factor.astype(np.float32).reshape(n * c, 1)
    y += shift.astype(np.float32).reshape(n * c, 1)
    return y.reshape(x.shape)


def _epsilon(epsilon: float) -> float:
    eps = float(epsilon)
    if not eps >= 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon!r}")
    return eps


def instance_norm(
    x: np.ndarray, scale: np.ndarray | None, bias: np.ndarray | None, epsilon: float = 1e-5
) -> np.ndarray:
    """ONNX InstanceNormalization: per (n, c) over Z, Y, X, biased variance -> float32."""
    x = as_volume(x)
    n, c = x.shape[:2]
    sc, b = channel_vector(scale, c, "scale"), channel_vector(bias, c, "bias")
    return _normalize(x, c, sc, b, _epsilon(epsilon))


def group_norm(
    x: np.ndarray,
    num_groups: int,
    scale: np.ndarray | None,
    bias: np.ndarray | None,
    epsilon: float = 1e-5,
) -> np.ndarray:
    """torch GroupNorm: stats over (C/G, Z, Y, X) per (n, group), per-channel affine."""
    x = as_volume(x)
    n, c = x.shape[:2]
    g = int(num_groups)
    if g < 1 or c % g:
        raise ValueError(f"num_groups={num_groups} must be >= 1 and divide C={c}")
    sc, b = channel_vector(scale, c, "scale"), channel_vector(bias, c, "bias")
    return _normalize(x, g, sc, b, _epsilon(epsilon))


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
    conv_b = np.zeros(cout) if bias is None else np.asarray(bias, np.float64).reshape(-1)
    if conv_b.size != cout:
        raise ValueError(f"bias must have {cout} entries, got shape {np.shape(bias)}")
    w_f = w * a.reshape((cout,) + (1,) * (w.ndim - 1))
    return w_f.astype(np.float32), (conv_b * a + b).astype(np.float32)
