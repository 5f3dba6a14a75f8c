"""Turning a submitted job into an engine `SegmentJob`, checked before anything is stored.

The API checks a submission with `check_submission`; the worker rebuilds the
same job from the stored parameters with `segment_job`, so a resumed run has
exactly the same arguments.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from znni.engine.compute.tta import canonical
from znni.engine.context import StoreContext
from znni.engine.job import MAX_ERROR, OUTPUT_FORMATS, SegmentJob
from znni.engine.location import TENSORSTORE_DRIVERS, Location
from znni.engine.scheduler import Scheduler
from znni.jobs.catalogue import Model, ModelOptions, NetworkCatalogue, model_mode
from znni.jobs.paths import confine, confine_url, looks_like_url, relative_to_root
from znni.model.onnx_model import OnnxModel
from znni.triple import Triple, as_triple

if TYPE_CHECKING:
    from znni.engine.output.form import OutputForm

WINDOW_FIELDS = ("window", "overlap", "blend")
OME_FIELDS = ("output_format", "pyramid", "level")
# the engine and model name their options as `znni segment` flags; the API's are fields
FLAG_FIELDS = {f"--{f.replace('_', '-')}": f for f in (*WINDOW_FIELDS, "scale", "shift",
                                                        "output_name", *OME_FIELDS,
                                                        "precision", "device", "tta",
                                                        "labels", "mask", "skip_empty",
                                                        "dtype", "max_error")}


def segment_job(
    network: Model,
    input_path: Location,
    output_path: Location,
    params: dict[str, Any],
    *,
    scheduler: str | None = None,
    overwrite: bool | None = None,
    store: StoreContext | None = None,
    mask_path: Location | None = None,
) -> SegmentJob:
    """The engine job for stored parameters (paths already confined and resolved; with a
    `level`, `input_path` is already that level's array, as `check_submission` stored it).
    `store`: the context whose caches the job may share (default: a fresh one). `mask_path`:
    the `mask` field confined (`locate_mask`)."""
    roi = params.get("roi")
    windowed = {k: params[k] for k in ("overlap", "blend") if params.get(k) is not None}
    return SegmentJob(
        network=network,
        input_path=input_path,
        output_path=output_path,
        roi=tuple((lo, hi) for lo, hi in roi) if roi is not None else None,
        border=params.get("border", "reflect"),
        dtype=params.get("dtype", "float32"),
        chunks=_triple(params.get("chunks")),
        block=_triple(params.get("block")),
        device=params.get("device", "auto"),
        precision=params.get("precision", "fp32"),
        max_error=params.get("max_error", MAX_ERROR),  # int8 and auto
        memory_limit_bytes=params.get("memory_limit_bytes"),
        scheduler=Scheduler.of(scheduler),
        overwrite=bool(params.get("overwrite", False)) if overwrite is None else overwrite,
        window=_triple(params.get("window")),
        output_format=params.get("output_format"),
        pyramid=params.get("pyramid"),
        store=store if store is not None else StoreContext(),
        on_bad_chunk=params.get("on_bad_chunk", "fail"),
        tta=_tta(params.get("tta")),  # test-time flips, in their recorded form
        labels=params.get("labels"),  # labels, mask, empty blocks (engine/output/form.py)
        mask_path=mask_path,
        skip_empty=params.get("skip_empty"),
        **windowed,
    )


def check_submission(
    catalogue: NetworkCatalogue,
    data_root: Path,
    *,
    network: str,
    input: str,
    output: str,
    params: dict[str, Any],
    scheduler: str | None = None,
    allow_url: tuple[str, ...] = (),
    store: StoreContext | None = None,
) -> tuple[Model, SegmentJob]:
    """Check everything a job needs; ValueError with one sentence naming the problem.

    `input` and `output` are as the user sent them (relative to `data_root`, or URLs under
    an `allow_url` prefix); `params` are the job's other fields (roi, border, dtype, ...,
    overwrite, window, ..., scale, output_format, pyramid, level). With a `level`, the job's
    `input_path` is that level's array of the OME-Zarr image (what the worker reads).
    Nothing is written: the engine's `check_and_plan` only reads (it also plans the run).
    `store`: the server's context, whose caches keep opened arrays between submissions.
    """
    from znni.engine.segment import check_and_plan

    store = store if store is not None else StoreContext()
    try:
        net = catalogue.get(network, ModelOptions.from_params(params))
    except ValueError as e:
        raise ValueError(api_words(str(e))) from e
    check_window_fields(net, network, params)
    check_ome_fields(params)
    input_path = _locate(data_root, allow_url, input, "input")
    output_path = _locate(data_root, allow_url, output, "output")
    if _overlap(input_path.bare().url, output_path.bare().url):
        raise ValueError(
            f"output {output!r} and input {input!r} overlap; the output must be a separate array"
        )
    if params.get("level") is not None:
        input_path = input_level(data_root, allow_url, input_path, input, int(params["level"]),
                                 store=store)
    job = segment_job(net, input_path, output_path, params, scheduler=scheduler, store=store,
                      mask_path=locate_mask(data_root, allow_url, params))
    check_overwrite(output_path, bool(params.get("overwrite", False)), output, store=store)
    try:
        check_and_plan(job)  # plans graph windows too: one too large for the budget fails
    except (ValueError, TypeError, FileNotFoundError, NotADirectoryError) as e:
        raise ValueError(api_words(relative_to_root(data_root, str(e)))) from e
    return net, job


@dataclass(frozen=True)
class PlanVolume:
    """A plan request's input as a job reads it: the region's start and shape (z, y, x),
    the input's bytes per value and the whole volume's shape (the output's and a mask's)."""

    lo: Triple
    region: Triple
    in_bytes: int
    shape: Triple


def plan_volume(
    data_root: Path, allow_url: tuple[str, ...], model: Model, input: str,
    roi: tuple[tuple[int | None, int | None], ...] | None, level: int | None,
    store: StoreContext | None = None,
) -> PlanVolume:
    """A plan request's input region, its input located as a job's is (`check_submission`)
    and read from its metadata alone; ValueError in API words."""
    from znni.engine.io.volume import open_input
    from znni.engine.units import resolve_roi

    ctx = store if store is not None else StoreContext()
    path = _locate(data_root, allow_url, input, "input")
    if level is not None:
        path = input_level(data_root, allow_url, path, input, level, store=ctx)
    try:
        volume = open_input(path, model.in_channels, ctx=ctx)
        (z0, z1), (y0, y1), (x0, x1) = resolve_roi(roi, volume.shape)
    except (ValueError, TypeError, FileNotFoundError, NotADirectoryError) as e:
        raise ValueError(api_words(relative_to_root(data_root, str(e)))) from e
    return PlanVolume((z0, y0, x0), (z1 - z0, y1 - y0, x1 - x0), int(volume.dtype.itemsize),
                      as_triple(volume.shape))


def plan_form(
    data_root: Path, allow_url: tuple[str, ...], model: Model, params: dict[str, Any],
    volume_shape: Triple | None, store: StoreContext | None = None,
) -> OutputForm:
    """A plan request's output form (`labels`, `dtype`, `mask`, `skip_empty` in `params`),
    checked as a job's is (`check_and_plan`: engine.output.form), its mask located and
    confined as the job's (`locate_mask`); a mask needs the input's `volume_shape`.
    ValueError in API words."""
    from znni.engine.output.form import make_form

    mask_path = locate_mask(data_root, allow_url, params)
    if mask_path is not None and volume_shape is None:
        raise ValueError("mask needs an input, the volume whose shape it divides")
    try:
        return make_form(params.get("labels"), params.get("dtype", "float32"), mask_path,
                         params.get("skip_empty"), model.out_channels,
                         volume_shape or (1, 1, 1),
                         ctx=store if store is not None else StoreContext())
    except (ValueError, TypeError, FileNotFoundError, NotADirectoryError) as e:
        raise ValueError(api_words(relative_to_root(data_root, str(e)))) from e


def _locate(root: Path, allow_url: tuple[str, ...], given: str, what: str) -> Location:
    """A confined local path (the input and a mask must exist), or a URL under an allowed
    prefix; a `precomputed://` or `n5://` volume's location confined the same way, its
    driver kept (its scale is the job's `level`, not a '#' part). Parsed here, once."""
    driver = next((d for d in TENSORSTORE_DRIVERS if isinstance(given, str)
                   and given.lower().startswith(f"{d}://")), None)
    prefix, location = ("", given) if driver is None else (given[:len(driver) + 3],
                                                           given[len(driver) + 3:])
    if driver is not None and "#" in location:
        raise ValueError(f"{what} {given!r} has a '#' part; give a precomputed scale as the "
                         "job's level")
    if looks_like_url(location):
        return Location.parse(prefix + confine_url(allow_url, location, what), what)
    confined = confine(root, location, what, must_exist=what in ("input", "mask", "affinities"))
    return Location.parse(prefix + str(confined), what)


def locate(root: Path, allow_url: tuple[str, ...], given: str, what: str) -> Location:
    """A user's path or URL located as a job's input is (`what`: "input", "output",
    "affinities", "mask"; an input, affinities or mask must exist)."""
    return _locate(root, allow_url, given, what)


def overlap(a: Location, b: Location) -> bool:
    """Whether the two locations are one array or one lies inside the other."""
    return _overlap(a.bare().url, b.bare().url)


def locate_mask(root: Path, allow_url: tuple[str, ...],
                params: dict[str, Any]) -> Location | None:
    """The job's `mask` field confined as the input is (None without one)."""
    mask = params.get("mask")
    return None if mask is None else _locate(root, allow_url, str(mask), "mask")


def _overlap(a: str, b: str) -> bool:
    a, b = a.rstrip("/"), b.rstrip("/")
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def check_ome_fields(params: dict[str, Any]) -> None:
    """output_format is zarr or ome-zarr; pyramid and level are whole numbers >= 0 (whether
    they fit the input and output is the engine's check, in `check_and_plan`)."""
    fmt = params.get("output_format")
    if fmt is not None and fmt not in OUTPUT_FORMATS:
        raise ValueError(f"output_format {fmt!r} is not one of {', '.join(OUTPUT_FORMATS)}")
    for name in ("pyramid", "level"):
        value = params.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or value < 0):
            raise ValueError(f"{name} {value!r} must be a whole number, 0 or more")


