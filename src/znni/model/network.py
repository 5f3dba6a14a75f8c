"""The network model: spec and weights, field of view, valid patch sizes, layer shapes.

A spec is the JSON file of docs/design.md; weights are the PyTorch `nn.Sequential`
state_dict as `.npz`. Everything is validated before any compute, and every
refusal is one sentence naming the layer index, the key and expected vs found.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

import numpy as np

from znni.model.spec import LayerSpec, parse_spec, read_spec_file
from znni.primitives.base import Activation, Conv, Op, Pool, Triple
from znni.primitives.fragments import fragment_size
from znni.triple import as_triple

FLOAT_BYTES = 4


@dataclass(frozen=True)
class LayerShape:
    """One layer of a dense (MPF) pass: S inputs of f images of size n -> S' of f' of n'."""

    index: int
    kind: str
    batch_in: int  # S
    channels_in: int  # f
    size_in: Triple  # n
    batch_out: int
    channels_out: int  # f'
    size_out: Triple  # n'
    kernel: Triple  # conv kernel k or pool window p; (1, 1, 1) for activations

    @property
    def direct_flops(self) -> int:
        """Multiply-adds x2 of direct conv: S*f'*f*n'^3*k^3 (ZNNi, "Direct conv")."""
        if self.kind != "conv":
            return 0
        return 2 * self.batch_in * self.channels_out * self.channels_in * prod(
            self.size_out
        ) * prod(self.kernel)

    @property
    def in_bytes(self) -> int:
        return self.batch_in * self.channels_in * prod(self.size_in) * FLOAT_BYTES

    @property
    def out_bytes(self) -> int:
        return self.batch_out * self.channels_out * prod(self.size_out) * FLOAT_BYTES


