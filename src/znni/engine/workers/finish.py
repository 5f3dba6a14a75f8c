"""Labels, masks and empty blocks around any worker kind (docs/design.md, "Labels, masks and
empty blocks").

`FinishWorker` wraps the worker of a job's kind. Before the input is read, a block whose
write box lies wholly outside the mask (`--mask`, decided on the mask's own voxels) is
skipped; after the read the worker would do anyway, a block whose write box's input
voxels all equal `--skip-empty`'s value is skipped too. A skipped block is written as
the fill value (0, labels 0) without compute and recorded as done like any other. A
computed block is labelled (`--labels`, from its blended float output) and its voxels
outside a partly covering mask are set to the fill value.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from znni.engine.context import StoreContext
from znni.engine.geometry import Block
from znni.engine.io.mask import OUTSIDE, PARTIAL, Mask, MaskSpec
from znni.engine.location import Location
from znni.engine.workers.base import InferenceStage, VolumeWorker
from znni.engine.workers.exact_graph import ExactGraphSpec
from znni.engine.workers.mpf import BlockSpec
from znni.engine.workers.windowed import WindowedSpec
from znni.primitives.base import Backend

KindSpec = BlockSpec | WindowedSpec | ExactGraphSpec  # the three worker kinds' specs


class Labeller(Protocol):
    """What `--labels` is to a worker (`engine/output/labels.LabelSpec`)."""

    def apply(self, values: np.ndarray) -> np.ndarray:
        """(C, Z, Y, X) float output -> (1, Z, Y, X) labels."""
        ...


@dataclass(frozen=True)
class FinishSpec(InferenceStage):
    """The job's worker spec with what is done around its compute (picklable): the sweep's
    stage when the job has labels, a mask or --skip-empty."""

    inner: KindSpec
    channels: int  # stored channels (1 for labels)
    dtype: str  # stored dtype (the labels' for labels)
    labels: Labeller | None = None
    mask: MaskSpec | None = None
    skip_empty: float | None = None  # input value that makes a block empty; None: no check

    @property
    def input_path(self) -> Location:
        return self.inner.input_path

    @property
    def output_path(self) -> Location:
        return self.inner.output_path

    @property
    def store(self) -> StoreContext:
        return self.inner.store

    def build(self, backend: Backend | None = None, output_array: Any = None) -> FinishWorker:
        """The inner kind's worker, wrapped (`backend`, `output_array`: the inner's)."""
        return FinishWorker(self.inner.build(backend, output_array), self)


def finish_spec(inner: KindSpec, form: Any, store: StoreContext) -> KindSpec | FinishSpec:
    """`inner` wrapped when the job's output form (`engine/output/form.OutputForm`: channels,
    dtype, labels, mask, skip_empty) has labels, a mask or --skip-empty; else `inner`.
    `store`: the job's StoreContext, which the mask is read through."""
    if form is None or (form.labels is None and form.mask is None and form.skip_empty is None):
        return inner
    mask = None if form.mask is None else replace(form.mask, store=store)
    return FinishSpec(inner, form.channels, form.dtype, form.labels, mask, form.skip_empty)


@dataclass
class MaskedRead:
    """A block's read: the input (None when the mask leaves nothing to compute) and the
    mask's coverage of its write box."""

    raw: np.ndarray | None
    coverage: str


class FinishWorker:
    """Skips, labels and masks blocks around `inner` (any worker kind)."""

    def __init__(self, inner: VolumeWorker, spec: FinishSpec) -> None:
        self.inner, self.spec = inner, spec
        self.mask = Mask(spec.mask) if spec.mask is not None else None
        self.skipped: set[str] = set()  # keys of the blocks written without compute (the sweep
        # counts them as done, not as computed: `engine/sweep/stage.BlockWork`)

    @property
    def volume(self) -> Any:
        return self.inner.volume

    @property
    def output(self) -> Any:
        return self.inner.output

    @output.setter
    def output(self, array: Any) -> None:
        self.inner.output = array

    def device_report(self) -> dict[str, Any]:
        return dict(getattr(self.inner, "device_report", dict)())

    def read(self, block: Block) -> MaskedRead:
        """The inner worker's read, unless the mask leaves the block wholly outside."""
        coverage = self.mask.coverage(block.write) if self.mask is not None else "inside"
        if coverage == OUTSIDE:
            return MaskedRead(None, coverage)
        return MaskedRead(self.inner.read(block), coverage)

    def compute(self, block: Block, read: MaskedRead) -> np.ndarray:
        """The block's stored (channels, *write.shape) values: the fill value when skipped."""
        if read.raw is None or self._empty(block, read.raw):
            self.skipped.add(block.key)
            return np.zeros((self.spec.channels, *block.write.shape), self.spec.dtype)
        values = self.inner.compute(block, read.raw)  # (C, *write.shape), encoded
        if self.spec.labels is not None:
            values = self.spec.labels.apply(values)  # (1, *write.shape)
        if read.coverage == PARTIAL and self.mask is not None:
            values[:, ~self.mask.voxels(block.write)] = 0
        return values

    def write(self, block: Block, values: np.ndarray) -> None:
        self.inner.write(block, values)

    def run(self, block: Block) -> None:
        self.write(block, self.compute(block, self.read(block)))

    def _empty(self, block: Block, raw: np.ndarray) -> bool:
        """Whether every input voxel of the block's write box (within the read `raw`, which
        covers the inner worker's read box) equals the --skip-empty value."""
        value = self.spec.skip_empty
        if value is None:
            return False
        read_box = getattr(self.inner, "read_box", lambda b: b.read)(block)
        lo = [w - r for w, r in zip(block.write.lo, read_box.lo, strict=True)]
        s = block.write.shape
        part = raw[:, lo[0]:lo[0] + s[0], lo[1]:lo[1] + s[1], lo[2]:lo[2] + s[2]]
        return bool(np.all(part == value))
