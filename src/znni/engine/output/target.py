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
from znni.engine.io.ome import OmeLevel, group_attrs, is_group, ome_level, output_metadata
from znni.engine.io.precomputed import check_geometry, open_or_create, output_geometry
from znni.engine.io.precomputed_scales import open_scales, pyramid_steps
from znni.engine.io.pyramid import Factors, PyramidBuilder, cumulative, level_shapes, level_steps
from znni.engine.io.stores import basename, driver_of, holds_anything, zarr_store
from znni.engine.io.volume import InputVolume, open_or_create_output, output_compressors
from znni.engine.job import SegmentJob
from znni.engine.output.form import stored_job_dtype
from znni.engine.output.labels import parse_labels
from znni.engine.output.provenance import ATTR, provenance
from znni.triple import as_triple

FORMATS = ("zarr", "ome-zarr")
DIMENSIONS = ("c", "z", "y", "x")


def existing_format(path: str, *, ctx: StoreContext) -> str | None:
    """'ome-zarr' for an existing group, 'zarr' for anything else there, None when absent."""
    if not holds_anything(path, ctx=ctx):
        return None
    return "ome-zarr" if is_group(path, ctx=ctx) else "zarr"


def output_plan(job: SegmentJob, volume: InputVolume, out_shape: tuple[int, ...],
                check: bool = True) -> tuple[str, Factors]:
    """(output format, pyramid halving steps) of a job, checked against an existing output
    (its levels' arrays too, unless `check` is False: checked already); raises ValueError,
    writes nothing."""
    if driver_of(job.output_path) is not None:
        return "precomputed", _precomputed_plan(job, volume, check)
    fmt, existing = job.output_format, existing_format(job.output_path, ctx=job.store)
    if fmt is not None and fmt not in FORMATS:
        raise ValueError(f"output format {fmt!r} is not one of {', '.join(FORMATS)}")
    if fmt is None:
        fmt = existing or ("ome-zarr" if volume.ome is not None else "zarr")
    elif existing is not None and existing != fmt:
        kind = "an OME-Zarr image" if existing == "ome-zarr" else "a plain Zarr array"
        raise ValueError(
            f"existing output {job.output_path} is {kind}, not {fmt}; remove it or choose "
            "another output path"
        )
    if fmt == "zarr":
        if job.pyramid:
            raise ValueError("--pyramid applies to OME-Zarr outputs (--output-format ome-zarr) "
                             "and precomputed:// ones")
        return fmt, []
    levels = job.pyramid
    attrs = group_attrs(job.output_path, ctx=job.store) if existing is not None else {}  # once
    if levels is None and existing is not None:
        levels = ome_level(job.output_path, 0, attrs, ctx=job.store).levels - 1
    source = source_level(volume)
    voxel = source.scale if source is not None else (1.0, 1.0, 1.0)
    steps = level_steps(volume.shape, voxel, levels)
    if existing is not None and check:
        _check_levels(job, out_shape, steps, attrs)
    return fmt, steps


def source_level(volume: InputVolume) -> OmeLevel | None:
    """The input's level as an OME-Zarr output describes its voxels: an OME-Zarr input's
    own; a precomputed input's scale, in nanometres, at its voxel offset; else None (unit
    voxels at 0)."""
    if volume.ome is not None:
        return volume.ome
    if driver_of(volume.path) != "precomputed":
        return None
    (rx, ry, rz), (ox, oy, oz) = output_geometry(volume.array, None)  # (x, y, z)
    return OmeLevel(volume.path, volume.path, 0, 1, "0.5", True, ("c", "z", "y", "x"),
                    ("nanometer",) * 3, (rz, ry, rx), (oz * rz, oy * ry, ox * rx))


def _precomputed_plan(job: SegmentJob, volume: InputVolume, check: bool) -> Factors:
    """A precomputed:// output, carrying the input's resolution and offset: its pyramid's
    halving steps (scales 1..K; --pyramid, else an existing output's, else none)."""
    if job.output_format not in (None, "precomputed"):
        raise ValueError(f"output {job.output_path} is a precomputed:// volume, not "
                         f"{job.output_format}; leave out --output-format or the prefix")
    geometry = output_geometry(volume.array, volume.ome)
    check_geometry(job.output_path, *geometry, ctx=job.store)
    return pyramid_steps(job.output_path, volume.shape, geometry, job.pyramid, check,
                         ctx=job.store)


def _check_levels(job: SegmentJob, out_shape: tuple[int, ...], steps: Factors,
                  attrs: dict[str, Any]) -> None:
    """An existing OME-Zarr output (whose group attributes are `attrs`) must hold exactly the
    levels this run would write."""
    import zarr

    path, ctx = job.output_path, job.store
    first = ome_level(path, 0, attrs, ctx=ctx)
    if first.levels != len(steps) + 1:
        raise ValueError(
            f"existing output {path} has {first.levels - 1} pyramid levels, this run writes "
            f"{len(steps)}; give --pyramid {first.levels - 1}, remove it or choose another path"
        )
    for k, shape in enumerate(level_shapes(volume_shape(out_shape), steps)):
        array_path = ome_level(path, k, attrs, ctx=ctx).array_path
        try:
            arr = zarr.open_array(store=zarr_store(array_path, read_only=True, ctx=ctx),
                                  mode="r")
        except Exception as e:  # zarr raises several unrelated types for "not an array"
            raise ValueError(f"existing output {path} has no level {k} array ({e})") from e
        want = (out_shape[0], *shape)
        dtype = stored_job_dtype(job)  # --labels: uint8 or uint16
        if tuple(arr.shape) != want or np.dtype(arr.dtype) != np.dtype(dtype):
            raise ValueError(
                f"existing output {path} level {k} is {tuple(arr.shape)} {arr.dtype}, expected "
                f"{want} {dtype}; remove it or choose another output path"
            )


