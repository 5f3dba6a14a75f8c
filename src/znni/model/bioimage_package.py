"""bioimage.io model packages (a zip, a folder or its `rdf.yaml`) as znni models.

The package is parsed and validated by `bioimageio.spec` (format 0.5; 0.4 is converted
by the library), then mapped onto what znni runs: its ONNX weights become an
`OnnxModel` (windowed), its axes must be (batch, channel, z, y, x) in that order (the
ONNX input's layout; znni feeds (N, C, Z, Y, X)), its parameterized input size (`min` +
n * `step`) narrows the model's window grid, its output halo sets a smallest window,
and its pre- and postprocessing become `processing` ops. Anything else is refused
with one sentence before any compute.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from znni.model import processing as P
from znni.model.onnx_model import OnnxModel, load_onnx_model
from znni.triple import Triple

RDF_NAMES = ("rdf.yaml", "bioimageio.yaml")
SPATIAL = ("z", "y", "x")
EXPORT_HINT = (
    "export the network to ONNX (torch.onnx.export(model, example, 'weights.onnx', "
    "dynamic_axes=...)) and add it as the package's `weights.onnx` entry, or convert the "
    "weights with bioimageio.core's weight conversion (bioimageio.core.weight_converters)"
)


def is_package(path: str | Path) -> bool:
    """Whether `path` names a bioimage.io package: a .zip, a folder, or an rdf.yaml."""
    p = Path(path)
    return p.suffix.lower() == ".zip" or p.is_dir() or p.name.endswith(RDF_NAMES) \
        or p.suffix.lower() in (".yaml", ".yml")


def read_package(path: str | Path) -> Any:
    """The validated `ModelDescr` (format 0.5) of the package; ValueError if invalid."""
    from bioimageio.spec import InvalidDescr, load_description
    from bioimageio.spec.model.v0_5 import ModelDescr

    p = Path(path)
    if not p.exists():
        raise ValueError(f"bioimage.io package {path} does not exist")
    source = p / _rdf_name(p) if p.is_dir() else p
    try:
        descr = load_description(source, format_version="latest", perform_io_checks=True)
    except Exception as e:  # noqa: BLE001 - a YAML or zip the library cannot parse
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"bioimage.io package {path} cannot be read: {first}") from e
    if isinstance(descr, InvalidDescr):
        raise ValueError(f"bioimage.io package {path} is invalid: {_first_error(descr)}")
    if not isinstance(descr, ModelDescr):
        raise ValueError(f"bioimage.io package {path} describes a {descr.type}, not a model")
    return descr


def _rdf_name(folder: Path) -> str:
    for name in RDF_NAMES:
        if (folder / name).is_file():
            return name
    raise ValueError(f"network {folder} is a directory without an rdf.yaml; give a JSON "
                     "network spec, an .onnx model file or a bioimage.io package (a .zip, or "
                     "a folder with its rdf.yaml)")


def _first_error(descr: Any) -> str:
    """The most telling validation error: a value error's message with its field."""
    errors = [e for d in descr.validation_summary.details for e in d.errors]
    if not errors:
        return "the library gave no reason"
    best = next((e for e in errors if e.msg.startswith("Value error")), errors[0])
    loc = ".".join(str(v) for v in best.loc if re.fullmatch(r"[a-z0-9_]+", str(v)))
    msg = best.msg.removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg


