"""Agglomeration in the job server (docs/design.md, "HTTP API"): a job of its own on
existing affinities (`POST /v1/agglomerate`, kind "agglomerate"), or a segment job's second
stage on the affinities its network writes (a `JobCreate`'s `agglomerate` section).

The API checks a submission here before anything is stored (an agglomeration job through
the engine's own check, `prepare`; a segment job's section as far as it can before the
affinities exist); the worker rebuilds the same engine job from the stored parameters.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from znni.engine.context import StoreContext
from znni.engine.location import Location
from znni.engine.scheduler import Scheduler
from znni.jobs import stages
from znni.jobs.paths import relative_to_root
from znni.jobs.submission import api_words, check_overwrite, locate, locate_mask, overlap
from znni.triple import as_triple

if TYPE_CHECKING:
    from znni.engine.agglomerate.job import AgglomerateJob, AgglomerateReport
    from znni.engine.job import SegmentJob, SegmentReport
    from znni.jobs.catalogue import Model

KIND = "agglomerate"  # the job kind; a segment job's is "segment"
THRESHOLD_FIELD = "{threshold}"
DEFAULT_THRESHOLDS = (0.5,)
CHECKED = (ValueError, TypeError, FileNotFoundError, NotADirectoryError)


@dataclass(frozen=True)
class Site:
    """Where a server's jobs live: its data root, the URL prefixes it allows, the Dask
    scheduler its jobs run on and the store context whose caches they share."""

    root: Path
    allow_url: tuple[str, ...] = ()
    scheduler: str | None = None
    store: StoreContext = field(default_factory=StoreContext)


def thresholds_of(params: dict[str, Any]) -> tuple[float, ...]:
    return tuple(float(t) for t in params.get("thresholds") or DEFAULT_THRESHOLDS)


def stage_params(params: dict[str, Any]) -> dict[str, Any]:
    """A segment job's agglomeration stage as an agglomeration job's parameters: its
    section with the job's `roi` (the affinities hold values there only) and `overwrite`."""
    return {**params["agglomerate"], "roi": params.get("roi"),
            "overwrite": bool(params.get("overwrite", False))}


def stage_list(params: dict[str, Any], network: bool) -> list[dict[str, Any]]:
    """The job's stages, all pending (`network`: a segment job's, its network's first and
    its `agglomerate` section's after it)."""
    section = params["agglomerate"] if network else params
    names = stages.agglomeration_names(list(thresholds_of(section)))
    return stages.initial([stages.NETWORK, *names] if network else names)


def output_texts(params: dict[str, Any]) -> list[str]:
    """The outputs as the user named them: `output`, with `{threshold}` replaced by each
    threshold (Python's shortest form: 0.5, 0.25); ValueError when several thresholds
    would share one output."""
    thresholds, output = thresholds_of(params), str(params["output"])
    if len(thresholds) > 1 and THRESHOLD_FIELD not in output:
        raise ValueError(f"{len(thresholds)} thresholds write one output each: put "
                         f"{THRESHOLD_FIELD} in output (e.g. seg-{THRESHOLD_FIELD}.zarr), "
                         f"not {output!r}")
    return [output.replace(THRESHOLD_FIELD, repr(t)) for t in thresholds]


def stored_output(site: Site, params: dict[str, Any]) -> Location:
    """The job row's output: the one output, or the confined `{threshold}` pattern."""
    texts = output_texts(params)
    shown = texts[0] if len(texts) == 1 else str(params["output"])
    return locate(site.root, site.allow_url, shown, "output")


def engine_job(site: Site, affinities: Location, params: dict[str, Any]) -> AgglomerateJob:
    """The engine job for stored parameters (`affinities` located already); every output,
    the mask and the work folder confined as a job's paths are."""
    from znni.engine.agglomerate.job import AgglomerateJob

    outputs = tuple(locate(site.root, site.allow_url, t, "output") for t in output_texts(params))
    roi = params.get("roi")
    block = params.get("block")
    return AgglomerateJob(
        affinities=affinities, outputs=outputs, thresholds=thresholds_of(params),
        roi=None if roi is None else tuple((lo, hi) for lo, hi in roi),
        block=None if block is None else as_triple(block),
        mask=locate_mask(site.root, site.allow_url, params),
        scheduler=Scheduler.of(site.scheduler),
        overwrite=bool(params.get("overwrite", False)),
        output_format=params.get("output_format"), work=work_folder(site, params),
        store=site.store)


def work_folder(site: Site, params: dict[str, Any]) -> Location:
    """The engine's default work folder (beside a local output, named after it), which for
    a local output must lie under the data root too."""
    from znni.engine.agglomerate.prepare import default_work

    pattern = locate(site.root, site.allow_url, str(params["output"]), "output")
    work = default_work(pattern)
    if pattern.is_local and not Path(work.url).resolve().is_relative_to(site.root):
        raise ValueError(f"output {params['output']!r} puts its work folder outside the data "
                         "root (via a symlink)")
    return work


