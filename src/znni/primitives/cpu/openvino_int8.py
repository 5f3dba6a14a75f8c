"""int8 networks: a window's network quantized by NNCF's post-training quantization and
kept on disk, so resumes and reruns of a job do not quantize again (docs/design.md,
"int8 and auto").

`quantized_network` reads the ONNX file with OpenVINO, fixes its input to the window's
shape (1, C, Z, Y, X), calibrates NNCF on the given windows (float32, as the network's
input after znni's preprocessing) and saves the quantized model as OpenVINO IR (fp32
weights beside the FakeQuantize nodes: `compress_to_fp16=False`) under
`$XDG_CACHE_HOME/znni/int8/<digest>/`. The digest covers everything that shapes the
result: the model's digest, the calibration windows' bytes, the input shape, the output,
the nodes kept in float, the preset, the error NNCF's accuracy control was asked to keep
(`max_drop`; None: plain post-training quantization) and NNCF's and OpenVINO's versions.
With `max_drop`, NNCF's `quantize_with_accuracy_control` quantizes and then puts back in
float the layers that matter most, one at a time, until the largest error on the
calibration windows against their fp32 outputs (over the fp32 outputs' range) is within
it; the layers it kept in float are read off the result and stored with it. An entry is made
in a private folder and renamed into place whole (a rename is atomic), so processes
quantizing the same network at once never see half an entry; the loser of the race keeps
the winner's. The cache is bounded in bytes (CACHE_LIMIT_BYTES): the least recently used
entries go first. `OpenVinoNetwork` (openvino_network.py) compiles the `.xml` at precision
"int8".
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np

from znni.primitives.cpu.fftw_plans import cache_dir

log = logging.getLogger("znni.primitives")
# Quantized models kept on disk. A 64^3 BasicUNet (features 32..512) is ~27 MiB of fp32
# IR; 512 MiB keeps a dozen networks and windows, the most a user runs between cleanups.
CACHE_LIMIT_BYTES = 512 * 2**20
# NNCF's presets: "performance" quantizes activations symmetrically, "mixed" asymmetrically
# (a zero point: U-Nets' LeakyReLU and normalised activations are not centred on 0).
# Measured on benchmarks/networks/trained_unet.onnx (BasicUNet 8..32 features, instance
# norm, LeakyReLU, sigmoid; validation F1 0.964), 64^3 windows, 16 calibration and 4
# held-out windows of two synthetic EM volumes: performance's largest error 20-25% of the
# fp32 range (mean 0.37-0.40%, labels at 0.5 changed 0.12%), mixed's 6-8% (mean 0.18%,
# labels 0.05%), mixed with the first and last conv in float 4.7-6.8%; a 64^3 window took
# 0.100 s (performance) and 0.124 s (mixed) against fp32's 0.167 s (AVX2, 2 threads,
# 2026-11-28). So the faster one is tried first and the more exact one where its error is
# above --max-error (engine/compute/precision_error.py).
PRESETS = ("performance", "mixed")
NNCF_MISSING = ("--precision int8 needs NNCF (post-training quantization), which is not "
                "installed here: pip install nncf")
CONV_TYPES = ("Convolution", "GroupConvolution", "ConvolutionBackpropData",
              "GroupConvolutionBackpropData")


@dataclass(frozen=True)
class QuantizedNetwork:
    """A quantized network on disk: its IR, its cache digest, and whether this call found
    it there (True) or quantized it (False, taking `seconds`)."""

    xml: str
    digest: str
    cached: bool
    seconds: float
    keep_float: tuple[str, ...] = ()  # OpenVINO node names left in float
    preset: str = PRESETS[0]  # NNCF's preset (PRESETS)

    @property
    def folder(self) -> Path:
        return Path(self.xml).parent


def nncf_available() -> bool:
    """Whether NNCF can be imported (found; not imported here: it takes ~1.3 s)."""
    try:
        return find_spec("nncf") is not None
    except (ImportError, ValueError):  # a broken or blocked installation
        return False


def _import_nncf() -> Any:
    """NNCF itself, quiet (its log lines and progress bars go nowhere), or ValueError of
    one sentence naming the install when it is missing."""
    try:
        import nncf
    except ImportError:
        raise ValueError(NNCF_MISSING) from None
    from nncf.common.logging.logger import set_log_level

    set_log_level(logging.ERROR)
    return nncf


def int8_cache_dir() -> Path:
    """$XDG_CACHE_HOME/znni/int8: the quantized networks."""
    return cache_dir() / "int8"


def conv_names(onnx_path: str, input_shape: Sequence[int]) -> tuple[str, ...]:
    """The OpenVINO names of the network's conv nodes in execution order (the first and
    last are the usual sensitive layers an int8 retry keeps in float)."""
    model = _read(onnx_path, input_shape)
    return tuple(op.get_friendly_name() for op in model.get_ordered_ops()
                 if op.get_type_name() in CONV_TYPES)


def _read(onnx_path: str, input_shape: Sequence[int]) -> Any:
    import openvino as ov

    model = ov.Core().read_model(onnx_path)
    if len(model.inputs) != 1:
        raise ValueError(f"{onnx_path}: a network with {len(model.inputs)} inputs")
    model.reshape({model.inputs[0]: ov.PartialShape([int(n) for n in input_shape])})
    return model


def cache_digest(model_digest: str, windows: np.ndarray, output: str,
                 keep_float: Sequence[str] = (), preset: str = PRESETS[0],
                 max_drop: float | None = None) -> str:
    """The cache key of a quantization: sha256 over the model's digest, the calibration
    windows (dtype, shape and bytes; the shape is the input's), the output, the nodes kept
    in float, the preset, the accuracy control's error and NNCF's and OpenVINO's versions."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "missing"

    h = hashlib.sha256()
    control = () if max_drop is None else (f"accuracy control {max_drop!r}",)
    for part in (model_digest, output, "|".join(sorted(keep_float)), preset, *control,
                 installed("nncf"), installed("openvino"), str(windows.dtype),
                 str(tuple(windows.shape))):
        h.update(part.encode())
        h.update(b"\0")
    h.update(np.ascontiguousarray(windows).tobytes())
    return h.hexdigest()[:32]


def quantized_network(onnx_path: str, model_digest: str, windows: np.ndarray, output: str,
                      keep_float: Sequence[str] = (), preset: str = PRESETS[0], *,
                      max_drop: float | None = None,
                      cache: Path | None = None) -> QuantizedNetwork:
    """The network at `onnx_path` quantized on `windows` (N, C, Z, Y, X) float32, each a
    calibration input of shape (1, C, Z, Y, X), from the cache or made now (module
    docstring); `keep_float`: node names NNCF leaves in float (its ignored scope);
    `preset`: one of PRESETS; `max_drop`: NNCF's accuracy control keeps the largest error
    on the windows within it (a fraction of the fp32 outputs' range)."""
    if preset not in PRESETS:
        raise ValueError(f"NNCF preset {preset!r} is not one of {', '.join(PRESETS)}")
    if windows.ndim != 5 or windows.shape[0] < 1 or windows.dtype != np.float32:
        raise ValueError(f"calibration windows must be float32 (N, C, Z, Y, X) with N >= 1, "
                         f"got {windows.dtype} {tuple(windows.shape)}")
    folder = cache or int8_cache_dir()
    if max_drop is not None and not 0 < max_drop < 1:
        raise ValueError(f"the accuracy control's largest error must be in (0, 1), got "
                         f"{max_drop}")
    digest = cache_digest(model_digest, windows, output, keep_float, preset, max_drop)
    entry = folder / digest
    if (entry / "model.xml").is_file():
        _touch(entry)
        return QuantizedNetwork(str(entry / "model.xml"), digest, True, 0.0,
                                _kept_on_disk(entry, keep_float), preset)
    nncf = _import_nncf()  # ValueError naming the install, before anything is made
    t0 = time.perf_counter()
    shape = (1, *windows.shape[1:])
    model = _read(onnx_path, shape)
    if not any(output in o.get_names() for o in model.outputs):
        raise ValueError(f"{onnx_path}: no output {output!r} for OpenVINO")
    if max_drop is None:
        quantized = _quantize(nncf, model, windows, keep_float, preset)
    else:
        quantized = _quantize_controlled(nncf, model, windows, output, max_drop, preset)
        keep_float = float_convs(quantized)
    _install(quantized, folder, digest, {"onnx": str(onnx_path), "model_digest": model_digest,
                                         "input_shape": list(shape), "output": output,
                                         "windows": int(windows.shape[0]),
                                         "keep_float": list(keep_float), "preset": preset,
                                         "max_drop": max_drop})
    seconds = time.perf_counter() - t0
    log.debug("quantized %s to int8 on %d windows in %.1f s", onnx_path, len(windows), seconds)
    evict(folder, CACHE_LIMIT_BYTES, keep=digest)
    return QuantizedNetwork(str(entry / "model.xml"), digest, False, seconds, tuple(keep_float),
                            preset)


def _quantize(nncf: Any, model: Any, windows: np.ndarray, keep_float: Sequence[str],
              preset_name: str) -> Any:
    """NNCF's post-training quantization of `model` on every window, its console quiet."""
    items = [windows[i:i + 1] for i in range(windows.shape[0])]  # (1, C, Z, Y, X) each
    scope = nncf.IgnoredScope(names=list(keep_float)) if keep_float else None
    preset = getattr(nncf.QuantizationPreset, preset_name.upper())
    with contextlib.redirect_stdout(io.StringIO()):  # NNCF's progress bars
        return nncf.quantize(model, nncf.Dataset(items), subset_size=len(items),
                             preset=preset, ignored_scope=scope)


def _quantize_controlled(nncf: Any, model: Any, windows: np.ndarray, output: str,
                         max_drop: float, preset_name: str) -> Any:
    """NNCF's quantization with accuracy control on `windows`, validated on the same
    windows: its metric is 1 - the largest |int8 - fp32| over the fp32 outputs' range (NNCF
    wants higher-is-better and divides by the fp32 model's metric), per window too, so it
    ranks layers by what they do to the worst voxel."""
    import openvino as ov

    items = [windows[i:i + 1] for i in range(windows.shape[0])]  # (1, C, Z, Y, X) each
    f32 = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    refs = {id(x): np.asarray(f32(x)[output]) for x in items}
    span = max(float(r.max()) for r in refs.values()) - min(float(r.min())
                                                             for r in refs.values())
    scale = span if span > 0 else 1.0

    def validate(compiled: Any, data: Any) -> tuple[float, list[float]]:
        values = [1.0 - float(np.abs(np.asarray(compiled(x)[output]) - refs[id(x)]).max())
                  / scale for x in data]
        return min(values), values

    preset = getattr(nncf.QuantizationPreset, preset_name.upper())
    restorer = nncf.AdvancedAccuracyRestorerParameters(ranking_subset_size=min(4, len(items)))
    with contextlib.redirect_stdout(io.StringIO()):  # NNCF's progress bars
        return nncf.quantize_with_accuracy_control(
            model, nncf.Dataset(items), nncf.Dataset(items), validate, max_drop=max_drop,
            preset=preset, subset_size=len(items),
            advanced_accuracy_restorer_parameters=restorer)


def float_convs(quantized: Any) -> tuple[str, ...]:
    """The conv nodes of a quantized OpenVINO model whose weights stayed in float (a plain
    Constant; NNCF's int8 weights come through Convert and Multiply)."""
    return tuple(op.get_friendly_name() for op in quantized.get_ordered_ops()
                 if op.get_type_name() in CONV_TYPES
                 and op.input_value(1).get_node().get_type_name() == "Constant")


def _kept_on_disk(entry: Path, asked: Sequence[str]) -> tuple[str, ...]:
    """The nodes an entry kept in float, as its entry.json says (the accuracy control
    chose them), else those asked for."""
    try:
        meta = json.loads((entry / "entry.json").read_text())
    except (OSError, ValueError):
        return tuple(asked)
    kept = meta.get("keep_float") if isinstance(meta, dict) else None
    return tuple(kept) if isinstance(kept, list) else tuple(asked)


def _install(quantized: Any, folder: Path, digest: str, meta: dict[str, Any]) -> None:
    """Save the quantized model as `folder/digest/` atomically: written in a private folder
    beside it, then renamed into place; another process's entry, renamed first, is kept."""
    import openvino as ov

    folder.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{digest}-", dir=folder))
    try:
        ov.save_model(quantized, str(tmp / "model.xml"), compress_to_fp16=False)
        (tmp / "entry.json").write_text(json.dumps(meta, indent=1))
        try:
            os.rename(tmp, folder / digest)
        except OSError:  # another process installed it first: theirs is the same network
            if not (folder / digest / "model.xml").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _touch(entry: Path) -> None:
    """Mark an entry used now (eviction takes the least recently used first)."""
    with contextlib.suppress(OSError):
        os.utime(entry / "entry.json")


def _entry_bytes(entry: Path) -> int:
    return sum(f.stat().st_size for f in entry.iterdir() if f.is_file())


def evict(folder: Path, limit_bytes: int, keep: str = "") -> list[str]:
    """Remove the least recently used entries until the cache holds at most `limit_bytes`
    (`keep`, the entry just made, stays whatever its size); the digests removed."""
    entries = []
    for entry in folder.iterdir() if folder.is_dir() else ():
        if entry.is_dir() and not entry.name.startswith(".") and entry.name != keep:
            with contextlib.suppress(OSError):
                entries.append(((entry / "entry.json").stat().st_mtime, entry,
                                _entry_bytes(entry)))
    total = sum(n for _, _, n in entries) + (_entry_bytes(folder / keep) if keep else 0)
    removed = []
    for _, entry, size in sorted(entries):
        if total <= limit_bytes:
            break
        gone = entry.with_name(f".gone-{entry.name}-{os.getpid()}")
        with contextlib.suppress(OSError):  # renamed away first: never half an entry seen
            os.rename(entry, gone)
            shutil.rmtree(gone, ignore_errors=True)
            total -= size
            removed.append(entry.name)
    return removed


def read_note(network: QuantizedNetwork, name: str) -> dict[str, Any] | None:
    """A JSON note kept beside a quantized network (e.g. its measured error), or None."""
    try:
        value = json.loads((network.folder / f"{name}.json").read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def write_note(network: QuantizedNetwork, name: str, value: dict[str, Any]) -> None:
    """Keep `value` as JSON beside the network (tmp + rename: readers see all or none)."""
    path = network.folder / f"{name}.json"
    tmp = path.with_name(f".{name}-{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(value))
        os.replace(tmp, path)
    except OSError as e:  # a cache we cannot write: measured again next time
        log.warning("could not keep %s beside %s: %s", name, network.xml, e)
