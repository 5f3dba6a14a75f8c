"""Neuroglancer precomputed (and N5) volumes, through TensorStore's own drivers.

A path `precomputed://LOCATION[#mip=N]` (LOCATION a local path, s3://, gs:// or a read-only
http(s):// URL) names scale N (default 0) of a precomputed volume; `n5://LOCATION` an N5
dataset (input only). The format is never hand-written: TensorStore's
`neuroglancer_precomputed` and `n5` drivers read and write it. What travels to workers
(Dask block specs) is the `Location`; each process builds the TensorStore spec JSON from
it (`ts_spec`) and opens its own handle, so nothing unpicklable crosses.

Axes: precomputed stores (x, y, z, channel) with its voxel offset as the domain's origin;
`TsArray` shows it as znni's zero-based (c, z, y, x). N5's (z, y, x) or (c, z, y, x) as
TensorStore presents it (C order) is znni's already. An output's provenance (the `znni`
attribute of Zarr outputs) is `znni.json` beside its `info`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from znni.engine.context import StoreContext
from znni.engine.io.retry import tries
from znni.engine.io.stores import options_for, read_bytes, write_bytes
from znni.engine.location import Location

if TYPE_CHECKING:
    from znni.engine.geometry import Triple

PROVENANCE_FILE = "znni.json"
VOLUME_TYPES = ("image", "segmentation")
SEGMENTATION_DTYPES = ("uint8", "uint16", "uint32", "uint64")
Xyz = tuple[float, float, float]


def kvstore_spec(location: Location, ctx: StoreContext) -> dict[str, Any]:
    """TensorStore's kvstore JSON for a local path or URL, with the context's options for its
    bucket mapped to TensorStore's: endpoint_url (or AWS_ENDPOINT_URL) -> endpoint, region
    -> aws_region, anon -> anonymous credentials, profile; keys come from the environment."""
    location = location.bare()
    if location.is_local:
        return {"driver": "file", "path": str(Path(location.url).resolve()) + "/"}
    bucket, key = location.bucket, location.key
    prefix = key + "/" if key else ""
    if location.is_http:
        return {"driver": "http", "base_url": location.url.rstrip("/") + "/"}
    if location.scheme == "gs":
        return {"driver": "gcs", "bucket": bucket, "path": prefix}
    return {"driver": "s3", "bucket": bucket, "path": prefix,
            **_s3_options(options_for(location, ctx), location)}


def _s3_options(options: Mapping[str, Any], location: Location) -> dict[str, Any]:
    client = options.get("client_kwargs") or {}
    if options.get("key") or options.get("secret"):
        raise ValueError(f"{location}: TensorStore takes S3 keys from the environment "
                         "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY) or a profile, not from "
                         "--storage-option key/secret")
    out: dict[str, Any] = {}
    endpoint = (options.get("endpoint_url") or client.get("endpoint_url")
                or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"))
    if endpoint:
        out["endpoint"] = str(endpoint)
    region = (options.get("region") or client.get("region_name")
              or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"))
    if region:
        out["aws_region"] = str(region)
    if options.get("anon"):
        out["aws_credentials"] = {"type": "anonymous"}
    elif options.get("profile"):
        out["aws_credentials"] = {"type": "profile", "profile": str(options["profile"])}
    elif os.environ.get("AWS_ACCESS_KEY_ID"):  # not the default chain: its ~/.aws probes log
        out["aws_credentials"] = {"type": "environment"}
    return out


def ts_spec(path: Location, ctx: StoreContext) -> dict[str, Any]:
    """The TensorStore spec JSON that opens the volume at `path` (an existing one)."""
    kv = kvstore_spec(path, ctx)
    if path.driver == "n5":
        return {"driver": "n5", "kvstore": kv}
    return {"driver": "neuroglancer_precomputed", "kvstore": kv, "scale_index": path.scale}


def ts_context() -> Any:
    """TensorStore's context: its requests retried ZNNI_STORE_RETRIES times in all (default
    5), with backoff from 0.2 s, as znni's own store requests are (TensorStore's default
    keeps retrying a refused connection for minutes)."""
    import tensorstore as ts

    retries = {"max_retries": tries(), "initial_delay": "0.2s", "max_delay": "5s"}
    return ts.Context({f"{kind}_request_retries": retries for kind in ("http", "s3", "gcs")})


def error_sentence(e: BaseException) -> str:
    """TensorStore's error without the spec it appends, on one line."""
    return " ".join(str(e).split(" [tensorstore_spec")[0].split())


