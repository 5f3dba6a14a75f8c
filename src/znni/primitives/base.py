"""The primitives' interface and the layer-op values passed to it.

Every backend (reference numpy, fast CPU, GPU) implements `Backend`; the
layer ops are plain frozen values so a network can be handed down without
the planner's spec types leaking into `primitives/`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from znni.triple import Triple as Triple  # re-exported: primitives' code imports it here

ACTIVATION_KINDS = ("relu", "sigmoid", "tanh", "elu", "leaky_relu", "linear")


@dataclass(frozen=True, eq=False)
class Conv:
    """Valid 3D cross-correlation, stride 1, with bias (PyTorch Conv3d, no padding)."""

    weight: np.ndarray  # (Cout, Cin, kz, ky, kx) float32
    bias: np.ndarray  # (Cout,) float32

    @property
    def kernel(self) -> Triple:
        kz, ky, kx = self.weight.shape[2:]
        return (int(kz), int(ky), int(kx))

    @property
    def in_channels(self) -> int:
        return int(self.weight.shape[1])

    @property
    def out_channels(self) -> int:
        return int(self.weight.shape[0])


@dataclass(frozen=True)
class Pool:
    """Max-pool with window p and stride p; applied densely as MPF."""

    window: Triple


@dataclass(frozen=True, eq=False)
class InstanceNorm:
    """ONNX InstanceNormalization, as a conv primitive may apply it to its output: per
    (n, c) over Z, Y, X, (y - mean) / sqrt(biased var + epsilon) * scale + bias."""

    scale: np.ndarray | None  # (Cout,) or None
    bias: np.ndarray | None  # (Cout,) or None
    epsilon: float

    def digest(self, h: Any) -> None:
        """Feed its values to hashlib object `h` (caches keyed by the norm)."""
        for v in (self.scale, self.bias):
            h.update(b"-" if v is None else np.asarray(v, np.float32).tobytes())
        h.update(repr(float(self.epsilon)).encode())


class ConvStep(NamedTuple):
    """One conv of a chain that a backend runs in one call (model.openvino_layers.openvino_chains):
    its zero pads (z, y, x before, then after), weights, the instance norm it applies (or
    None) and then its activation (or None)."""

    pads: tuple[int, ...]
    weight: np.ndarray
    bias: np.ndarray
    act: Activation | None = None
    norm: InstanceNorm | None = None


@dataclass(frozen=True)
class Activation:
    """An element-wise activation; `slope` is used by leaky_relu only."""

    kind: str
    slope: float = 0.01

    def __post_init__(self) -> None:
        if self.kind not in ACTIVATION_KINDS:
            raise ValueError(
                f"unknown activation {self.kind!r}; expected one of {', '.join(ACTIVATION_KINDS)}"
            )


Op = Conv | Pool | Activation


@runtime_checkable
class Backend(Protocol):
    """What a compute backend provides. Arrays are (S, C, Z, Y, X) float32 batches."""

    name: str

    def conv3d(
        self,
        x: np.ndarray,
        weight: np.ndarray,
        bias: np.ndarray,
        activation: Activation | None = None,
        primitive: str | None = None,
    ) -> np.ndarray:
        """(S, Cin, Z, Y, X) -> (S, Cout, Z-kz+1, Y-ky+1, X-kx+1), bias and activation fused.

        `primitive` names the algorithm a plan chose for this layer (e.g. "direct",
        "fft-keep", "fft-recompute"); None lets the backend choose.
        """
        ...

    def maxpool(self, x: np.ndarray, window: Triple) -> np.ndarray:
        """Strided max-pool: (S, C, Z, Y, X) -> (S, C, Z//pz, Y//py, X//px)."""
        ...

    def mpf(self, x: np.ndarray, window: Triple) -> np.ndarray:
        """Max-pooling fragments: (S, C, Z, Y, X) -> (S*pz*py*px, C, (Z+1)//pz-1, ...)."""
        ...

    def activation(self, x: np.ndarray, activation: Activation) -> np.ndarray:
        """Element-wise activation; may work in place and return `x`."""
        ...
