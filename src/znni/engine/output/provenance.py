"""What made an output: the `znni` attribute every output records (docs/design.md, "Volumes").

Written on the output (a plain array's attributes, or an OME-Zarr group's next to
`ome`) before its first block is computed, and again by every later run, so a
running job's output already says which network, input and plan fill it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, cast

from znni.engine.geometry import Box
from znni.engine.location import Location
from znni.engine.output.labels import stored_dtype

if TYPE_CHECKING:
    from znni.engine.io.formats import InputVolume
    from znni.engine.job import SegmentJob
    from znni.model.onnx_model import OnnxModel

ATTR = "znni"


def provenance(
    job: SegmentJob, volume: InputVolume, region: Box, plan: dict[str, Any] | None
) -> dict[str, Any]:
    """The provenance record of one run of `job` over `region`, following `plan`."""
    from znni import __version__

    plan = plan or {}
    mode = str(plan.get("mode", "exact"))
    whole = region == Box.from_shape(volume.shape)
    record: dict[str, Any] = {
        "version": __version__,
        "network": {"name": job.network.name, "digest": job.network.digest},
        "mode": mode,
        "window": None,
        "border": job.border,
        "dtype": job.dtype if job.labels is None else stored_dtype(
            job.labels, job.dtype, job.network.out_channels),  # --labels: uint8 or uint16
        # the arithmetic's (the output's dtype is `dtype`): what ran (auto: what it chose)
        "precision": plan.get("precision") or job.precision,
        "tta": job.tta,  # test-time flips (engine/compute/tta.py), as the CLI/API canonicalise
        "roi": None if whole else [[a, b] for a, b in zip(region.lo, region.hi, strict=True)],
        "plan": plan,
        "input": str(job.input_path.resolved()),
        "input_array": str((volume.ome.array_location if volume.ome else job.input_path)
                           .resolved()),
        "input_shape": [int(s) for s in volume.array.shape],
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        # docs/design.md "Labels, masks and empty blocks": what was stored and skipped
        "labels": job.labels,
        "mask": None if job.mask_path is None else str(job.mask_path.resolved()),
        "skip_empty": job.skip_empty,
    }
    for key in ("int8", "precision_auto"):  # the measured error and auto's choice
        if plan.get(key) is not None:
            record[key] = plan[key]
    if mode == "windowed":
        record["window"] = {"window": plan.get("window"), "overlap": plan.get("overlap"),
                            "blend": plan.get("blend")}
    package = getattr(job.network, "package", None)
    if package is not None:  # a bioimage.io package: its processing, statistics resolved
        net = cast("OnnxModel", job.network)  # only a graph model comes from a package
        record["package"] = {
            **package, "channel_names": list(net.channel_names), "halo": list(net.halo),
            "preprocessing": [op.record() for op in net.preprocessing],
            "postprocessing": [op.record() for op in net.postprocessing]}
    if volume.ome is not None:
        record["level"] = volume.ome.level
        record["voxel_size"] = list(volume.ome.scale)
        record["translation"] = list(volume.ome.translation)
        record["units"] = list(volume.ome.units)
    return record


def read_provenance(attrs: dict[str, Any], path: Location) -> dict[str, Any]:
    """The provenance in an output's attributes, or ValueError when it has none."""
    record = attrs.get(ATTR)
    if not isinstance(record, dict) or not isinstance(record.get("input_array"), str):
        raise ValueError(
            f"output {path} has no znni provenance (it was not written by this znni "
            "version), so its input is unknown"
        )
    return record


def record_bad_chunks(attrs: Any, input_array: str, keys: list[str]) -> None:
    """List the input chunks a `--on-bad-chunk fill` run filled with the fill value in the
    output's provenance (`attrs`: the array's or the OME group's), so none is silently wrong."""
    record = dict(attrs.get(ATTR) or {})
    record["bad_chunks"] = {"array": input_array, "filled_with": "the fill value",
                            "chunks": list(keys)}
    attrs.update({ATTR: record})


def note_bad_chunks(ledger: Any, target: Any, volume: InputVolume,
                    job: SegmentJob) -> list[str]:
    """The input chunks this job's runs filled with the fill value (noted in the ledger as
    the run went), listed in the output's provenance at the end of a finished run."""
    every: list[str] = ledger.bad_chunks()
    if every:
        array = volume.ome.array_location if volume.ome else job.input_path
        record_bad_chunks(_attrs(target, job), str(array.resolved()), every)
    return every


def _attrs(target: Any, job: SegmentJob) -> Any:
    """The attributes that hold the provenance: a plain array's, or the OME group's."""
    if target.format != "ome-zarr":  # a plain array's, or a precomputed output's znni.json
        return target.level0.attrs
    import zarr

    from znni.engine.io.stores import zarr_store

    return zarr.open_group(store=zarr_store(target.path, read_only=False, ctx=job.store),
                           mode="r+").attrs