def read_info(path: Location, what: str, *, ctx: StoreContext) -> dict[str, Any] | None:
    """A precomputed volume's `info` as JSON, None when it has none; ValueError when it cannot
    be read or is not JSON."""
    import tensorstore as ts

    try:
        store = ts.KvStore.open(kvstore_spec(path, ctx), context=ts_context()).result()
        raw = store.read("info").result()
    except ValueError as e:  # an unreachable or refusing store: TensorStore's sentence
        raise ValueError(f"{what} {path} could not be read ({error_sentence(e)})") from e
    if raw.state == "missing":
        return None
    try:
        info = json.loads(bytes(raw.value))
    except ValueError as e:
        raise ValueError(f"{what} {path} has an info file that is not JSON ({e})") from e
    if not isinstance(info, dict) or not isinstance(info.get("scales"), list):
        raise ValueError(f"{what} {path} has an info file without a list of scales")
    return info


def scale_of(info: dict[str, Any], path: Location, what: str) -> dict[str, Any]:
    """The scale entry `path` names, or ValueError naming the scales there are."""
    k, scales = path.scale, info["scales"]
    if k >= len(scales):
        raise ValueError(f"{what} {path} has no scale {k}: it has {len(scales)} "
                         f"(0..{len(scales) - 1})")
    return scales[k]


class TsArray:
    """A TensorStore array seen as znni sees arrays: zero-based, (c, z, y, x) or (z, y, x),
    indexed by slices and written whole boxes at a time. `reverse`: the store's axes are
    (x, y, z, c) (precomputed) and are shown reversed."""

    def __init__(self, handle: Any, path: Location, reverse: bool, ctx: StoreContext,
                 info: dict[str, Any] | None = None) -> None:
        origin = [0] * handle.rank
        self.handle = handle.translate_to[origin]  # the voxel offset becomes 0
        self.path, self.reverse, self.ctx, self.info = path, reverse, ctx, info
        native = tuple(int(n) for n in self.handle.shape)
        chunks = tuple(int(n) for n in self.handle.chunk_layout.read_chunk.shape)
        self.shape = native[::-1] if reverse else native
        self.chunks = chunks[::-1] if reverse else chunks
        self.dtype = np.dtype(self.handle.dtype.numpy_dtype)
        self.fill_value = 0
        self.attrs = ProvenanceFile(path.join(PROVENANCE_FILE), ctx)

    @property
    def scale(self) -> dict[str, Any]:
        """The precomputed scale entry of this volume ({} for N5)."""
        return scale_of(self.info, self.path, "volume") if self.info else {}

    def with_config(self, config: Mapping[str, Any]) -> TsArray:
        """Itself: zarr's array options (the pyramid's `write_empty_chunks`) have no
        TensorStore meaning here."""
        return self

    def _native(self, key: Any) -> tuple[slice, ...]:
        key = key if isinstance(key, tuple) else (key,)
        return tuple(key[::-1]) if self.reverse else tuple(key)

    def __getitem__(self, key: Any) -> np.ndarray:
        values = self.handle[self._native(key)].read().result()
        # precomputed: (X, Y, Z, C) -> (C, Z, Y, X)
        return np.asarray(values).transpose() if self.reverse else np.asarray(values)

    def __setitem__(self, key: Any, values: np.ndarray) -> None:
        # precomputed: (C, Z, Y, X) -> (X, Y, Z, C)
        native = np.asarray(values, self.dtype).transpose() if self.reverse else values
        self.handle[self._native(key)].write(native).result()


