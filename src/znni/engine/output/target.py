"""Where a run's blocks land: a plain Zarr array, an OME-Zarr image with its pyramid, or a
precomputed volume with its pyramid as further scales.

The format is `--output-format` when given (it must match an existing output), else
the existing output's, else OME-Zarr exactly when the input is OME-Zarr. An OME-Zarr
output is an NGFF 0.5 image group (Zarr format 3) with arrays `0` .. `K` of
(c, z, y, x), `dimension_names` set, the input level's voxel size, offset and units,
and the pyramid kept by `pyramid.PyramidBuilder`. A precomputed output's pyramid is its
scales 1..K (`precomputed_scales.py`), kept by the same builder. Every format carries the
run's provenance under the `znni` attribute (`provenance.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from znni.engine.context import StoreContext
from znni.engine.geometry import Block, Box, Triple
from znni.engine.io.formats import (
    FORMATS,
    OUTPUT_FORMATS,
    InputVolume,
    OutputRequest,
    VolumeFormat,
    existing_format,
)
from znni.engine.io.pyramid import Factors, PyramidBuilder
from znni.engine.job import SegmentJob
from znni.engine.location import Location
from znni.engine.output.form import stored_job_dtype
from znni.engine.output.labels import parse_labels
from znni.engine.output.provenance import provenance

FORMAT_NAMES = {"zarr": "a plain Zarr array", "ome-zarr": "an OME-Zarr image"}


def output_format(job: SegmentJob, volume: InputVolume) -> tuple[VolumeFormat, bool]:
    """(the job's output format, whether an output is there already): `format_for`."""
    return format_for(job.output_path, job.output_format, volume, ctx=job.store)


def format_for(loc: Location, asked: str | None, volume: InputVolume, *,
               ctx: StoreContext) -> tuple[VolumeFormat, bool]:
    """(an output's format, whether an output is there already): a precomputed:// output's
    own; else `asked` (--output-format, which must match an existing output), else the
    existing output's, else OME-Zarr exactly when the input is OME-Zarr. ValueError, one
    sentence."""
    if loc.is_tensorstore:
        if asked not in (None, loc.driver):
            raise ValueError(f"output {loc} is a {loc.driver}:// volume, not {asked}; leave "
                             "out --output-format or the prefix")
        return FORMATS[loc.driver], True
    if asked is not None and asked not in OUTPUT_FORMATS:
        raise ValueError(f"output format {asked!r} is not one of {', '.join(OUTPUT_FORMATS)}")
    existing = existing_format(loc, ctx=ctx)
    if asked is None:
        name = existing.name if existing is not None else (
            "ome-zarr" if volume.ome is not None else "zarr")
        return FORMATS[name], existing is not None
    if existing is not None and existing.name != asked:
        raise ValueError(
            f"existing output {loc} is {FORMAT_NAMES[existing.name]}, not {asked}; remove "
            "it or choose another output path"
        )
    return FORMATS[asked], existing is not None


def output_plan(job: SegmentJob, volume: InputVolume, out_shape: tuple[int, ...],
                check: bool = True) -> tuple[str, Factors]:
    """(output format, pyramid halving steps) of a job, checked against an existing output
    (its levels' arrays too, unless `check` is False: checked already); raises ValueError,
    writes nothing."""
    fmt, exists = output_format(job, volume)
    shape = (out_shape[0], out_shape[1], out_shape[2], out_shape[3])
    steps = fmt.pyramid(job.output_path, volume, shape, stored_job_dtype(job), job.pyramid,
                        exists=exists, check=check, ctx=job.store)
    return fmt.name, steps


def volume_shape(out_shape: tuple[int, ...]) -> Triple:
    return (out_shape[1], out_shape[2], out_shape[3])


@dataclass
class OutputTarget:
    """The opened output: level 0 for the block writers, the pyramid levels for the builder."""

    path: Location
    format: str
    level0: Any
    level0_path: Location
    levels: list[Any]
    steps: Factors
    dtype: str
    builder: PyramidBuilder | None = None
    labels: bool = False  # --labels: pyramid levels by nearest, not mean

    def worker_job(self, job: SegmentJob) -> SegmentJob:
        """The job as block workers see it: writing straight into the level-0 array."""
        return replace(job, output_path=self.level0_path)

    def track(self, blocks: Sequence[Block], done: frozenset[str],
              record: Callable[[Block], None]) -> Callable[[Block, np.ndarray | None], None]:
        """The sweep's on_done(block, values written or None): `record` at once without a
        pyramid, else after the block's levels are updated (so the ledger covers every
        level)."""
        if not self.steps:
            return lambda block, values: record(block)
        shape = volume_shape(tuple(self.level0.shape))
        self.builder = PyramidBuilder(self.level0, self.levels, self.steps, shape, self.dtype,
                                      blocks, done, record, labels=self.labels)
        return self.builder.land

    def close(self) -> None:
        """Let the pyramid finish every landed block whose footprint is complete."""
        if self.builder is not None:
            self.builder.close()

    def check(self) -> None:
        """Raise a pyramid update's failure, if one happened."""
        if self.builder is not None:
            self.builder.check()


def open_target(job: SegmentJob, volume: InputVolume, out_shape: tuple[int, ...],
                chunks: Triple, region: Box, plan: dict[str, Any] | None) -> OutputTarget:
    """Create or open the job's output in its format and record this run's provenance on
    it (the job was checked by `segment.prepare_run`, which also checked an existing
    output's levels)."""
    name, steps = output_plan(job, volume, out_shape, check=False)
    dtype = stored_job_dtype(job)  # --labels: uint8 or uint16 (output/labels.py)
    request = OutputRequest(
        (out_shape[0], out_shape[1], out_shape[2], out_shape[3]), dtype, chunks, steps, volume,
        provenance(job, volume, region, plan),
        labels=parse_labels(job.labels).name if job.labels is not None else None,
        channel_names=tuple(getattr(job.network, "channel_names", ()) or ()),
    )
    arrays = FORMATS[name].create_or_open(job.output_path, request, ctx=job.store)
    return OutputTarget(job.output_path, name, arrays.level0, arrays.level0_location,
                        arrays.levels, steps, dtype, labels=job.labels is not None)
