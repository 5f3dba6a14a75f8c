"""A oneDNN-class direct convolution: one conv layer compiled with OpenVINO (optional).

OpenVINO's CPU plugin runs convolutions on blocked layouts with JIT kernels, 1.2-2.3x
faster than our GEMM direct conv on U-Net layers (3^3, 16-128 channels, measured on the
CI kind at float32). It is one more per-layer primitive ("openvino") the graph planner
may choose, never the whole network: each call is a single Conv (+ bias, + fused
activation) compiled for the input's shape, so the planner, the memory model and MPF
keep control. float32 is forced: the CPU plugin's default may compute in bf16
(relative errors ~2e-3). Compiled layers are cached, keyed by everything that shapes
them (input shapes, pads, weight, bias and norm bytes, activation), bounded by count.

A layer may also take the zero pads and a concat's parts as its inputs (no padded or
joined copy is built), and the InstanceNormalization after the conv (+ its activation):
OpenVINO's MVN runs on the conv's blocked output before it is reordered back, 1.2-1.6 ms
for 16 x 64^3 against 5 ms for our two passes over it. Inputs and output are shared
with numpy, not copied (a 16 -> 16 64^3 conv: 32.0 -> 27.8 ms). The layer's output is
channels-last, the plugin's own layout for these convs, and we transpose it to (S, C, Z,
Y, X) plane by plane over the backend's pool: the plugin's own reorder to that layout is
its reference (non-JIT) one, 9.0-9.6 ms for 16 x 64^3, ours 2.3 ms (see `_channels_first`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import threading
import weakref
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

from znni.primitives.base import Activation, ConvStep, InstanceNorm
from znni.primitives.cpu.layout import channels_innermost, is_channels_last

MAX_COMPILED = 48  # compiled layers kept (one per conv and window shape in a run)


@lru_cache(maxsize=1)
def openvino_available() -> bool:
    """True when the optional `openvino` package is installed: found, not imported, since
    its import took 0.1-0.2 s of every planned run (BasicUNet 128^3 segment, 4.5 s in
    all) though the planner seldom picks it; the first layer compiled imports it."""
    return importlib.util.find_spec("openvino") is not None


def _activation(ops: Any, y: Any, act: Activation | None) -> Any:
    if act is None or act.kind == "linear":
        return y
    if act.kind == "relu":
        return ops.relu(y)
    if act.kind == "sigmoid":
        return ops.sigmoid(y)
    if act.kind == "tanh":
        return ops.tanh(y)
    if act.kind == "elu":
        return ops.elu(y, 1.0)
    slope = ops.constant(np.array([act.slope], np.float32))
    return ops.prelu(y, slope)  # leaky_relu


_Compiled = tuple[Any, tuple[int, ...], threading.Lock]  # (infer request, output shape, lock)


class _Layer(NamedTuple):
    """What shapes one compiled layer (for one window: a batch runs window by window): its
    inputs, and its convs one after another (a chain: model.openvino_layers.openvino_chains)."""

    shapes: tuple[tuple[int, ...], ...]  # (Cin_k, Z, Y, X) of each input part
    layouts: tuple[bool, ...]  # per part: True where it is channels-last in memory
    steps: tuple[ConvStep, ...]

    def key(self) -> tuple[Hashable, ...]:
        """The compiled-layer cache key: shapes, pads and a digest of the values."""
        digest = hashlib.sha1()
        for step in self.steps:
            digest.update(_array_digest(step.weight))
            digest.update(np.ascontiguousarray(step.bias).tobytes())
            if step.norm is not None:
                step.norm.digest(digest)
        shaped = tuple((st.pads, st.weight.shape, st.act, st.norm is not None)
                       for st in self.steps)
        return (self.shapes, self.layouts, shaped, digest.hexdigest())


# a layer's weights digested once: sha1 over 128 -> 128 3^3 weights (1.8 MB) took 1.8 ms,
# every call; a window's weights are the graph's own arrays, the same objects each call,
# never written (model.graph). Keyed by identity, checked by a weak reference; bounded.
_DIGESTS: OrderedDict[int, tuple[weakref.ref[np.ndarray], bytes]] = OrderedDict()
_DIGESTS_LOCK = threading.Lock()
MAX_DIGESTS = 256
SMALL_DIGEST_BYTES = 64 * 2**10  # smaller arrays are digested each call


def _array_digest(a: np.ndarray) -> bytes:
    """sha1 of the array's bytes, remembered for the array object when it is large."""
    if a.nbytes < SMALL_DIGEST_BYTES:
        return hashlib.sha1(np.ascontiguousarray(a).tobytes()).digest()
    with _DIGESTS_LOCK:
        hit = _DIGESTS.get(id(a))
        if hit is not None and hit[0]() is a:
            _DIGESTS.move_to_end(id(a))
            return hit[1]
    digest = hashlib.sha1(np.ascontiguousarray(a).tobytes()).digest()
    with _DIGESTS_LOCK:
        _DIGESTS[id(a)] = (weakref.ref(a), digest)
        while len(_DIGESTS) > MAX_DIGESTS:
            _DIGESTS.popitem(last=False)
    return digest