class ProvenanceFile:
    """`znni.json` beside a precomputed output's `info`: the `attrs` a Zarr array has."""

    def __init__(self, path: Location, ctx: StoreContext) -> None:
        self.path, self.ctx = path, ctx

    def asdict(self) -> dict[str, Any]:
        raw = read_bytes(self.path, "output", ctx=self.ctx)
        try:
            found = json.loads(raw) if raw is not None else {}
        except ValueError:
            return {}
        return found if isinstance(found, dict) else {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.asdict().get(key, default)

    def update(self, values: Mapping[str, Any]) -> None:
        body = json.dumps({**self.asdict(), **values}).encode()
        if self.path.is_remote:
            write_bytes(self.path, body, ctx=self.ctx)
        else:
            Path(self.path.url).write_bytes(body)


def open_volume(path: Location, what: str, *, ctx: StoreContext,
                write: bool = False) -> TsArray:
    """Open an existing precomputed or N5 volume, or raise ValueError saying why not (no
    `info`, no such scale, an unreadable location)."""
    import tensorstore as ts

    info = None
    if path.driver == "precomputed":
        info = read_info(path, what, ctx=ctx)
        if info is None:
            raise ValueError(f"{what} {path} has no info file (not a neuroglancer precomputed "
                             "volume)")
        scale_of(info, path, what)
    try:
        handle = ts.open(ts_spec(path, ctx), read=True, write=write, context=ts_context()).result()
    except ValueError as e:
        raise ValueError(f"{what} {path} could not be opened ({error_sentence(e)})") from e
    return TsArray(handle, path, path.driver == "precomputed", ctx, info)


def existing_chunks(path: Location, shape: tuple[int, ...], dtype: str, *, ctx: StoreContext,
                    volume_type: str = "image") -> Triple | None:
    """(z, y, x) chunks of an existing precomputed output that fits a (c, z, y, x) `shape`
    of `dtype`, None when there is none yet; ValueError when its `info` conflicts."""
    from znni.engine.io.stores import holds_anything

    if path.driver != "precomputed":
        raise ValueError(f"output {path} is an N5 dataset; znni reads N5 and writes Zarr or "
                         "precomputed:// volumes")
    if path.level is not None:
        raise ValueError(f"output {path} names a scale; znni writes scale 0 of a precomputed "
                         "output, so leave out the #mip")
    info = read_info(path, "output", ctx=ctx)
    if info is None:
        if holds_anything(path.bare(), ctx=ctx):
            raise ValueError(f"output {path} holds files but no info (not a precomputed "
                             "volume); remove them or choose another output path")
        return None
    scale = scale_of(info, path, "existing output")
    want = {"type": volume_type, "data_type": dtype, "num_channels": shape[0],
            "size": list(shape[:0:-1])}  # (c, z, y, x) -> [x, y, z]
    found = {"type": info.get("type"), "data_type": info.get("data_type"),
             "num_channels": info.get("num_channels"), "size": scale.get("size")}
    if found != want:
        diff = ", ".join(f"{k} {found[k]} (expected {want[k]})" for k in want
                         if found[k] != want[k])
        raise ValueError(f"existing output {path} has an info that conflicts with this job: "
                         f"{diff}; remove it or choose another output path")
    x, y, z = (int(c) for c in scale["chunk_sizes"][0])
    return (z, y, x)


def create_output(path: Location, shape: tuple[int, ...], dtype: str, chunks: Triple,
                  resolution: Xyz, offset: tuple[int, int, int], *, ctx: StoreContext,
                  volume_type: str = "image") -> TsArray:
    """A new precomputed volume of one scale for a (c, z, y, x) `shape`: `info` written with
    `resolution` (nm) and `offset` (voxels, x, y, z), type image or segmentation (one
    channel of uint8..uint64 labels, which neuroglancer shows as segments)."""
    import tensorstore as ts

    if volume_type not in VOLUME_TYPES:
        raise ValueError(f"volume type {volume_type!r} is not one of {', '.join(VOLUME_TYPES)}")
    if volume_type == "segmentation" and (dtype not in SEGMENTATION_DTYPES or shape[0] != 1):
        kinds = ", ".join(SEGMENTATION_DTYPES)
        raise ValueError(f"a segmentation output holds one channel of {kinds}, not "
                         f"{shape[0]} of {dtype}")
    cz, cy, cx = chunks
    spec = {
        "driver": "neuroglancer_precomputed", "kvstore": kvstore_spec(path, ctx),
        "multiscale_metadata": {"type": volume_type, "data_type": dtype,
                                "num_channels": int(shape[0])},
        "scale_metadata": {"size": [int(n) for n in shape[:0:-1]],  # (c, z, y, x) -> [x, y, z]
                           "resolution": [float(r) for r in resolution],
                           "voxel_offset": [int(o) for o in offset],
                           "chunk_size": [cx, cy, cz], "encoding": "raw"},
        "create": True, "open": True,
    }
    try:
        handle = ts.open(spec, context=ts_context()).result()
    except ValueError as e:
        raise ValueError(f"output {path} could not be created ({error_sentence(e)})") from e
    return TsArray(handle, path, True, ctx, read_info(path, "output", ctx=ctx))


UNIT_NM = {"nanometer": 1.0, "micrometer": 1000.0, "millimeter": 1e6, "angstrom": 0.1}


def output_geometry(array: Any, ome: Any) -> tuple[Xyz, tuple[int, int, int]]:
    """(resolution in nm, voxel offset), both (x, y, z), an output takes from its input: a
    precomputed scale's own; an OME-Zarr level's voxel size (in nm where its unit says) and
    its offset where that is whole voxels; else 1 nm voxels at 0."""
    if isinstance(array, TsArray) and array.info:
        scale = array.scale
        rx, ry, rz = (float(r) for r in scale["resolution"])
        ox, oy, oz = (int(o) for o in scale.get("voxel_offset", (0, 0, 0)))
        return (rx, ry, rz), (ox, oy, oz)
    if ome is None:
        return (1.0, 1.0, 1.0), (0, 0, 0)
    nm = [float(s) * UNIT_NM.get(u or "nanometer", 1.0) for s, u in zip(ome.scale, ome.units,
                                                                     strict=True)]
    voxels = [t / s if s else 0.0 for t, s in zip(ome.translation, ome.scale, strict=True)]
    whole = all(float(v).is_integer() for v in voxels)
    oz, oy, ox = (int(v) if whole else 0 for v in voxels)
    return (nm[2], nm[1], nm[0]), (ox, oy, oz)


def check_geometry(path: Location, resolution: Xyz, offset: tuple[int, int, int], *,
                   ctx: StoreContext) -> None:
    """An existing precomputed output must carry the input's resolution and voxel offset."""
    info = read_info(path, "output", ctx=ctx)
    if info is None:
        return
    scale = scale_of(info, path, "existing output")
    found = ([float(r) for r in scale.get("resolution", ())],
             [int(o) for o in scale.get("voxel_offset", (0, 0, 0))])
    if found != ([float(r) for r in resolution], [int(o) for o in offset]):
        raise ValueError(f"existing output {path} has resolution {found[0]} and voxel offset "
                         f"{found[1]}, the input {list(resolution)} and {list(offset)}; remove "
                         "it or choose another output path")


def open_or_create(path: Location, shape: tuple[int, ...], dtype: str, chunks: Triple,
                   geometry: tuple[Xyz, tuple[int, int, int]], *, ctx: StoreContext,
                   volume_type: str = "image") -> TsArray:
    """A precomputed output for writing: the existing one (checked), else a new one with
    `geometry` ((resolution, offset), as `output_geometry` gives it)."""
    if existing_chunks(path, shape, dtype, ctx=ctx, volume_type=volume_type) is not None:
        return open_volume(path, "output", ctx=ctx, write=True)
    return create_output(path, shape, dtype, chunks, *geometry, ctx=ctx,
                         volume_type=volume_type)