def input_level(root: Path, allow_url: tuple[str, ...], input_path: Location, shown: str,
                level: int, *, store: StoreContext) -> Location:
    """The array of level `level` of the OME-Zarr image at `input_path` (confined: the
    image's metadata may not lead out of the data root or the allowed URL prefixes)."""
    from znni.engine.io.ome import level_path

    if input_path.is_tensorstore:  # a precomputed scale: the same location, #mip=N
        return level_path(input_path, level, ctx=store)
    try:
        array = level_path(input_path, level, ctx=store)
    except (ValueError, TypeError, FileNotFoundError, NotADirectoryError) as e:
        raise ValueError(api_words(relative_to_root(root, str(e)))) from e
    if array.is_remote:
        try:
            return Location.parse(confine_url(allow_url, array.url, "input"), "input")
        except ValueError as e:
            raise ValueError(f"level {level} of input {shown!r} is not readable here: {e}") from e
    resolved = Path(array.url).resolve(strict=False)
    if not resolved.is_relative_to(root) or resolved == root:
        raise ValueError(
            f"level {level} of input {shown!r} names an array outside the data root"
        )
    return Location.parse(resolved, "input")


def check_window_fields(net: Model, name: str, params: dict[str, Any]) -> None:
    """window applies to ONNX graph models (their window, or tile in exact mode); overlap
    and blend only to windowed ones. Any of them where it does not apply is refused."""
    graph = isinstance(net, OnnxModel)
    if model_mode(net) == "windowed":
        return
    fields = ("overlap", "blend") if graph else WINDOW_FIELDS
    given = [f for f in fields if params.get(f) is not None]
    if given:
        what = "graph" if graph else "sequential network"
        raise ValueError(
            f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to windowed models "
            f"only; network {name!r} runs in exact mode (its {what} computes every voxel "
            "independently of where windows lie)"
        )


def api_words(text: str) -> str:
    """An engine or model sentence with `znni segment` flags named as the API's fields."""
    for flag, name in FLAG_FIELDS.items():
        text = text.replace(flag, name)
    return text


def _tta(value: Any) -> str | None:
    """The `tta` field checked (a refusal in the API's words) and in its recorded form."""
    try:
        return canonical(value)
    except ValueError as e:
        raise ValueError(api_words(str(e))) from e


def _triple(value: Any) -> Triple | None:
    """A stored (z, y, x) list as a Triple; None stays None (the engine's default)."""
    return as_triple(value) if value is not None else None


def check_overwrite(output_path: Location, overwrite: bool, shown: str, *,
                    store: StoreContext) -> None:
    """An existing output is only written again with overwrite, or to resume its own run.

    (The engine refuses a ledger of another job; this also refuses an output without one.)
    """
    from znni.engine.io.ledger import read_ledger
    from znni.engine.io.stores import exists

    if overwrite or not exists(output_path, ctx=store):
        return
    header, _ = read_ledger(output_path, ctx=store)
    if header is None:
        raise ValueError(f'output {shown!r} already exists; send "overwrite": true to replace it')
