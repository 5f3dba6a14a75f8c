"""The values that describe a segmentation job and report on it (the engine's contract).

`znni segment`, `znni demo` and the HTTP job worker all build a `SegmentJob`
and call `znni.engine.segment.segment(job, ...)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from znni.engine.context import StoreContext
from znni.engine.location import Location
from znni.engine.scheduler import Scheduler
from znni.triple import Triple

if TYPE_CHECKING:  # a pure description: the CLI reads its vocabularies without numpy
    from znni.model.network import Network
    from znni.model.onnx_model import OnnxModel

# ((z0, z1), (y0, y1), (x0, x1)); an open end (None) runs to the volume edge
Roi = tuple[tuple[int | None, int | None], ...]
BorderMode = Literal["reflect", "zero"]
OutputDtype = Literal["float32", "uint8"]
Device = Literal["auto", "cpu", "gpu", "cpu-gpu"]
Precision = Literal["fp32", "tf32", "bf16", "fp16", "int8", "auto"]

BORDER_MODES: tuple[str, ...] = ("reflect", "zero")
OUTPUT_DTYPES: tuple[str, ...] = ("float32", "uint8")
DEVICES: tuple[str, ...] = ("auto", "cpu", "gpu", "cpu-gpu")
# primitives/precision.PRECISIONS, repeated so the CLI reads it without numpy (a test checks)
PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "bf16", "fp16", "int8")
# what a job may ask for: a precision, or "auto" (graph models on the CPU: the fastest
# predicted precision whose measured error is within max_error, engine/compute/precision_error)
PRECISION_CHOICES: tuple[str, ...] = (*PRECISIONS, "auto")
# int8 and auto: the largest error against fp32 a run accepts, as a fraction of the fp32
# output's range over the held-out windows (docs/design.md, "int8 and auto": a probability
# moving by less than 0.02 rarely crosses a 0.5 threshold; issue 53's target)
MAX_ERROR = 0.02
BLEND_MODES: tuple[str, ...] = ("gaussian", "constant")
OUTPUT_FORMATS: tuple[str, ...] = ("zarr", "ome-zarr")


@dataclass(frozen=True)
class SegmentJob:
    """Everything that determines a run; same job + same output = resumable."""

    network: Network | OnnxModel  # a JSON spec (exact, MPF) or an ONNX model (windowed)
    input_path: Location
    output_path: Location
    roi: Roi | None = None  # None: the whole volume
    border: BorderMode = "reflect"
    dtype: OutputDtype = "float32"
    chunks: Triple | None = None  # output chunk shape (z, y, x); None: the engine chooses
    device: Device = "auto"
    # arithmetic precision (primitives/precision.py): fp32 everywhere; bf16 also on the CPU
    # (OpenVINO compiled networks); tf32 and fp16 on the GPU only; int8 and auto on the CPU
    # for graph models (engine.compute.execution.check_precision)
    precision: Precision = "fp32"
    # int8 and auto: the largest measured error against fp32 accepted (fraction of the fp32
    # output's range on held-out windows); above it int8 is refused (auto takes another)
    max_error: float = MAX_ERROR
    memory_limit_bytes: int | None = None  # None: from available RAM
    # None: here; Dask: "tcp://HOST:PORT", "local:N", or a batch cluster "slurm:N" (pbs, lsf,
    # sge) of at most N workers (engine/scheduler.py); text is parsed in __post_init__
    scheduler: Scheduler | None = None
    overwrite: bool = False
    block: Triple | None = None  # block shape (z, y, x), rounded up to whole chunks; None: auto
    window: Triple | None = None  # windowed models: W; None: the output's recorded or planned one
    overlap: float = 0.25  # windowed models: MONAI's overlap fraction
    blend: str = "gaussian"  # windowed models: gaussian (sigma 0.125 W) or constant weights
    output_format: str | None = None  # "zarr" | "ome-zarr"; None: the existing output's, else
    # OME-Zarr exactly when the input is an OME-Zarr image
    pyramid: int | None = None  # OME-Zarr outputs: downsampled levels; None: coarsest <= 256
    # (precomputed:// outputs: scales 1..N; None: an existing output's depth, else none)
    # store options by bucket (--storage-option) and this process's store caches
    store: StoreContext = field(default_factory=StoreContext)
    on_bad_chunk: str = "fail"  # an input chunk that does not decode: stop, or "fill" and list it
    wait_for_output: bool = False  # another live run holds the output: wait, not refuse
    # labels instead of the float output: "argmax" or "threshold:T[:CHANNEL]"
    # (engine/output/labels.py); None: the network's output as it is
    labels: str | None = None
    mask_path: Location | None = None  # --mask: blocks wholly outside it are not computed
    skip_empty: float | None = None  # --skip-empty: blocks whose input is all this value
    # test-time flips: "flips" or "flips:AXES" (engine/compute/tta.py); None: none
    tta: str | None = None

    def __post_init__(self) -> None:
        """Text locations (and a scheduler) given by a Python caller are parsed here, once:
        the engine's own entry point, as the CLI and the HTTP API parse theirs
        (`Location.parse`, `Scheduler.parse`)."""
        for name, what in (("input_path", "input"), ("output_path", "output"),
                           ("mask_path", "mask")):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Location):
                object.__setattr__(self, name, Location.parse(value, what))
        if self.scheduler is not None and not isinstance(self.scheduler, Scheduler):
            object.__setattr__(self, "scheduler", Scheduler.parse(self.scheduler))


class SegmentCancelled(Exception):
    """Raised by segment() when its cancel event is set: it stops after the current block.

    Finished blocks stay recorded in the ledger, so a later identical run resumes.
    """

    done: tuple[int, int] | None = None  # (blocks done, blocks in all), set by the sweep


@dataclass(frozen=True)
class ProgressEvent:
    """Emitted after each finished block."""

    blocks_done: int
    blocks_total: int
    voxels_done: int
    voxels_total: int
    elapsed_s: float
    voxels_per_second: float


@dataclass(frozen=True)
class SegmentReport:
    """The summary of a finished run."""

    output_path: Location
    blocks_total: int
    blocks_computed: int  # blocks computed by this run (resume skips done ones)
    voxels_written: int
    elapsed_s: float
    voxels_per_second: float
    stage_seconds: dict[str, float] = field(default_factory=dict)  # read, compute, write, wait
    plan: dict[str, Any] | None = None
    bad_chunks: tuple[str, ...] = ()  # input chunks filled with the fill value (every run's)
    # blocks this run wrote as the fill value without compute (not in blocks_computed)
    blocks_skipped: int = 0
