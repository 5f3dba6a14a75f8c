"""Every check `agglomerate` makes before it writes anything, and the run's geometry: bad
input fails here with one ValueError sentence and leaves the disk untouched."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from znni.engine.agglomerate.job import DEFAULT_BLOCK, THRESHOLD_FIELD, AgglomerateJob
from znni.engine.agglomerate.stages import AffinitySource
from znni.engine.geometry import Box, Triple
from znni.engine.io.formats import InputVolume, VolumeFormat, format_of
from znni.engine.io.ledger import fingerprint, mismatch_sentence, read_ledger
from znni.engine.io.stores import check_output_location
from znni.engine.io.volume import open_input, output_chunks
from znni.engine.location import Location
from znni.engine.output.target import format_for
from znni.engine.units import resolve_roi
from znni.triple import as_triple

OUTPUT_DTYPE = "uint64"
LABEL_NAME = "segmentation"  # an OME-Zarr output's label image, labels/segmentation
WORK_SUFFIX = ".agglomerate"
VERSION = 1  # of the fragments and graph: a change here makes older work folders stale


@dataclass(frozen=True)
class OutputPlan:
    """One threshold's output: its format, chunks and whether a run of this job is there."""

    location: Location
    threshold: float
    format: VolumeFormat
    chunks: Triple
    parts: dict[str, Any]
    resume: bool
    done: frozenset[str]


@dataclass(frozen=True)
class PreparedAgglomeration:
    job: AgglomerateJob
    volume: InputVolume
    source: AffinitySource
    block: Triple
    work: Location
    parts: dict[str, Any]  # what the fragments and graph depend on
    outputs: tuple[OutputPlan, ...]

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.parts)


def prepare(job: AgglomerateJob) -> PreparedAgglomeration:
    ctx = job.store
    if job.scheduler is not None and job.scheduler.is_batch:  # its work folder's SQLite graph
        raise ValueError(f"znni agglomerate runs on local:N or tcp://HOST:PORT in this "
                         f"version, not on a batch cluster ({job.scheduler}); znni segment "
                         "runs there")
    channels, scale, dtype = _affinity_layout(job.affinities, ctx)
    volume = open_input(job.affinities, channels, ctx=ctx)
    lo_hi = resolve_roi(job.roi, volume.shape)
    region = Box(as_triple(a for a, _ in lo_hi), as_triple(b for _, b in lo_hi))
    _check_thresholds(job.thresholds)
    if not 0.0 <= job.low < job.high <= 1.0:
        raise ValueError(f"the watershed's low and high affinities must satisfy 0 <= low < "
                         f"high <= 1, not {job.low} and {job.high}")
    if job.mask is not None:
        mask = open_input(job.mask, 1, ctx=ctx)
        if mask.shape != volume.shape:
            raise ValueError(f"mask {job.mask} has shape {mask.shape}, not the affinities' "
                             f"{volume.shape}")
    block = _block(job.block, region)
    source = AffinitySource(job.affinities, channels, scale, volume.shape, region, job.mask,
                            ctx, job.low, job.high)
    parts = {"stage": "agglomerate", "version": VERSION,
             "affinities": str(job.affinities.resolved()), "dtype": dtype,
             "shape": [int(s) for s in volume.array.shape], "region": region.key(),
             "mask": None if job.mask is None else str(job.mask.resolved()),
             "block": list(block), "low": job.low, "high": job.high,
             # merges inside blocks below the least threshold (a lower one starts afresh)
             "premerge": min(float(t) for t in job.thresholds)}
    work = job.work if job.work is not None else default_work(job.outputs[0])
    outputs = tuple(_output_plan(job, volume, loc, t, parts)
                    for loc, t in zip(job.outputs, job.thresholds, strict=True))
    _check_distinct(job, work)
    return PreparedAgglomeration(job, volume, source, block, work, parts, outputs)


