"""bioimage.io pre- and postprocessing as small picklable values (format 0.5 semantics).

Each op maps a (C, Z, Y, X) float32 array to another, voxel by voxel with fixed
parameters, so the engine can apply it to any block or window. Ops whose parameters are
statistics of the input (mean, std, percentiles: `zero_mean_unit_variance`,
`scale_range`, `clip` with percentiles) name the `Stat`s they need and are `resolve`d
with values that a first pass over the whole volume (or ROI) computed: the volume is the
sample, as bioimage.io's own runner takes the whole input tensor. As in bioimageio.core,
statistics are of the unprocessed input tensor (taken before the first op).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

Values = dict[str, tuple[float, ...]]  # Stat.key() -> one value, or one per channel


@dataclass(frozen=True)
class Stat:
    """A statistic of the raw input: over all voxels per channel, or over all channels."""

    kind: str  # "mean" | "std" (population, ddof 0) | "percentile"
    q: float = 0.0  # percentile in [0, 100]
    joint: bool = False  # over every channel together (one value), else one per channel

    def key(self) -> str:
        where = "joint" if self.joint else "channel"
        return f"{self.kind}:{self.q!r}:{where}" if self.kind == "percentile" \
            else f"{self.kind}:{where}"


def _per_channel(values: tuple[float, ...]) -> np.ndarray:
    """(C, 1, 1, 1) or (1, 1, 1, 1) float32 parameters that broadcast over (C, Z, Y, X)."""
    return np.asarray(values, np.float32).reshape(-1, 1, 1, 1)


@dataclass(frozen=True)
class Op:
    """One processing step; `name` is the spec's id."""

    name: str

    def needs(self) -> tuple[Stat, ...]:
        return ()

    def resolve(self, values: Values) -> Op:
        return self

    def __call__(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def record(self) -> dict[str, Any]:
        """The op and its (resolved) parameters, for the output's provenance."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class ScaleLinear(Op):
    """scale_linear: x * gain + offset (per channel when given per channel)."""

    gain: tuple[float, ...] = (1.0,)
    offset: tuple[float, ...] = (0.0,)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return (x * _per_channel(self.gain) + _per_channel(self.offset)).astype(np.float32)


@dataclass(frozen=True)
class ZeroMeanUnitVariance(Op):
    """(x - mean) / (std + eps); mean and std fixed, or statistics (joint or per channel).
    fixed_zero_mean_unit_variance has eps 0 (the spec: divide by the given std)."""

    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    eps: float = 1e-6
    joint: bool = False

    def needs(self) -> tuple[Stat, ...]:
        if self.mean is not None:
            return ()
        return (Stat("mean", joint=self.joint), Stat("std", joint=self.joint))

    def resolve(self, values: Values) -> Op:
        if self.mean is not None:
            return self
        mean, std = (values[s.key()] for s in self.needs())
        return replace(self, mean=mean, std=std)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.mean is None or self.std is None:
            raise ValueError(f"{self.name} was not given its statistics")
        std = _per_channel(self.std) + np.float32(self.eps)
        return ((x - _per_channel(self.mean)) / std).astype(np.float32)


@dataclass(frozen=True)
class ScaleRange(Op):
    """(x - lower) / (upper - lower + eps), lower and upper the input's percentiles."""

    min_percentile: float = 0.0
    max_percentile: float = 100.0
    eps: float = 1e-6
    joint: bool = False
    lower: tuple[float, ...] | None = None
    upper: tuple[float, ...] | None = None

    def needs(self) -> tuple[Stat, ...]:
        return (Stat("percentile", self.min_percentile, self.joint),
                Stat("percentile", self.max_percentile, self.joint))

    def resolve(self, values: Values) -> Op:
        lower, upper = (values[s.key()] for s in self.needs())
        return replace(self, lower=lower, upper=upper)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.lower is None or self.upper is None:
            raise ValueError(f"{self.name} was not given its statistics")
        lo, hi = _per_channel(self.lower), _per_channel(self.upper)
        return ((x - lo) / (hi - lo + np.float32(self.eps))).astype(np.float32)


@dataclass(frozen=True)
class Clip(Op):
    """clip to [min, max]; either bound fixed, or the input's percentile, or absent."""

    min: tuple[float, ...] | None = None
    max: tuple[float, ...] | None = None
    min_percentile: float | None = None
    max_percentile: float | None = None
    joint: bool = False

    def needs(self) -> tuple[Stat, ...]:
        return tuple(Stat("percentile", q, self.joint)
                     for q, v in ((self.min_percentile, self.min), (self.max_percentile, self.max))
                     if q is not None and v is None)

    def resolve(self, values: Values) -> Op:
        out = self
        if self.min_percentile is not None and self.min is None:
            out = replace(out, min=values[Stat("percentile", self.min_percentile,
                                               self.joint).key()])
        if self.max_percentile is not None and self.max is None:
            out = replace(out, max=values[Stat("percentile", self.max_percentile,
                                               self.joint).key()])
        return out

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.needs():
            raise ValueError(f"{self.name} was not given its statistics")
        lo = None if self.min is None else _per_channel(self.min)
        hi = None if self.max is None else _per_channel(self.max)
        return np.clip(x, lo, hi).astype(np.float32)


@dataclass(frozen=True)
class Binarize(Op):
    """1 where x > threshold, else 0 (per channel when given per channel)."""

    threshold: tuple[float, ...] = (0.5,)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return (x > _per_channel(self.threshold)).astype(np.float32)


@dataclass(frozen=True)
class Sigmoid(Op):
    """1 / (1 + exp(-x))."""

    def __call__(self, x: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            return (np.float32(1) / (np.float32(1) + np.exp(-x))).astype(np.float32)


@dataclass(frozen=True)
class Softmax(Op):
    """softmax over the channel axis (voxel by voxel)."""

    def __call__(self, x: np.ndarray) -> np.ndarray:
        e = np.exp(x - x.max(axis=0, keepdims=True))
        return (e / e.sum(axis=0, keepdims=True)).astype(np.float32)


@dataclass(frozen=True)
class EnsureDtype(Op):
    """Cast to `dtype` (numpy's astype: floats to integers truncate towards zero), then back
    to float32, the engine's arithmetic type."""

    dtype: str = "float32"

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if self.dtype == "float32":
            return x
        return x.astype(self.dtype).astype(np.float32)


def apply_chain(ops: tuple[Op, ...], x: np.ndarray) -> np.ndarray:
    """`x` (C, Z, Y, X) float32 through the (resolved) ops in order."""
    for op in ops:
        x = op(x)
    return x


def needed_stats(ops: tuple[Op, ...]) -> tuple[Stat, ...]:
    """Every statistic the chain needs, each once, in order."""
    seen: dict[str, Stat] = {}
    for op in ops:
        for s in op.needs():
            seen.setdefault(s.key(), s)
    return tuple(seen.values())


def resolve_chain(ops: tuple[Op, ...], values: Values) -> tuple[Op, ...]:
    """The chain with its statistics filled in from `values` (Stat.key() -> values)."""
    return tuple(op.resolve(values) for op in ops)