def load_package(path: str | Path) -> OnnxModel:
    """The package as a windowed `OnnxModel` with its processing; ValueError if refused."""
    descr = read_package(path)
    if len(descr.inputs) != 1 or len(descr.outputs) != 1:
        raise ValueError(f"bioimage.io package {path} has {len(descr.inputs)} inputs and "
                         f"{len(descr.outputs)} outputs; znni runs models of one of each")
    inp, out = descr.inputs[0], descr.outputs[0]
    in_min, in_step = _input_axes(path, inp)
    halo, names = _output_axes(path, out, inp)
    pre = tuple(op for p in inp.preprocessing if (op := _op(path, p, "preprocessing")))
    post = tuple(op for p in out.postprocessing if (op := _op(path, p, "postprocessing")))
    if any(op.needs() for op in post):
        raise ValueError(f"bioimage.io package {path}: postprocessing {post[0].name} needs "
                         "statistics of the whole output, which znni does not compute")
    base = load_onnx_model(onnx_weights(path, descr))
    if base.mode != "windowed":
        raise ValueError(f"bioimage.io package {path}: its ONNX model's output is smaller than "
                         "its input (valid convolutions); znni runs packages whose output has "
                         "the input's size")
    if base.in_channels != _channels(inp) or base.out_channels != _channels(out):
        raise ValueError(f"bioimage.io package {path} declares {_channels(inp)} input and "
                         f"{_channels(out)} output channels; its ONNX model has "
                         f"{base.in_channels} and {base.out_channels}")
    factor, minimum, fixed = _grid(base, in_min, in_step, halo)
    digest = hashlib.sha256(f"{base.digest}|bioimage|{pre!r}|{post!r}|{minimum}|{factor}"
                            .encode()).hexdigest()
    return replace(base, name=str(descr.name), digest=digest, size_factor=factor,
                   min_window=minimum, fixed_window=fixed or base.fixed_window,
                   preprocessing=pre, postprocessing=post,
                   channel_names=names, halo=halo, package=package_info(path, descr))


def package_info(path: str | Path, descr: Any) -> dict[str, Any]:
    """What a listing shows: name, description, citations and the package's version."""
    cite = [{"text": c.text, **({"doi": str(c.doi)} if c.doi else {}),
             **({"url": str(c.url)} if c.url else {})} for c in descr.cite]
    return {"name": str(descr.name), "description": str(descr.description), "cite": cite,
            "format_version": str(descr.format_version), "source": str(path)}


def _channels(tensor: Any) -> int:
    ch = [a for a in tensor.axes if a.type == "channel"]
    return len(ch[0].channel_names) if ch else 1


def _input_axes(path: str | Path, inp: Any) -> tuple[Triple, Triple]:
    """(min, step) per spatial axis; step 0 for a fixed size."""
    types = [a.type for a in inp.axes]
    spatial = [str(a.id) for a in inp.axes if a.type == "space"]
    if len(spatial) == 2:
        raise ValueError(f"bioimage.io package {path} is a 2D model (input axes "
                         f"{_axes(inp)}); znni runs 3D models (z, y, x)")
    if types != ["batch", "channel", "space", "space", "space"] or spatial != list(SPATIAL):
        raise ValueError(f"bioimage.io package {path} has input axes {_axes(inp)}; znni runs "
                         "packages whose input axes are batch, channel, z, y, x in that order")
    mins, steps = [], []
    for a in inp.axes[2:]:
        size = a.size
        if isinstance(size, int):
            mins.append(size)
            steps.append(0)
        elif hasattr(size, "step"):
            mins.append(int(size.min))
            steps.append(int(size.step))
        else:
            raise ValueError(f"bioimage.io package {path}: input axis {a.id} takes its size "
                             "from another tensor; znni needs a fixed or min + n*step size")
    return (mins[0], mins[1], mins[2]), (steps[0], steps[1], steps[2])


def _output_axes(path: str | Path, out: Any, inp: Any) -> tuple[Triple, tuple[str, ...]]:
    """(halo per spatial axis, output channel names); the output must have the input's
    spatial size (a reference to the input's axis without offset)."""
    types = [a.type for a in out.axes]
    if types != ["batch", "channel", "space", "space", "space"] \
            or [str(a.id) for a in out.axes[2:]] != list(SPATIAL):
        raise ValueError(f"bioimage.io package {path} has output axes {_axes(out)}; znni runs "
                         "packages whose output axes are batch, channel, z, y, x in that order")
    halo = []
    for a in out.axes[2:]:
        ref = a.size
        same = getattr(ref, "tensor_id", None) == inp.id and str(ref.axis_id) == str(a.id) \
            and int(ref.offset) == 0
        if not same or float(a.scale) != 1.0 and float(a.scale) != _in_scale(inp, a.id):
            raise ValueError(f"bioimage.io package {path}: output axis {a.id} does not have "
                             "the input's size; znni runs same-size (padded) models")
        halo.append(int(getattr(a, "halo", 0) or 0))
    names = tuple(str(n) for n in out.axes[1].channel_names)
    return (halo[0], halo[1], halo[2]), names