def _affinity_layout(loc: Location, ctx: Any) -> tuple[int, float, str]:
    """(channels, scale, dtype) of the affinities: 3 channels or 1 (a boundary map), float
    or uint8; ValueError of one sentence otherwise."""
    arr = format_of(loc, ctx=ctx).open_level0(loc, "affinities", ctx=ctx)
    shape = tuple(int(s) for s in arr.shape)
    dtype = np.dtype(arr.dtype)
    if len(shape) == 3:
        channels = 1
    elif len(shape) == 4 and shape[0] in (1, 3):
        channels = shape[0]
    else:
        raise ValueError(
            f"affinities {loc} have shape {shape}; expected (3, z, y, x) nearest-neighbour "
            "affinities or a one-channel boundary map (z, y, x) or (1, z, y, x)")
    if dtype.kind == "f":
        return channels, 1.0, str(dtype)
    if dtype == np.uint8:
        return channels, 255.0, str(dtype)
    raise ValueError(f"affinities {loc} have dtype {dtype}; expected float (0..1) or uint8 "
                     "(0..255)")


def _check_thresholds(thresholds: tuple[float, ...]) -> None:
    if not thresholds:
        raise ValueError("give at least one threshold")
    for t in thresholds:
        if not (isinstance(t, float | int) and 0.0 <= float(t) <= 1.0):
            raise ValueError(f"threshold {t} is outside [0, 1]")
    if len(set(thresholds)) != len(thresholds):
        raise ValueError(f"thresholds {list(thresholds)} repeat one")


def _block(block: Triple | None, region: Box) -> Triple:
    shape = block if block is not None else DEFAULT_BLOCK
    if any(int(b) < 1 for b in shape):
        raise ValueError(f"block {tuple(shape)} must be positive on every axis")
    return as_triple(min(int(b), n) for b, n in zip(shape, region.shape, strict=True))


def default_work(output: str | Location) -> Location:
    """The work folder of OUTPUT (several thresholds: the OUTPUT text with `{threshold}`):
    beside a local output, named after it ({threshold} read as "all"), else in the user's
    cache folder, named by a hash of the output's location (SQLite wants a local file)."""
    text = str(output.bare().url if isinstance(output, Location) else output)
    text = text.replace(THRESHOLD_FIELD, "all").rstrip("/")
    loc = Location.parse(text, "output")
    if loc.is_local and not loc.is_tensorstore:
        return Location.parse(text + WORK_SUFFIX, "work folder")
    digest = hashlib.sha256(loc.bare().url.encode()).hexdigest()[:16]
    home = Path.home() / ".cache" / "znni" / "agglomerate" / digest
    return Location.parse(str(home), "work folder")


def _output_plan(job: AgglomerateJob, volume: InputVolume, loc: Location, threshold: float,
                 parts: dict[str, Any]) -> OutputPlan:
    ctx = job.store
    check_output_location(loc, ctx=ctx)
    fmt, _ = format_for(loc, job.output_format, volume, ctx=ctx)
    shape = (1, *volume.shape)
    existing = fmt.check_existing(loc, (1, shape[1], shape[2], shape[3]), OUTPUT_DTYPE,
                                  LABEL_NAME, ctx=ctx)
    chunks = output_chunks(None, existing, volume.shape, 1, OUTPUT_DTYPE, str(loc))
    # the partition does not depend on the blocks: a finished output stays this job's
    out_parts = {**{k: v for k, v in parts.items() if k not in ("block", "premerge")},
                 "threshold": float(threshold)}
    header, done = read_ledger(loc, ctx=ctx) if existing else (None, set())
    resume = header is not None and header.get("fingerprint") == fingerprint(out_parts)
    if header is not None and not resume and not job.overwrite:
        raise ValueError(mismatch_sentence(loc, header, out_parts))
    resume = resume and not job.overwrite
    return OutputPlan(loc, float(threshold), fmt, chunks, out_parts, resume,
                      frozenset(done) if resume else frozenset())


def _check_distinct(job: AgglomerateJob, work: Location) -> None:
    """No output is the affinities, the mask, the work folder or another output."""
    seen = {job.affinities.resolved().bare().url: "the affinities"}
    if job.mask is not None:
        seen[job.mask.resolved().bare().url] = "the mask"
    seen[work.resolved().bare().url] = "the work folder"
    for loc in job.outputs:
        key = loc.resolved().bare().url
        if key in seen:
            raise ValueError(f"output {loc} is {seen[key]}; choose another path")
        seen[key] = "another threshold's output"
    if not work.is_local:
        raise ValueError(f"work folder {work} must be a local folder (the region graph is a "
                         "SQLite file)")