def volume_shape(out_shape: tuple[int, ...]) -> Triple:
    return (out_shape[1], out_shape[2], out_shape[3])


@dataclass
class OutputTarget:
    """The opened output: level 0 for the block writers, the pyramid levels for the builder."""

    path: str
    format: str
    level0: Any
    level0_path: str
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
    """Create or open the job's output and record this run's provenance on it (the job was
    checked by `segment.prepare_run`, which also checked an existing output's levels)."""
    fmt, steps = output_plan(job, volume, out_shape, check=False)
    record = provenance(job, volume, region, plan)
    dtype = stored_job_dtype(job)  # --labels: uint8 or uint16 (output/labels.py)
    if fmt == "precomputed":  # neuroglancer's image, its provenance in znni.json
        geometry, kind = output_geometry(volume.array, volume.ome), (
            "segmentation" if job.labels else "image")
        array = open_or_create(job.output_path, out_shape, dtype, chunks, geometry,
                               ctx=job.store, volume_type=kind)
        array.attrs.update({ATTR: record})
        scales = open_scales(job.output_path, out_shape, dtype, as_triple(array.chunks[1:]),
                             geometry, steps, ctx=job.store, volume_type=kind)
        return OutputTarget(job.output_path, fmt, array, job.output_path, scales, steps, dtype,
                            labels=job.labels is not None)
    if fmt == "zarr":
        array = open_or_create_output(job.output_path, out_shape, dtype, chunks,
                                      ctx=job.store)
        array.attrs.update({ATTR: record})
        return OutputTarget(job.output_path, fmt, array, job.output_path, [], [], dtype)
    arrays, level0_path = _open_ome(job, volume, out_shape, chunks, steps, record)
    return OutputTarget(job.output_path, fmt, arrays[0], level0_path, arrays[1:], steps,
                        dtype, labels=job.labels is not None)


def _open_ome(job: SegmentJob, volume: InputVolume, out_shape: tuple[int, ...], chunks: Triple,
              steps: Factors, record: dict[str, Any]) -> tuple[list[Any], str]:
    """(the level arrays, level 0's array path) of an OME-Zarr output, creating the image
    when it is new."""
    import zarr

    path, ctx = job.output_path, job.store
    if existing_format(path, ctx=ctx) is not None:
        group = zarr.open_group(store=zarr_store(path, read_only=False, ctx=ctx), mode="r+")
        attrs = group.attrs.asdict()
        paths = [ome_level(path, k, attrs, ctx=ctx).array_path for k in range(len(steps) + 1)]
        group.attrs.update({ATTR: record})
        return [zarr.open_array(store=zarr_store(p, read_only=False, ctx=ctx), mode="r+")
                for p in paths], paths[0]
    meta = output_metadata(cumulative(steps), source_level(volume), basename(path))
    names = getattr(job.network, "channel_names", ())  # a bioimage.io package's
    if names and job.labels is None:
        meta["omero"] = {"channels": [{"label": str(n), "active": True} for n in names]}
    home, root_meta = labels_layout(job.labels, meta)
    group = zarr.create_group(store=zarr_store(path, read_only=False, ctx=ctx), zarr_format=3,
                              overwrite=True, attributes={"ome": root_meta, ATTR: record})
    levels_group = group
    for name, attrs in home:  # --labels: labels/NAME, the NGFF label image
        levels_group = levels_group.create_group(name, attributes={"ome": attrs})
    arrays, dtype = [], stored_job_dtype(job)
    for k, shape in enumerate(level_shapes(volume.shape, steps)):
        level_chunks = tuple(min(c, n) for c, n in zip(chunks, shape, strict=True))
        arrays.append(levels_group.create_array(
            str(k), shape=(out_shape[0], *shape), chunks=(out_shape[0], *level_chunks),
            dtype=dtype, fill_value=0, dimension_names=DIMENSIONS,
            compressors=output_compressors(dtype),
        ))
    return arrays, ome_level(path, 0, {"ome": root_meta}, ctx=ctx).array_path


def labels_layout(labels: str | None, meta: dict[str, Any]
                  ) -> tuple[list[tuple[str, dict[str, Any]]], dict[str, Any]]:
    """(the groups from the image down to its level arrays, each with its `ome` attributes;
    the image's own `ome`) for an OME-Zarr output's NGFF metadata `meta`. Labels live in the
    NGFF label image `labels/NAME` (`image-label` metadata, its levels `0`..`K`), and the
    image's own multiscales name those same arrays (`labels/NAME/k`), so a reader of the
    image, znni's resume and `znni preview` find level 0 where they always do."""
    if labels is None:
        return [], meta
    name = parse_labels(labels).name
    image_label = {"version": "0.5", "source": {"image": "../../"}}
    scales = [{**ms, "datasets": [{**d, "path": f"labels/{name}/{d['path']}"}
                                  for d in ms["datasets"]]} for ms in meta["multiscales"]]
    return ([("labels", {"version": "0.5", "labels": [name]}),
             (name, {**meta, "image-label": image_label})],
            {**meta, "multiscales": scales})