def _in_scale(inp: Any, axis_id: Any) -> float:
    return next(float(a.scale) for a in inp.axes if a.id == axis_id)


def _axes(tensor: Any) -> str:
    return ", ".join(str(a.id) for a in tensor.axes)


def _grid(base: OnnxModel, in_min: Triple, in_step: Triple, halo: Triple
          ) -> tuple[Triple, Triple, Triple | None]:
    """(step, smallest window, fixed window or None) on both the ONNX model's and the
    package's grids; the smallest window is at least twice the halo plus one voxel."""
    if any(in_step) and not all(in_step):
        raise ValueError(f"the package fixes the input size on some axes ({in_min}, steps "
                         f"{in_step}) but not others; znni needs all fixed or none")
    factor, minimum = [], []
    for a in range(3):
        f, m = base.size_factor[a], base.min_window[a]
        s, pm = in_step[a], in_min[a]
        step = 1 if s == 0 else f * s // math.gcd(f, s)
        floor = pm if s == 0 else max(m, pm, 2 * halo[a] + 1)
        w = next((w for w in range(floor, floor + step + f * max(s, 1) + 1)
                  if w >= m and (w - m) % f == 0 and (s == 0 or (w - pm) % s == 0)), None)
        if w is None or (s == 0 and w != pm):
            raise ValueError(f"the package's input size {pm} + n*{s} on axis {SPATIAL[a]} "
                             f"never fits its ONNX model's window grid {m} + n*{f}")
        factor.append(step)
        minimum.append(w)
    fixed = None if any(in_step) else (minimum[0], minimum[1], minimum[2])
    return (factor[0], factor[1], factor[2]), (minimum[0], minimum[1], minimum[2]), fixed


def _op(path: str | Path, p: Any, where: str) -> P.Op | None:
    """The processing op for the spec's description `p` (None: a no-op)."""
    name = str(p.id)
    kw: Any = getattr(p, "kwargs", None)  # the op's own kwargs class (bioimageio.spec), or None
    if name == "ensure_dtype":
        return None if kw.dtype == "float32" else P.EnsureDtype(name, kw.dtype)
    if name == "sigmoid":
        return P.Sigmoid(name)
    if name == "softmax" and str(kw.axis) == "channel":
        return P.Softmax(name)
    if name == "scale_linear":
        _along_channel(path, kw, name)
        return P.ScaleLinear(name, _vals(kw.gain), _vals(kw.offset))
    if name == "fixed_zero_mean_unit_variance":
        _along_channel(path, kw, name)
        return P.ZeroMeanUnitVariance(name, _vals(kw.mean), _vals(kw.std), eps=0.0)
    if name == "binarize":
        _along_channel(path, kw, name)
        return P.Binarize(name, _vals(kw.threshold))
    if name == "zero_mean_unit_variance":
        return P.ZeroMeanUnitVariance(name, eps=float(kw.eps), joint=_joint(path, kw, name))
    if name == "scale_range":
        if kw.reference_tensor is not None and where == "postprocessing":
            raise ValueError(f"bioimage.io package {path}: postprocessing scale_range with a "
                             "reference tensor is not supported")
        return P.ScaleRange(name, float(kw.min_percentile), float(kw.max_percentile),
                            float(kw.eps), _joint(path, kw, name))
    if name == "clip":
        joint = _joint(path, kw, name) if kw.axes is not None or kw.min_percentile is not None \
            or kw.max_percentile is not None else True
        return P.Clip(name, _opt(kw.min), _opt(kw.max), kw.min_percentile, kw.max_percentile,
                      joint)
    raise ValueError(f"bioimage.io package {path}: {where} {name!r} is not supported (znni "
                     "applies scale_linear, scale_range, zero_mean_unit_variance, "
                     "fixed_zero_mean_unit_variance, clip, binarize, sigmoid, softmax over "
                     "channels and ensure_dtype)")


