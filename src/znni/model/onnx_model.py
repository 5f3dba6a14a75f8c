"""An ONNX model file as znni runs it: channels, window constraints, and its graph per window.

The value is small and picklable (Dask workers get it once); each process resolves
and caches the `Graph` for the window it runs. A window must be a multiple of the
model's total downsampling factor (`size_factor`), at least `min_window`, and the
model must give an output of the window's own spatial size (windowed dense output
blends whole windows, as MONAI's sliding_window_inference does).
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from znni.model.carried import Files, read_files, write_files
from znni.model.graph import Graph, aligned_axes, downsampling, window_dependence
from znni.model.onnx_import import load_onnx
from znni.triple import Triple, as_triple

GRAPH_CACHE_ENTRIES = 8  # resolved graphs kept per model (window choice probes several)
PROBE_WINDOW: Triple = (96, 96, 96)  # dynamic models are probed at this size (2^5 * 3)


@dataclass(frozen=True, eq=False)
class OnnxModel:
    """A validated ONNX model and the input transform x * scale + shift before it."""

    path: str
    name: str
    digest: str  # sha256 of the file and the run options that change the output
    in_channels: int
    out_channels: int
    output_name: str | None
    input_scale: float
    input_shift: float
    fixed_window: Triple | None  # the export's static spatial shape, if it has one
    size_factor: Triple  # windows step by this per axis (the total downsampling)
    min_window: Triple  # the smallest window; every window is min_window + k * size_factor
    mode: str = "windowed"  # "windowed" (blended windows) or "exact" (window-independent)
    context: Triple = (0, 0, 0)  # exact: input voxels a window has beyond its output
    # bioimage.io packages (model/bioimage_package.py): processing ops (model/processing.py)
    # on each block's input after the scale/shift, and on the blended output; their channel
    # names, output halo and listing (name, description, citations)
    preprocessing: tuple[Any, ...] = ()
    postprocessing: tuple[Any, ...] = ()
    channel_names: tuple[str, ...] = ()
    halo: Triple = (0, 0, 0)
    package: dict[str, Any] | None = None
    # the model's files as bytes (`carried`: for Dask workers that cannot see `path`)
    files: Files = field(default=(), repr=False, compare=False)
    _graphs: dict[Triple, Graph] = field(default_factory=dict, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_graphs"], state["_lock"] = {}, None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state["_lock"] = threading.Lock()
        if state.get("files"):  # carried: this host's copy of the files (model/carried.py)
            state["path"] = write_files(state["files"])
        self.__dict__.update(state)

    def carried(self) -> OnnxModel:
        """This model with its files inside: wherever it is unpickled, `path` names a copy
        of them on that host (model/carried.py), so workers need not see this one's."""
        if self.files:
            return self
        return replace(self, files=read_files(self.path), _graphs={}, _lock=threading.Lock())

    def check_window(self, window: Triple) -> None:
        """ValueError naming the rule when `window` cannot be run."""
        if self.fixed_window is not None and tuple(window) != self.fixed_window:
            raise ValueError(
                f"model {self.name!r} was exported for windows of exactly "
                f"{self.fixed_window} voxels; --window {tuple(window)} differs"
            )
        steps = zip(window, self.min_window, self.size_factor, strict=True)
        if any(w < m or (w - m) % f for w, m, f in steps):
            raise ValueError(
                f"window {tuple(window)} is not on the grid of model {self.name!r}: each axis "
                f"must be {self.min_window} plus a multiple of {self.size_factor}"
            )

    def network_input(self, raw: np.ndarray) -> np.ndarray:
        """(C, Z, Y, X) voxels as the network takes them: float32, times the input scale plus
        the shift, then a bioimage.io package's preprocessing (its statistics resolved).
        What every worker feeds its windows or tiles, and int8's calibration windows."""
        from znni.model.processing import apply_chain

        x = raw.astype(np.float32)  # a new array: scaled in place below
        if self.input_scale != 1.0:
            x *= np.float32(self.input_scale)
        if self.input_shift != 0.0:
            x += np.float32(self.input_shift)
        if self.preprocessing:
            x = apply_chain(self.preprocessing, x)
        return x

    def graph(self, window: Triple) -> Graph:
        """The model's graph for `window` (cached per process)."""
        window = (int(window[0]), int(window[1]), int(window[2]))
        with self._lock:
            hit = self._graphs.get(window)
        if hit is not None:
            return hit
        self.check_window(window)
        graph = load_onnx(self.path, window, self.output_name)
        if self.mode == "windowed":
            _check_same_size(graph, Path(self.path))
        with self._lock:
            self._graphs[window] = graph
            while len(self._graphs) > GRAPH_CACHE_ENTRIES:  # oldest first (dict order)
                self._graphs.pop(next(iter(self._graphs)))
        return graph


def load_onnx_model(
    path: str | Path, output_name: str | None = None, scale: float = 1.0, shift: float = 0.0
) -> OnnxModel:
    """Read and check `path`, probing its window constraints; ValueError for anything refused."""
    path = Path(path)
    probe = load_onnx(path, _probe_window(path), output_name)
    fixed = _fixed_window(path)
    if window_dependence(probe) is None and probe.out_window != probe.window:
        return _exact_model(path, probe, fixed, output_name, scale, shift)
    if fixed is not None:
        factor, minimum = (1, 1, 1), fixed
        _check_same_size(probe, path)
    else:
        factor = downsampling(probe)
        minimum = _min_window(path, factor, output_name)
    return _model(path, probe, output_name, scale, shift, fixed, factor, minimum)


