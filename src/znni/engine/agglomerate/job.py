"""The values that describe an agglomeration job and report on it: `znni agglomerate` and
the HTTP job worker build an `AgglomerateJob` and call `engine.agglomerate.run.agglomerate`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from znni.engine.agglomerate.fragments import HIGH, LOW
from znni.engine.context import StoreContext
from znni.engine.job import ProgressEvent, Roi
from znni.engine.location import Location
from znni.engine.scheduler import Scheduler
from znni.triple import Triple

THRESHOLD_FIELD = "{threshold}"  # where several thresholds' outputs differ in OUTPUT
DEFAULT_THRESHOLD = 0.5
DEFAULT_BLOCK = (128, 128, 128)


@dataclass(frozen=True)
class AgglomerateJob:
    """Everything that determines an agglomeration; same job + same outputs = resumable.

    `outputs[i]` receives the segmentation at `thresholds[i]` (waterz's convention: regions
    merge while 1 - their boundary's mean affinity is below the threshold)."""

    affinities: Location
    outputs: tuple[Location, ...]
    thresholds: tuple[float, ...] = (DEFAULT_THRESHOLD,)
    roi: Roi | None = None
    block: Triple | None = None  # None: DEFAULT_BLOCK, clipped to the region
    mask: Location | None = None  # voxels where the mask is 0 are background
    # None: here; "local:N", "tcp://..." or a batch cluster "slurm:N" (engine/scheduler.py);
    # text is parsed in __post_init__
    scheduler: Scheduler | None = None
    overwrite: bool = False
    output_format: str | None = None  # "zarr" | "ome-zarr"; None: as `znni segment` picks
    work: Location | None = None  # fragments, region graph, ledgers; None: beside the output
    low: float = LOW  # the watershed's thresholds (waterz's aff_threshold_low/high)
    high: float = HIGH
    store: StoreContext = field(default_factory=StoreContext)
    quiet: bool = True
    progress: Callable[[str, ProgressEvent], None] | None = None  # (stage name, event)
    cancel: threading.Event | None = None

    def __post_init__(self) -> None:
        if self.scheduler is not None and not isinstance(self.scheduler, Scheduler):
            object.__setattr__(self, "scheduler", Scheduler.parse(self.scheduler))
        if len(self.outputs) != len(self.thresholds):
            raise ValueError(f"{len(self.thresholds)} thresholds need as many outputs, "
                             f"not {len(self.outputs)}")


def parse_thresholds(text: str) -> tuple[tuple[float, ...], tuple[str, ...]]:
    """'0.3,0.5' -> ((0.3, 0.5), ('0.3', '0.5')); ValueError of one sentence."""
    texts = tuple(t.strip() for t in text.split(",") if t.strip())
    values = []
    for t in texts:
        try:
            values.append(float(t))
        except ValueError:
            raise ValueError(f"threshold {t!r} is not a number") from None
    if not values:
        raise ValueError(f"--threshold {text!r} names no threshold")
    for value in values:
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"threshold {value:g} is outside [0, 1]")
    return tuple(values), texts


def outputs_for(output: str, thresholds: tuple[float, ...], texts: tuple[str, ...]
                ) -> tuple[Location, ...]:
    """One output per threshold: OUTPUT itself for one threshold, else OUTPUT with
    `{threshold}` replaced by each threshold as written (`texts`); ValueError otherwise."""
    if len(thresholds) == 1:
        text = output.replace(THRESHOLD_FIELD, texts[0])
        return (Location.parse(text, "output"),)
    if THRESHOLD_FIELD not in output:
        raise ValueError(
            f"{len(thresholds)} thresholds write one output each: put {THRESHOLD_FIELD} in "
            f"OUTPUT (e.g. seg-{THRESHOLD_FIELD}.zarr), not {output!r}")
    return tuple(Location.parse(output.replace(THRESHOLD_FIELD, t), "output") for t in texts)


@dataclass(frozen=True)
class StageReport:
    """One stage's blocks and seconds."""

    name: str
    blocks_total: int
    blocks_computed: int
    elapsed_s: float


@dataclass(frozen=True)
class AgglomerateReport:
    """What an agglomeration did: its stages, the graph and each threshold's segments."""

    outputs: tuple[Location, ...]
    thresholds: tuple[float, ...]
    voxels: int  # in the region
    fragments: int  # fragments with an edge (each block's watershed basins, before joining)
    basins: int
    edges: int  # between basins
    segments: tuple[int, ...]  # per threshold: segments with an edge (isolated ones not counted)
    stages: tuple[StageReport, ...]
    elapsed_s: float

    @property
    def voxels_per_s(self) -> float:
        return self.voxels / self.elapsed_s if self.elapsed_s > 0 else 0.0
