"""The stored form of a job's output: channels and dtype (labels or the network's values),
the mask and the empty-block value, checked together before anything is written."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from znni.engine.context import StoreContext
from znni.engine.geometry import Box, Triple
from znni.engine.io.mask import MaskSpec, check_mask, outside_boxes
from znni.engine.location import Location
from znni.engine.output.labels import LabelSpec, check_labels, stored_channels, stored_dtype
from znni.planner.blocks import Edges, edges_blocks

if TYPE_CHECKING:
    from znni.engine.job import SegmentJob


@dataclass(frozen=True)
class OutputForm:
    """What `segment` stores and what it may skip (docs/design.md, "Labels, masks and empty
    blocks")."""

    channels: int  # the output array's channels (1 for labels)
    dtype: str  # the output array's dtype (uint8/uint16 for labels)
    labels: LabelSpec | None = None
    mask: MaskSpec | None = None
    skip_empty: float | None = None

    def outside(self, edges: Edges) -> frozenset[int]:
        """The blocks of a layout (indices in `planner.blocks.edges_blocks` order) wholly
        outside the mask: the plan counts them as written without compute."""
        if self.mask is None:
            return frozenset()
        boxes = [Box(lo, hi) for lo, hi in edges_blocks(edges)]
        return frozenset(i for i, out in enumerate(outside_boxes(self.mask, boxes)) if out)

    def parts(self) -> dict[str, Any]:
        """The fingerprint keywords (`ledger.fingerprint_parts`) of these options."""
        return {"labels": None if self.labels is None else self.labels.text(),
                "mask": None if self.mask is None else self.mask.path,
                "skip_empty": self.skip_empty}


def output_form(job: SegmentJob, volume_shape: Triple) -> OutputForm:
    """The job's output form, checked (labels against the network's channels and --dtype,
    the mask's shape against the input's); ValueError of one sentence, nothing written."""
    return make_form(job.labels, job.dtype, job.mask_path, job.skip_empty,
                     job.network.out_channels, volume_shape, ctx=job.store)


def make_form(labels: str | None, dtype: str, mask_path: Location | None, skip_empty: float | None,
              channels: int, volume_shape: Triple, *, ctx: StoreContext) -> OutputForm:
    """`output_form` from the options themselves (`znni plan` has no job)."""
    spec = check_labels(labels, dtype, channels)
    if skip_empty is not None and not math.isfinite(skip_empty):
        raise ValueError(f"--skip-empty {skip_empty} must be a finite number")
    mask = None if mask_path is None else check_mask(mask_path, volume_shape, ctx=ctx)
    return OutputForm(stored_channels(labels, channels), stored_dtype(labels, dtype, channels),
                      spec, mask, skip_empty)


def stored_job_dtype(job: SegmentJob) -> str:
    """The output array's dtype for `job` (labels set it), without opening anything."""
    return stored_dtype(job.labels, job.dtype, job.network.out_channels)


EMPTY_NOT_COUNTED = ("blocks whose input is all {value:g} are found only once read; the "
                     "predicted time counts them computed")


def plan_fields(labels: str | None, dtype: str, mask: Location | None, skip_empty: float | None,
                channels: int, skipped_blocks: int | None) -> dict[str, Any]:
    """What these options change in a plan (`znni plan --input`, `POST /v1/plan`): the
    stored channels and dtype, the blocks wholly outside the mask (`skipped_blocks`, from
    the whole-run prediction's `skip`; None where the prediction computes them) and the
    empty-block value, which the plan shows but cannot count; {} without any option."""
    if labels is None and mask is None and skip_empty is None:
        return {}
    shown = None if mask is None else str(mask)
    fields = {"labels": labels, "output_channels": stored_channels(labels, channels),
              "output_dtype": stored_dtype(labels, dtype, channels), "mask": shown,
              "skip_empty": skip_empty, "blocks_outside_mask": skipped_blocks}
    if skip_empty is not None:
        fields["empty_blocks"] = EMPTY_NOT_COUNTED.format(value=skip_empty)
    return fields