def _vals(v: Any) -> tuple[float, ...]:
    return tuple(float(x) for x in v) if isinstance(v, list | tuple) else (float(v),)


def _opt(v: Any) -> tuple[float, ...] | None:
    return None if v is None else (float(v),)


def _along_channel(path: str | Path, kw: Any, name: str) -> None:
    axis = getattr(kw, "axis", None)
    if axis is not None and str(axis) != "channel":
        raise ValueError(f"bioimage.io package {path}: {name} along axis {axis} is not "
                         "supported; znni applies per-channel parameters only")


def _joint(path: str | Path, kw: Any, name: str) -> bool:
    """Statistics over every channel (True) or per channel; they must span z, y and x."""
    axes = None if kw.axes is None else {str(a) for a in kw.axes}
    if axes is None:
        return True
    if not set(SPATIAL) <= axes:
        raise ValueError(f"bioimage.io package {path}: {name} takes statistics over axes "
                         f"{', '.join(sorted(axes))}; znni computes them over the whole "
                         "volume (z, y and x), per channel or over all channels")
    return "channel" in axes


def onnx_weights(path: str | Path, descr: Any) -> Path:
    """The package's ONNX file on disk (a zip's extracted once into the cache);
    ValueError with how to export when the package has no ONNX weights."""
    weights = descr.weights
    if weights.onnx is None:
        given = ", ".join(k for k, v in weights.model_dump().items() if v is not None)
        raise ValueError(f"bioimage.io package {path} has {given} weights only; znni runs "
                         f"ONNX weights: {EXPORT_HINT}")
    entry = weights.onnx
    names = [str(entry.source)]
    if getattr(entry, "external_data", None) is not None:
        names.append(str(entry.external_data.source))
    p = Path(path)
    if p.suffix.lower() != ".zip":
        return ((p if p.is_dir() else p.parent) / names[0]).resolve()
    digest = hashlib.sha256(p.read_bytes()).hexdigest()[:24]
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    folder = Path(base) / "znni" / "packages" / digest
    if not all((folder / n).is_file() for n in names):
        folder.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(p) as z:
            for n in names:
                tmp = folder / f".{n}.{os.getpid()}"
                tmp.write_bytes(z.read(n))
                tmp.replace(folder / n)  # atomic: concurrent loads see whole files
    return folder / names[0]


def check_halo(model: OnnxModel, window: Triple, overlap: float, region: Triple) -> None:
    """ValueError when neighbouring windows overlap by less than twice the package's
    output halo on an axis (its unreliable border would then be blended in alone)."""
    for a in range(3):
        h, w = model.halo[a], window[a]
        if h == 0 or region[a] <= w:  # one window on this axis: no neighbours
            continue
        shared = w - max(int(w * (1 - overlap)), 1)  # MONAI's stride (compute/windows.py)
        if shared < 2 * h:
            need = 2 * h / w
            raise ValueError(
                f"package {model.name!r} has a halo of {h} voxels on axis {SPATIAL[a]}, but "
                f"windows of {w} with --overlap {overlap} share only {shared}; use "
                f"--overlap {need:.3g} or more, or a larger --window")


def halo_min_window(model: OnnxModel, overlap: float, region: Triple) -> OnnxModel:
    """The model with its smallest window raised, per axis with a halo, to the first window
    on its grid that overlaps its neighbours by twice the halo (or covers the region), so
    the planner's window choice honours the halo."""
    if not any(model.halo) or model.fixed_window is not None:
        return model
    from dataclasses import replace as with_fields

    low = list(model.min_window)
    for a in range(3):
        h, f = model.halo[a], model.size_factor[a]
        w = low[a]
        while h and w < region[a] and w - max(int(w * (1 - overlap)), 1) < 2 * h:
            w += f
        low[a] = w
    return with_fields(model, min_window=(low[0], low[1], low[2]))
