"""The `Plan` value (contract 3) and `make_plan`, the planner's entry point.

A plan says which device algorithm runs (cpu, gpu, gpu-ram, cpu-gpu), the
MPF patch size and batch, the split layer theta, each layer's primitive with
its predicted seconds and bytes, and the predicted throughput. It is frozen
and JSON-serialisable so the engine and server can record what they ran.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from znni.planner.machine import MachineProfile
from znni.planner.network import Network

ALGORITHMS = ("cpu", "gpu", "gpu-ram", "cpu-gpu")
DEVICE_ALGORITHMS = {
    "auto": ALGORITHMS,
    "cpu": ("cpu",),
    "gpu": ("gpu", "gpu-ram"),
    "cpu-gpu": ("cpu-gpu",),
}
Triple = tuple[int, int, int]


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

    algorithm: str
    feasible: bool
    input_size: Triple | None = None
    output_size: Triple | None = None
    batch: int | None = None
    theta: int | None = None
    predicted_voxels_per_second: float = 0.0
    peak_bytes: int = 0
    gpu_peak_bytes: int = 0
    reason: str = ""


@dataclass(frozen=True)
class Plan:
    network: str
    machine: str
    algorithm: str
    input_size: Triple
    output_size: Triple
    batch: int
    theta: int | None  # last op index run on the CPU (cpu-gpu) or streamed (gpu-ram)
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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        try:
            body = dict(d)
            body["input_size"] = _triple(body["input_size"])
            body["output_size"] = _triple(body["output_size"])
            body["primitives"] = tuple(body["primitives"])
            body["layers"] = tuple(LayerPlan(**x) for x in body["layers"])
            body["alternatives"] = tuple(
                AlgorithmSummary(
                    **{
                        **a,
                        "input_size": _triple(a["input_size"]) if a.get("input_size") else None,
                        "output_size": _triple(a["output_size"]) if a.get("output_size") else None,
                    }
                )
                for a in body.get("alternatives", ())
            )
            return cls(**body)
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a valid plan dictionary ({e!r})") from e


def _triple(v: Any) -> Triple:
    a, b, c = (int(x) for x in v)
    return (a, b, c)


def make_plan(
    network: Network,
    *,
    machine: MachineProfile | None = None,
    device: str = "auto",
    memory_limit_bytes: int | None = None,
    max_output: Triple | None = None,
) -> Plan:
    """The configuration with the highest predicted output voxels/s that fits in memory.

    machine: None detects this machine (calibrated rates cached per machine).
    device: 'auto' | 'cpu' | 'gpu' | 'cpu-gpu'. memory_limit_bytes: host budget
    (default: the profile's available memory). max_output: the region to compute;
    no patch is planned larger than it (rounded up to the pool product).
    Raises ValueError when nothing fits.
    """
    from znni.planner.search import search

    if device not in DEVICE_ALGORITHMS:
        raise ValueError(
            f"device {device!r} is not one of {', '.join(DEVICE_ALGORITHMS)}"
        )
    if memory_limit_bytes is not None and memory_limit_bytes <= 0:
        raise ValueError(f"memory limit must be positive, got {memory_limit_bytes}")
    if machine is None:
        machine = MachineProfile.detect()
    return search(network, machine, DEVICE_ALGORITHMS[device], memory_limit_bytes, max_output)