@dataclass(frozen=True, eq=False)
class Network:
    """A validated network with its weights, ready to hand to the primitives."""

    name: str
    in_channels: int
    input_scale: float
    input_shift: float
    layers: tuple[LayerSpec, ...]
    ops: tuple[Op, ...]
    digest: str  # sha256 over the canonical spec and the weights

    @property
    def out_channels(self) -> int:
        return next(op.out_channels for op in reversed(self.ops) if isinstance(op, Conv))

    @property
    def fov(self) -> Triple:
        """1 + sum of (k-1)*s over convs and (p-1)*s over pools, s = product of earlier pools."""
        fov = [1, 1, 1]
        stride = [1, 1, 1]
        for op in self.ops:
            if isinstance(op, Conv | Pool):
                size = op.kernel if isinstance(op, Conv) else op.window
                for d in range(3):
                    fov[d] += (size[d] - 1) * stride[d]
                if isinstance(op, Pool):
                    stride = [s * p for s, p in zip(stride, op.window, strict=True)]
        return (fov[0], fov[1], fov[2])

    @property
    def pool_product(self) -> Triple:
        """P per axis: dense output sizes of one MPF pass are multiples of P."""
        windows = [op.window for op in self.ops if isinstance(op, Pool)]
        return as_triple(prod(w[d] for w in windows) for d in range(3))

    def input_size_for(self, min_output: Triple) -> Triple:
        """Smallest valid MPF patch input size whose dense output covers `min_output`."""
        out = []
        for d in range(3):
            p = self.pool_product[d]
            j = max(1, -(-min_output[d] // p))
            out.append(self.fov[d] - 1 + p * j)
        return (out[0], out[1], out[2])

    def output_size(self, input_size: Triple) -> Triple:
        """Dense output size of a patch; raises ValueError if the size is not MPF-valid."""
        self.layer_shapes(input_size)
        return as_triple(n - f + 1 for n, f in zip(input_size, self.fov, strict=True))

    def is_valid_input_size(self, input_size: Triple) -> bool:
        try:
            self.layer_shapes(input_size)
        except ValueError:
            return False
        return True

    def layer_shapes(self, input_size: Triple, batch: int = 1) -> list[LayerShape]:
        """Shapes of every layer of a dense MPF pass over a patch of `input_size`."""
        shapes: list[LayerShape] = []
        s, c, n = batch, self.in_channels, as_triple(input_size)
        for i, op in enumerate(self.ops):
            if isinstance(op, Conv):
                n2 = as_triple(a - k + 1 for a, k in zip(n, op.kernel, strict=True))
                if min(n2) < 1:
                    raise ValueError(
                        f"patch size {tuple(input_size)} is too small for layer {i} "
                        f"(kernel {op.kernel} on size {n})"
                    )
                shapes.append(LayerShape(i, "conv", s, c, n, s, op.out_channels, n2, op.kernel))
                c = op.out_channels
            elif isinstance(op, Pool):
                try:
                    n2 = as_triple(fragment_size(a, p) for a, p in zip(n, op.window, strict=True))
                except ValueError as e:
                    raise ValueError(f"patch size {tuple(input_size)} at layer {i}: {e}") from e
                s2 = s * prod(op.window)
                shapes.append(LayerShape(i, "maxpool", s, c, n, s2, c, n2, op.window))
                s = s2
            else:
                shapes.append(LayerShape(i, op.kind, s, c, n, s, c, n, (1, 1, 1)))
            n = n2 if not isinstance(op, Activation) else n
        return shapes


def load_network(spec_path: str | Path, weights_path: str | Path | None = None) -> Network:
    """Load and validate a spec and its weights; raises ValueError naming what is wrong."""
    spec_path = Path(spec_path)
    raw = read_spec_file(spec_path)
    spec = parse_spec(raw, spec_path)
    if weights_path is None:
        if spec.weights is None:
            raise ValueError(f"{spec_path}: no 'weights' in the spec and no --weights given")
        weights_path = spec_path.parent / spec.weights
    weights = read_weights(Path(weights_path))
    ops = build_ops(spec.layers, spec.in_channels, weights, Path(weights_path))
    digest = hashlib.sha256(spec.canonical_json().encode())
    for key in sorted(weights):
        digest.update(key.encode())
        digest.update(np.ascontiguousarray(weights[key], dtype=np.float32).tobytes())
    return Network(
        name=spec.name,
        in_channels=spec.in_channels,
        input_scale=spec.scale,
        input_shift=spec.shift,
        layers=spec.layers,
        ops=tuple(ops),
        digest=digest.hexdigest(),
    )


def read_weights(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise ValueError(f"weights file {path} does not exist")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError) as e:
        raise ValueError(f"weights file {path} is not a readable .npz file ({e})") from e


def build_ops(
    layers: tuple[LayerSpec, ...], in_channels: int, weights: dict[str, np.ndarray], path: Path
) -> list[Op]:
    """Turn layer specs plus weights into primitive ops, checking every key and shape."""
    ops: list[Op] = []
    expected: set[str] = set()
    channels = in_channels
    for i, layer in enumerate(layers):
        if layer.kind == "conv":
            assert layer.kernel is not None and layer.out_channels is not None
            w_shape = (layer.out_channels, channels, *layer.kernel)
            w = _weight(weights, f"{i}.weight", w_shape, path, i)
            b = _weight(weights, f"{i}.bias", (layer.out_channels,), path, i)
            expected |= {f"{i}.weight", f"{i}.bias"}
            ops.append(Conv(w, b))
            channels = layer.out_channels
        elif layer.kind == "maxpool":
            assert layer.window is not None
            ops.append(Pool(layer.window))
        else:
            ops.append(Activation(layer.kind, layer.slope))
    extra = sorted(set(weights) - expected)
    if extra:
        raise ValueError(
            f"weights file {path}: unexpected key {extra[0]!r} (no conv layer has that index)"
        )
    return ops


def _weight(
    weights: dict[str, np.ndarray], key: str, shape: tuple[int, ...], path: Path, i: int
) -> np.ndarray:
    if key not in weights:
        raise ValueError(f"weights file {path}: layer {i} (conv) needs key {key!r}, not found")
    arr = weights[key]
    if tuple(arr.shape) != shape:
        raise ValueError(
            f"weights file {path}: layer {i} key {key!r} has shape {tuple(arr.shape)}, "
            f"expected {shape}"
        )
    if not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(
            f"weights file {path}: layer {i} key {key!r} has dtype {arr.dtype}, expected a float"
        )
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"weights file {path}: layer {i} key {key!r} contains NaN or infinity")
    return np.ascontiguousarray(arr, dtype=np.float32)


def network_shapes_only(raw: dict[str, Any], where: str = "<spec>") -> Network:
    """A Network from a spec dict with zero weights that take no memory (broadcast views).

    For planning, which needs only shapes: `znni plan` on a spec whose weights
    are absent, and the planner's tests and benchmarks. Never for inference.
    """
    spec = parse_spec(raw, Path(where))
    weights: dict[str, np.ndarray] = {}
    channels = spec.in_channels
    for i, layer in enumerate(spec.layers):
        if layer.kind == "conv":
            assert layer.kernel is not None and layer.out_channels is not None
            shape = (layer.out_channels, channels, *layer.kernel)
            weights[f"{i}.weight"] = np.broadcast_to(np.float32(0), shape)
            weights[f"{i}.bias"] = np.broadcast_to(np.float32(0), (layer.out_channels,))
            channels = layer.out_channels
    ops = build_ops(spec.layers, spec.in_channels, weights, Path(where))
    digest = hashlib.sha256(("shapes-only:" + spec.canonical_json()).encode()).hexdigest()
    return Network(spec.name, spec.in_channels, spec.scale, spec.shift, spec.layers, tuple(ops),
                   digest)