def check_job(site: Site, affinities: str, params: dict[str, Any]
              ) -> tuple[Location, AgglomerateJob]:
    """An agglomeration job checked as `znni agglomerate` checks it, nothing written;
    ValueError of one sentence in the API's words."""
    from znni.engine.agglomerate.prepare import prepare

    located = locate(site.root, site.allow_url, affinities, "affinities")
    job = engine_job(site, located, params)
    _check_outputs(site, job, params, [(located, "affinities")])
    try:
        prepare(job)
    except CHECKED as e:
        raise ValueError(api_words(relative_to_root(site.root, str(e)))) from e
    return located, job


def check_stage(site: Site, network: Model, name: str, segment: SegmentJob,
                params: dict[str, Any]) -> None:
    """A segment job's agglomeration section, checked before the affinities exist: the
    network writes affinities (3 channels) or a boundary map (1), not labels; thresholds
    in [0, 1], distinct; outputs confined, apart from the job's volumes, not existing
    without overwrite. ValueError of one sentence."""
    if network.out_channels not in (1, 3):
        raise ValueError(f"agglomerate needs affinities (3 channels) or a boundary map (1 "
                         f"channel); network {name!r} writes {network.out_channels} channels")
    if params.get("labels") is not None:
        raise ValueError("agglomerate needs the network's affinities, not labels; drop labels "
                         "or agglomerate them in a job of its own")
    section = stage_params(params)
    thresholds = thresholds_of(section)
    for t in thresholds:
        if not 0.0 <= t <= 1.0:
            raise ValueError(f"agglomerate threshold {t:g} is outside [0, 1]")
    if len(set(thresholds)) != len(thresholds):
        raise ValueError(f"agglomerate thresholds {list(thresholds)} repeat one")
    job = engine_job(site, segment.output_path, section)
    volumes = [(segment.input_path, "input"), (segment.output_path, "the job's output")]
    if segment.mask_path is not None:
        volumes.append((segment.mask_path, "mask"))
    _check_outputs(site, job, section, volumes)


def _check_outputs(site: Site, job: AgglomerateJob, params: dict[str, Any],
                   volumes: list[tuple[Location, str]]) -> None:
    """No output overlaps another volume of the job; none exists without overwrite (or
    the ledger of a run to resume)."""
    if job.mask is not None:
        volumes = [*volumes, (job.mask, "mask")]
    for location, text in zip(job.outputs, output_texts(params), strict=True):
        for other, what in volumes:
            if overlap(location, other):
                raise ValueError(f"agglomerate output {text!r} and {what} overlap; the output "
                                 "must be a separate array")
        check_overwrite(location, job.overwrite, text, store=site.store)


def resume_job(job: AgglomerateJob) -> AgglomerateJob:
    """A resumed overwrite job continues its own partial run where its outputs hold it
    (or do not exist yet) rather than starting afresh."""
    if not job.overwrite:
        return job
    from znni.engine.agglomerate.prepare import prepare
    from znni.engine.io.stores import exists

    keep = dataclasses.replace(job, overwrite=False)
    try:
        prep = prepare(keep)
    except CHECKED:
        return job
    if any(exists(o.location, ctx=job.store) and not o.resume for o in prep.outputs):
        return job
    return keep


def report_values(report: AgglomerateReport, root: Path) -> dict[str, Any]:
    """The report as the job stores it (outputs relative to the data root)."""
    return {
        "outputs": [relative_to_root(root, str(o)) for o in report.outputs],
        "thresholds": list(report.thresholds), "voxels": report.voxels,
        "fragments": report.fragments, "basins": report.basins, "edges": report.edges,
        "segments": list(report.segments),
        "stages": [dataclasses.asdict(s) for s in report.stages],
        "elapsed_s": report.elapsed_s, "voxels_per_second": report.voxels_per_s,
    }


def finished(report: AgglomerateReport, network: SegmentReport | None = None
             ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the job's summary for `JobStore.complete`, its stages all done) from the reports."""
    done = []
    if network is not None:
        done.append(stages.stage(
            stages.NETWORK, status="done", done=network.blocks_total,
            total=network.blocks_total, voxels_done=network.voxels_written,
            voxels_total=network.voxels_written, elapsed_s=network.elapsed_s,
            voxels_per_second=network.voxels_per_second))
    for s in report.stages:
        voxels = 0 if s.name == stages.GLOBAL_STEP else report.voxels
        done.append(stages.stage(
            s.name, status="done", done=s.blocks_total, total=s.blocks_total,
            voxels_done=voxels, voxels_total=voxels, elapsed_s=s.elapsed_s,
            voxels_per_second=voxels / s.elapsed_s if voxels and s.elapsed_s > 0 else None))
    elapsed = report.elapsed_s + (network.elapsed_s if network is not None else 0.0)
    computed = sum(s.blocks_computed for s in report.stages if s.name != stages.GLOBAL_STEP)
    summary = {"blocks_total": report.stages[-1].blocks_total, "voxels_written": report.voxels,
               "elapsed_s": elapsed, "blocks_computed": computed,
               "voxels_per_second": report.voxels / elapsed if elapsed > 0 else 0.0}
    return summary, done