class OpenVinoConvs:
    """Compiled single-conv OpenVINO models, run on the caller's arrays."""

    def __init__(self, threads: int, pool: ThreadPoolExecutor | None = None) -> None:
        self.threads = threads
        self._pool = pool  # transposes the output back to channels-first; None: this thread
        self._compiled: OrderedDict[tuple[Hashable, ...], _Compiled] = OrderedDict()
        self._lock = threading.Lock()
        self._ov: Any = None  # the openvino module, once a layer is compiled
        self._core: Any = None

    def conv3d(
        self,
        x: np.ndarray | Sequence[np.ndarray],
        weight: np.ndarray,
        bias: np.ndarray,
        act: Activation | None,
        pads: Sequence[int] = (0,) * 6,
        norm: InstanceNorm | None = None,
        channels_last: bool = False,
    ) -> np.ndarray:
        """(S, Cin, Z, Y, X) valid cross-correlation + bias (+ norm) (+ activation), float32.

        `x` may be the channel parts of a concat (S, Cin_i, Z, Y, X), read as one input,
        and `pads` (z, y, x before, then after) zeros around it; neither is built here. A
        part may be channels-last in memory (as this returns them with `channels_last`,
        for a reader that is itself a layer here: model.openvino_layers.channels_last_convs); the
        layer then reads it as it lies."""
        step = ConvStep(tuple(int(v) for v in pads), weight, bias, act, norm)
        return self.conv3d_chain(x, [step], channels_last)

    def conv3d_chain(
        self,
        x: np.ndarray | Sequence[np.ndarray],
        steps: Sequence[ConvStep],
        channels_last: bool = False,
    ) -> np.ndarray:
        """`steps` one after another in one compiled layer, each as conv3d runs one; the
        tensors between them stay inside it (model.openvino_layers.openvino_chains)."""
        parts = [_layer_input(p) for p in ([x] if isinstance(x, np.ndarray) else x)]
        layouts = tuple(is_channels_last(p) for p in parts)
        shapes = tuple(p.shape[1:] for p in parts)  # (Cin_k, Z, Y, X): any batch, window by window
        steps = tuple(ConvStep(tuple(int(v) for v in st.pads), *st[1:]) for st in steps)
        _check_chain(sum(shape[0] for shape in shapes), steps)
        request, out_shape, lock = self._request(_Layer(shapes, layouts, steps))
        feeds = [p.transpose(0, 2, 3, 4, 1) if last_ else p  # (S, Z, Y, X, C) where channels-last
                 for p, last_ in zip(parts, layouts, strict=True)]
        last = np.empty((parts[0].shape[0], *out_shape), np.float32)  # (S, Z', Y', X', Cout)
        with lock:  # one inference at a time per compiled layer
            for s in range(len(last)):  # one window a call: the layer's shapes are static
                for k, feed in enumerate(feeds):
                    request.set_input_tensor(k, self._ov.Tensor(feed[s:s + 1], shared_memory=True))
                request.set_output_tensor(self._ov.Tensor(last[s:s + 1], shared_memory=True))
                request.infer()
        if channels_last:
            return last.transpose(0, 4, 1, 2, 3)  # (S, Cout, Z', Y', X'), channels-last memory
        return _channels_first(last, self._pool)

    def _request(self, layer: _Layer) -> _Compiled:
        key = layer.key()
        with self._lock:
            hit = self._compiled.get(key)
            if hit is not None:
                self._compiled.move_to_end(key)
                return hit
        compiled = self._compile(layer)
        out_shape = tuple(d.get_length() for d in compiled.output(0).get_partial_shape()[1:])
        entry = (compiled.create_infer_request(), out_shape, threading.Lock())
        with self._lock:
            self._compiled[key] = entry
            while len(self._compiled) > MAX_COMPILED:
                self._compiled.popitem(last=False)
        return entry

    def _compile(self, layer: _Layer) -> Any:
        ov, ops = self._import()
        shapes, layouts, steps = layer
        # one window: with a dynamic batch the plugin reorders its output to channels-first
        # with its reference reorder, transpose or not (9-10 ms for 16 x 64^3)
        inputs = [ops.parameter(ov.PartialShape([1, *shape[1:], shape[0]] if last_ else
                                                [1, *shape]), ov.Type.f32, name=f"x{k}")
                  for k, (shape, last_) in enumerate(zip(shapes, layouts, strict=True))]
        to_first = ops.constant(np.array([0, 4, 1, 2, 3]))
        if len(inputs) > 1 and all(layouts):  # joined as they lie, then seen channels-first:
            # transposing each part before the concat ran the plugin's reference transpose
            # on each (4-9 ms a part at 24 x 64^3) and then a reorder
            y = ops.transpose(ops.concat(inputs, 4), to_first)
        else:  # (1, Cin_k, Z, Y, X), channels-last parts transposed: no reorder runs for those
            xs = [ops.transpose(v, to_first) if last_ else v
                  for v, last_ in zip(inputs, layouts, strict=True)]
            y = xs[0] if len(xs) == 1 else ops.concat(xs, 1)
        for step in steps:
            y = _conv_step(ops, y, step)
        # (S, Z', Y', X', Cout): what its convs write, so no reorder runs inside (above)
        y = ops.transpose(y, ops.constant(np.array([0, 2, 3, 4, 1])))
        # unpinned: its threads share the cores with the pipeline's readers and writers (a
        # 256^3 segment with 13 OpenVINO layers: 0.90-1.10, median 1.02 of no OpenVINO
        # unpinned, 0.88-1.21, median 1.06 pinned; 5 alternated runs each, 2026-11-24)
        config = {"INFERENCE_NUM_THREADS": self.threads, "INFERENCE_PRECISION_HINT": "f32",
                  "ENABLE_CPU_PINNING": False}
        if self._core is None:  # one for every layer: a new Core cost 3 of a compile's 28 ms
            self._core = ov.Core()
        return self._core.compile_model(ov.Model([y], inputs), "CPU", config)

    def _import(self) -> tuple[Any, Any]:
        try:
            import openvino as ov
            from openvino import opset13 as ops
        except ImportError as e:  # installed (openvino_available) but broken
            raise ValueError(f"conv primitive 'openvino': the openvino package is installed "
                             f"but does not import ({e})") from e
        self._ov = ov
        return ov, ops


