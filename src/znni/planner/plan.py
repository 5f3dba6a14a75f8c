"""The `Plan` value: what the planner decided (`search.make_plan` makes one).

A plan says which device algorithm runs (cpu, gpu, gpu-ram, cpu-gpu), the
MPF patch size and batch, the split op, each layer's primitive with its
predicted seconds and bytes, and the predicted throughput. It is frozen and
JSON-serialisable so the engine and the job store can record what they ran.

`split_op` (cpu-gpu and gpu-ram only) is the index of the first op after the
split: ops [0, split_op) run on the CPU (cpu-gpu) or are streamed through
host RAM in chunks (gpu-ram); ops [split_op, end) run on the GPU on the whole
batch of fragments. The engine's CPU-GPU pipeline takes the same index.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from znni.planner.blocks import Edges
from znni.triple import Triple, as_triple

# how a plan runs (module docstring); one closed set, so a misspelt name fails the type
# check and `ALGORITHMS` cannot drift from it
Algorithm = Literal["cpu", "gpu", "gpu-ram", "cpu-gpu"]
ALGORITHMS: tuple[Algorithm, ...] = get_args(Algorithm)
# what a caller may ask `make_plan` for: one device, or "auto" (every algorithm)
DeviceChoice = Literal["auto", "cpu", "gpu", "cpu-gpu"]
DEVICE_ALGORITHMS: dict[DeviceChoice, tuple[Algorithm, ...]] = {
    "auto": ALGORITHMS,
    "cpu": ("cpu",),
    "gpu": ("gpu", "gpu-ram"),
    "cpu-gpu": ("cpu-gpu",),
}


def as_device(text: str) -> DeviceChoice:
    """`text` as a device choice; ValueError naming the choices otherwise."""
    for choice in DEVICE_ALGORITHMS:
        if text == choice:
            return choice
    raise ValueError(f"device {text!r} is not one of {', '.join(DEVICE_ALGORITHMS)}")


@dataclass(frozen=True)
class LayerPlan:
    """One op of the network: where it runs, how, and what it is predicted to cost."""

    index: int
    kind: str
    device: str  # "cpu" or "gpu"
    primitive: str | None  # conv algorithm; None for pools and activations
    predicted_s: float  # per patch (all sub-batches)
    predicted_bytes: int  # peak bytes on its device while it runs


@dataclass(frozen=True)
class AlgorithmSummary:
    """The best configuration one algorithm reached (for the `znni plan` table)."""

    algorithm: Algorithm
    feasible: bool
    input_size: Triple | None = None
    output_size: Triple | None = None
    batch: int | None = None
    split_op: int | None = None  # see the module docstring
    predicted_voxels_per_second: float = 0.0
    peak_bytes: int = 0
    gpu_peak_bytes: int = 0
    reason: str = ""


@dataclass(frozen=True)
class Plan:
    network: str
    machine: str
    algorithm: Algorithm
    input_size: Triple
    output_size: Triple
    batch: int
    split_op: int | None  # first op after the CPU / streamed part (module docstring)
    primitives: tuple[str | None, ...]  # one per op, for dense_forward(primitives=...)
    layers: tuple[LayerPlan, ...]
    peak_bytes: int  # host
    predicted_patch_s: float
    predicted_voxels_per_second: float
    gpu_peak_bytes: int = 0
    gpu_sub_batches: int = 1
    spectra_cache_bytes: int = 0  # kept kernel spectra: CpuBackend(spectra_cache_bytes=...)
    workspace_cache_bytes: int = 0  # free FFT workspaces: CpuBackend(workspace_bytes=...)
    memory_limit_bytes: int = 0
    gpu_memory_limit_bytes: int = 0
    alternatives: tuple[AlgorithmSummary, ...] = field(default=())
    # the blocks the engine cuts (engine.compute.layout.with_layout; planner/blocks.py):
    # the nominal block shape and, per axis, the cuts from the region's start to its end
    block_shape: Triple | None = None
    block_edges: Edges | None = None
    # the whole run's predicted seconds by stage (planner/jobtime.py), over those blocks
    job_seconds: dict[str, float | int] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        try:
            body = _split_from_theta(dict(d))
            body["input_size"] = as_triple(body["input_size"])
            body["output_size"] = as_triple(body["output_size"])
            body["primitives"] = tuple(body["primitives"])
            body["layers"] = tuple(LayerPlan(**x) for x in body["layers"])
            if body.get("block_shape") is not None:
                body["block_shape"] = as_triple(body["block_shape"])
            if body.get("block_edges") is not None:
                body["block_edges"] = tuple(tuple(int(v) for v in e) for e in body["block_edges"])
            body["alternatives"] = tuple(
                AlgorithmSummary(
                    **{
                        **_split_from_theta(a),
                        "input_size": _optional(a.get("input_size")),
                        "output_size": _optional(a.get("output_size")),
                    }
                )
                for a in body.get("alternatives", ())
            )
            return cls(**body)
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a valid plan dictionary ({e!r})") from e


def _optional(value: Any) -> Triple | None:
    """A stored summary's size: None where the algorithm found nothing (stored as null)."""
    return as_triple(value) if value else None


def _split_from_theta(summary: dict[str, Any]) -> dict[str, Any]:
    """Plans stored before `split_op` (job rows of an older znni) said `theta`: the last op
    before the split, one less than `split_op`."""
    if "theta" not in summary:
        return summary
    out = {k: v for k, v in summary.items() if k != "theta"}
    out["split_op"] = None if summary["theta"] is None else int(summary["theta"]) + 1
    return out