def _model(
    path: Path, probe: Graph, output_name: str | None, scale: float, shift: float,
    fixed: Triple | None, factor: Triple, minimum: Triple, mode: str = "windowed",
    context: Triple = (0, 0, 0),
) -> OnnxModel:
    return OnnxModel(
        path=str(path), name=path.stem, digest=_digest(probe, output_name, scale, shift),
        in_channels=probe.in_channels, out_channels=probe.out_channels,
        output_name=output_name, input_scale=float(scale), input_shift=float(shift),
        fixed_window=fixed, size_factor=factor, min_window=minimum, mode=mode, context=context,
    )


def _fixed_window(path: Path) -> Triple | None:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    init = {t.name for t in model.graph.initializer}
    (inp,) = [i for i in model.graph.input if i.name not in init]
    dims = inp.type.tensor_type.shape.dim[2:]
    if all(d.HasField("dim_value") for d in dims):
        return (dims[0].dim_value, dims[1].dim_value, dims[2].dim_value)
    return None


def _probe_window(path: Path) -> Triple | None:
    """None (the export's own shape) for fixed models, else PROBE_WINDOW."""
    from znni.model.onnx_import import _read_model

    model, _ = _read_model(path)
    init = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in init]
    if len(inputs) == 1 and len(inputs[0].type.tensor_type.shape.dim) == 5:
        dims = inputs[0].type.tensor_type.shape.dim[2:]
        if all(d.HasField("dim_value") for d in dims):
            return None
    return PROBE_WINDOW


def _min_window(path: Path, factor: Triple, output_name: str | None) -> Triple:
    """The smallest multiple of the factor (same on all axes) the model runs and keeps."""
    for k in range(1, 65):
        window = (factor[0] * k, factor[1] * k, factor[2] * k)
        try:
            graph = load_onnx(path, window, output_name)
        except ValueError:
            continue
        _check_same_size(graph, path)
        return window
    raise ValueError(f"ONNX model {path} runs on no window up to 64 x {factor}")


def _check_same_size(graph: Graph, path: Path) -> None:
    if graph.out_window != graph.window:
        raise ValueError(
            f"ONNX model {path} maps a {graph.window} window to a {graph.out_window} output; "
            "znni's windowed output needs models whose output has the window's own size "
            "(padded convolutions)"
        )


def _digest(graph: Graph, output_name: str | None, scale: float, shift: float) -> str:
    return hashlib.sha256(
        f"{graph.digest}|{output_name}|{float(scale)!r}|{float(shift)!r}".encode()
    ).hexdigest()


def _exact_model(
    path: Path,
    probe: Graph,
    fixed: Triple | None,
    output_name: str | None,
    scale: float,
    shift: float,
) -> OnnxModel:
    """A window-independent model: its aligned input sizes, context and smallest window."""
    factor = downsampling(probe)
    if fixed is not None:
        if not all(aligned_axes(probe)):
            raise ValueError(
                f"ONNX model {path} was exported for a {fixed} input that is not "
                f"on its {factor} downsampling grid"
            )
        found, outs = fixed, probe.out_window
    else:
        found, outs = _aligned_size(path, probe, factor, output_name)
    context = as_triple(n - m for n, m in zip(found, outs, strict=True))
    minimum = fixed or _smallest_window(path, found, context, factor, output_name)
    return _model(path, probe, output_name, scale, shift, fixed, factor, minimum, "exact",
                  context)


def _aligned_size(
    path: Path, probe: Graph, factor: Triple, output_name: str | None
) -> tuple[Triple, Triple]:
    """Per axis, an input size whose strided ops all fit exactly, and its output size."""
    found: list[int | None] = [None, None, None]
    outs = [0, 0, 0]
    for d in range(max(factor)):
        window = as_triple(b + d for b in probe.window)
        try:
            graph = probe if d == 0 else load_onnx(path, window, output_name)
        except ValueError:
            continue
        for a, ok in enumerate(aligned_axes(graph)):
            if ok and found[a] is None:
                found[a], outs[a] = window[a], graph.out_window[a]
        done = [f for f in found if f is not None]
        if len(done) == 3:
            return as_triple(done), as_triple(outs)
    raise ValueError(
        f"ONNX model {path}: no input size near {probe.window} fits its "
        f"{factor} downsampling exactly"
    )


def _smallest_window(
    path: Path, found: Triple, context: Triple, factor: Triple, output_name: str | None
) -> Triple:
    """The smallest aligned input that the model runs (output at least one voxel)."""
    first = [c + (n - c - 1) % f + 1 for n, c, f in zip(found, context, factor, strict=True)]
    for k in range(64):
        window = (first[0] + k * factor[0], first[1] + k * factor[1], first[2] + k * factor[2])
        try:
            graph = load_onnx(path, window, output_name)
        except ValueError:
            continue
        if all(aligned_axes(graph)):
            return window
    raise ValueError(f"ONNX model {path} runs on no aligned window from {tuple(first)}")