def _conv_step(ops: Any, y: Any, step: ConvStep) -> Any:
    """The step's conv + bias (+ norm) (+ activation) on (1, C, Z, Y, X) node `y`."""
    w = ops.constant(np.ascontiguousarray(step.weight, np.float32))
    pads = step.pads
    y = ops.convolution(y, w, [1, 1, 1], list(pads[:3]), list(pads[3:]), [1, 1, 1])
    y = ops.add(y, ops.constant(np.asarray(step.bias, np.float32).reshape(1, -1, 1, 1, 1)))
    norm = step.norm
    if norm is not None:
        y = ops.mvn(y, ops.constant(np.array([2, 3, 4])), True, float(norm.epsilon),
                    "inside_sqrt")
        if norm.scale is not None:
            y = ops.multiply(y, ops.constant(_per_channel(norm.scale)))
        if norm.bias is not None:
            y = ops.add(y, ops.constant(_per_channel(norm.bias)))
    return _activation(ops, y, step.act)


def _check_chain(channels: int, steps: Sequence[ConvStep]) -> None:
    """Each step's weight reads what the one before it writes (the input's channels first)."""
    if not steps:
        raise ValueError("an OpenVINO layer needs one conv step or more, got none")
    for k, step in enumerate(steps):
        if step.weight.ndim != 5 or step.weight.shape[1] != channels:
            raise ValueError(f"conv step {k} has weight shape {step.weight.shape} but reads "
                             f"{channels} channels")
        if len(step.pads) != 6 or min(step.pads) < 0:
            raise ValueError(f"conv step {k} needs six pads >= 0, got {step.pads}")
        channels = step.weight.shape[0]


