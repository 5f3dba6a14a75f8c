"""Element-wise activations that ONNX graphs use beyond ReLU/sigmoid/tanh.

All take and return float32 (input is cast once); scalar parameters are cast to
float32 so a Python float never promotes the volume to float64.
"""

from __future__ import annotations

import numpy as np

from znni.primitives.activations import SELU_ALPHA, SELU_GAMMA


def _f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def prelu(x: np.ndarray, slope: np.ndarray | float) -> np.ndarray:
    """x if x >= 0 else slope[c] * x; slope scalar, (C,) or (C, 1, 1, 1) on channel axis 1."""
    x = _f32(x)
    s = np.asarray(slope, dtype=np.float32)
    if s.size == 1:
        s = s.reshape(())
    else:
        c = x.shape[1] if x.ndim >= 2 else None
        if x.ndim < 2 or s.size != c or s.squeeze().ndim != 1:
            raise ValueError(
                f"slope of shape {s.shape} is neither scalar nor per-channel for x {x.shape}"
            )
        s = s.reshape((c,) + (1,) * (x.ndim - 2))
    y = np.multiply(x, s, dtype=np.float32)
    if np.all(s <= 1):  # then slope*x <= x exactly where x >= 0: two passes, no temporaries
        return np.maximum(x, y, out=y)
    return np.where(x >= 0, x, y)


def elu(x: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    """x if x > 0 else alpha * (exp(x) - 1)."""
    x = _f32(x)
    return np.where(x > 0, x, np.float32(alpha) * np.expm1(np.minimum(x, 0)))


def selu(x: np.ndarray) -> np.ndarray:
    """gamma * (x if x > 0 else alpha * (exp(x) - 1)) with the self-normalizing constants."""
    y = elu(x, SELU_ALPHA)
    y *= np.float32(SELU_GAMMA)
    return y


def leaky_relu(x: np.ndarray, alpha: float = 0.01) -> np.ndarray:
    """x if x >= 0 else alpha * x."""
    x = _f32(x)
    return np.where(x >= 0, x, x * np.float32(alpha))


def softmax_channels(x: np.ndarray) -> np.ndarray:
    """Softmax over axis 1 (channels), shifted by the channel max so exp cannot overflow."""
    x = _f32(x)
    if x.ndim < 2:
        raise ValueError(f"x must have a channel axis 1, got shape {x.shape}")
    e = x - x.max(axis=1, keepdims=True)
    np.exp(e, out=e)
    e /= e.sum(axis=1, keepdims=True)
    return e


def clip(x: np.ndarray, lo: float | None = None, hi: float | None = None) -> np.ndarray:
    """min(max(x, lo), hi); a None bound is open (so lo > hi gives hi, as ONNX/torch)."""
    y = np.array(x, dtype=np.float32)  # a copy: the result never aliases x
    if lo is not None:
        np.maximum(y, np.float32(lo), out=y)
    if hi is not None:
        np.minimum(y, np.float32(hi), out=y)
    return y