def _layer_input(a: np.ndarray) -> np.ndarray:
    """`a` as float32 in a layout a layer reads as it lies: channels-first or channels-last.
    A view with the channels innermost (a crop of a channels-last tensor: a U-Net's skip)
    is copied channels-last, runs of whole voxels, not transposed."""
    if a.dtype == np.float32 and (a.flags.c_contiguous or is_channels_last(a)):
        return a
    if channels_innermost(a):
        last = np.ascontiguousarray(a.transpose(0, 2, 3, 4, 1), np.float32)  # (S, Z, Y, X, C)
        return last.transpose(0, 4, 1, 2, 3)
    return np.ascontiguousarray(a, np.float32)


# below this many bytes one thread transposes: handing planes to the pool cost more than
# it saved at 32 x 32^3 (1.3 ms alone, 1.8 ms over two; 16 x 64^3: 3.9 ms alone, 2.3 ms over
# two; 2-core CI kind, 2026-11-24)
PARALLEL_TRANSPOSE_BYTES = 8 * 2**20


def _channels_first(last: np.ndarray, pool: ThreadPoolExecutor | None) -> np.ndarray:
    """(S, Z, Y, X, C) -> a new (S, C, Z, Y, X) array, one (Y, X, C) plane at a time: numpy's
    transposing copy of a whole tensor strides through memory at 3 GB/s, plane by plane
    at 7-9 GB/s (the plane stays in cache)."""
    s, z = last.shape[:2]
    out = np.empty((s, last.shape[4], *last.shape[1:4]), np.float32)  # (S, C, Z, Y, X)

    def planes(lo: int, hi: int) -> None:
        for k in range(lo, hi):
            np.copyto(out[k // z, :, k % z], last[k // z, k % z].transpose(2, 0, 1))

    n = s * z
    workers = 1 if pool is None or last.nbytes < PARALLEL_TRANSPOSE_BYTES else pool._max_workers
    if pool is None or workers == 1:
        planes(0, n)
        return out
    cuts = [n * w // workers for w in range(workers + 1)]
    for done in [pool.submit(planes, lo, hi) for lo, hi in zip(cuts, cuts[1:], strict=False)]:
        done.result()
    return out


def _per_channel(v: np.ndarray) -> np.ndarray:
    return np.asarray(v, np.float32).reshape(1, -1, 1, 1, 1)  # (1, C, 1, 1, 1)
