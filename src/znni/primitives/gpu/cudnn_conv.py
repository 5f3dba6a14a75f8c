"""cuDNN convolutions through NVIDIA's cuDNN frontend Python API, on CuPy memory.

CuPy 14 has no cuDNN bindings, so this uses `nvidia-cudnn-frontend` (`import cudnn`,
with the `nvidia-cudnn-cu12`/`-cu13` runtime). Per `ConvSpec` a graph is built once
(conv_fprop, or conv_dgrad for ConvTranspose, then bias and the activation fused as
pointwise nodes), kept in a count-bounded `GraphCache`, and executed with raw device
pointers: the frontend's `pygraph.execute` takes `{tensor: int pointer}` and an int
workspace pointer (python/cudnn/__init__.py `_library_device_pointer`: "either pass in
pointers directly"; https://docs.nvidia.com/deeplearning/cudnn/frontend/latest/ ,
samples/python/02_low_level_api.ipynb), so CuPy's `.data.ptr` is enough; no torch.

The flow around the library call (`LibraryConv.run`: cache, workspace size query,
workspace and output allocated from the device's accounting, cleanup on failure) is
shared with the numpy stand-in (cudnn_standin.py), so CI exercises it.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from znni.primitives.activations import apply_activation
from znni.primitives.base import Activation
from znni.primitives.gpu.conv_spec import (
    DEFAULT_MAX_GRAPHS,
    ConvSpec,
    GraphCache,
    contiguous_strides,
)
from znni.primitives.gpu.device import Device

# the extras pin a frontend that matches the runtime (1.29+ pulls CUDA 13 libraries)
INSTALL_HINT = "pip install 'znni[gpu-cuda13]' ('znni[gpu-cuda12]' for a CUDA 12 driver)"
# Built plans whose workspace exceeds this are deselected (the frontend's
# deselect_workspace_greater_than); a graph with no plan left falls back to gemm-loop.
MAX_WORKSPACE_BYTES = 1 << 30
TENSOR_ALIGN_BYTES = 16  # the frontend's default tensor alignment


class LibraryConv(ABC):
    """A vendor-library convolution on a device: the flow real cuDNN and its stand-in share.

    `run` returns None when the library cannot run the spec (unsupported graph), so
    the caller falls back; `unsupported` counts those specs.
    """

    name = "library"

    def __init__(self, device: Device, max_graphs: int = DEFAULT_MAX_GRAPHS) -> None:
        self.device = device
        self.graphs: GraphCache[Any] = GraphCache(max_graphs)
        self.last_workspace_bytes = 0
        self.fused_epilogue = True  # whether the last run fused bias and activation
        self._lock = threading.Lock()  # the cache and the handle's stream binding

    def run(self, x: Any, params: Mapping[str, Any], spec: ConvSpec) -> Any | None:
        """A new counted output array (N, Cout, ...) in x's dtype, or None if unsupported.

        Where the library has no plan for the conv with its bias and activation fused, the
        bare conv runs and they follow as element-wise device ops (`fused_epilogue` False).
        """
        with self._lock:
            built = self.graphs.get_or_build(spec, self._build)
        self.fused_epilogue = built is not None
        bare = replace(spec, has_bias=False, activation=None)
        if built is None and bare != spec:
            with self._lock:
                built = self.graphs.get_or_build(bare, self._build)
            if built is not None:
                return self._run_bare_then_epilogue(built, x, params, spec, bare)
        if built is None:
            return None
        return self._run_built(built, x, params, spec)

    def _run_built(self, built: Any, x: Any, params: Mapping[str, Any], spec: ConvSpec) -> Any:
        dev = self.device
        ws_bytes = int(self._workspace_bytes(built))
        self.last_workspace_bytes = ws_bytes
        ws = dev.alloc((ws_bytes,), np.uint8, f"{self.name} workspace")
        try:
            y = dev.alloc(spec.out_shape, x.dtype, f"{self.name} output")
        except BaseException:
            dev.free(ws)
            raise
        try:
            self._execute(built, spec, x, params, y, ws)
        except BaseException:
            dev.free(y)
            raise
        finally:
            dev.free(ws)
        return y

    def _run_bare_then_epilogue(
        self, built: Any, x: Any, params: Mapping[str, Any], spec: ConvSpec, bare: ConvSpec
    ) -> Any:
        """The bare conv, then bias and activation in float32 (a counted float32 copy)."""
        y = self._run_built(built, x, params, bare)
        dev, xp = self.device, self.device.xp
        temp = int(np.prod(spec.out_shape)) * 4
        try:
            dev.reserve(temp, f"{self.name} epilogue")
            try:
                y32 = xp.asarray(y, dtype=np.float32)  # (N, Cout, Z, Y, X)
                if spec.has_bias:
                    y32 += xp.asarray(params["bias"], dtype=np.float32).reshape(1, -1, 1, 1, 1)
                if spec.activation is not None:
                    kind, slope = spec.activation
                    y32 = apply_activation(y32, Activation(kind, slope), xp)
                y[...] = y32
            finally:
                dev.release(temp)
        except BaseException:
            dev.free(y)
            raise
        return y

    def close(self) -> None:
        """Drop the built graphs (and, for real cuDNN, its handle)."""
        self.graphs.clear()

    @abstractmethod
    def _build(self, spec: ConvSpec) -> Any | None:
        """The built graph for `spec`, or None where the library has no plan for it."""

    @abstractmethod
    def _workspace_bytes(self, built: Any) -> int:
        """The workspace the built graph's plan needs (the library's size query)."""

    @abstractmethod
    def _execute(
        self, built: Any, spec: ConvSpec, x: Any, params: Mapping[str, Any], y: Any, ws: Any
    ) -> None:
        """Run the graph: x, params' weight/bias -> y, with workspace `ws` (uint8)."""


def import_cudnn() -> Any:
    """The cuDNN frontend module, or ImportError naming the packages to install."""
    try:
        import cudnn  # nvidia-cudnn-frontend: optional, GPU-only
    except ImportError as e:
        raise ImportError(f"the cuDNN frontend is not installed; run: {INSTALL_HINT}") from e
    except OSError as e:  # the frontend is there but libcudnn.so is not
        raise ImportError(f"the cuDNN runtime library is missing ({e}); run: {INSTALL_HINT}") from e
    return cudnn


class CudnnConv(LibraryConv):
    """cuDNN frontend graphs on a CuPy device; NCDHW (C-contiguous) tensors throughout."""

    name = "cudnn"

    def __init__(self, device: Device, max_graphs: int = DEFAULT_MAX_GRAPHS) -> None:
        super().__init__(device, max_graphs)
        self._cudnn = import_cudnn()
        self._cupy = device.xp
        self.handle = self._cudnn.create_handle()
        self._stream_ptr: int | None = None
        self.unsupported: dict[ConvSpec, str] = {}

    def _dtype(self, name: str) -> Any:
        dt = self._cudnn.data_type
        return {"float32": dt.FLOAT, "float16": dt.HALF, "bfloat16": dt.BFLOAT16}[name]

    def _build(self, spec: ConvSpec) -> Any | None:
        """Graph, tensors and workspace size; None (reason kept) when cuDNN has no plan."""
        c = self._cudnn
        not_supported = getattr(c, "cudnnGraphNotSupportedError", RuntimeError)
        except_types = (not_supported, RuntimeError, ValueError)
        try:
            return self._build_graph(c, spec)
        except except_types as e:
            self.unsupported[spec] = str(e)
            return None

    def _build_graph(self, c: Any, spec: ConvSpec) -> dict[str, Any]:
        io, f32 = self._dtype(spec.io_dtype), c.data_type.FLOAT
        g = c.pygraph(io_data_type=io, intermediate_data_type=f32, compute_data_type=f32,
                      handle=self.handle)
        def tensor(name: str, shape: tuple[int, ...]) -> Any:  # NCDHW, C-contiguous
            return g.tensor(name=name, dim=list(shape), stride=contiguous_strides(shape),
                            data_type=io)

        x, w = tensor("x", spec.x_shape), tensor("w", spec.w_shape)
        geometry = dict(pre_padding=list(spec.pre_pads), post_padding=list(spec.post_pads),
                        stride=list(spec.strides), dilation=list(spec.dilations),
                        compute_data_type=f32)
        if spec.transposed:  # ConvTranspose is the data gradient of the forward conv
            y = g.conv_dgrad(loss=x, filter=w, name="conv_transpose", **geometry)
        else:
            y = g.conv_fprop(image=x, weight=w, name="conv", **geometry)
        y.set_dim(list(spec.out_shape))  # dgrad cannot infer it; NCDHW, not the default NHWC
        y.set_stride(contiguous_strides(spec.out_shape))
        tensors = {"x": x, "w": w}
        if spec.has_bias:
            b = tensor("b", (1, spec.out_channels, 1, 1, 1))
            tensors["b"] = b
            y = g.bias(input=y, bias=b, name="bias")
        y = _fused_activation(g, y, spec.activation)
        y.set_output(True)
        y.set_data_type(io)
        y.set_stride(contiguous_strides(spec.out_shape))
        tensors["y"] = y
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([c.heur_mode.A, c.heur_mode.FALLBACK])
        self._filter_plans(c, g, spec)
        g.check_support()
        g.build_plans()
        return {"graph": g, "tensors": tensors, "workspace": int(g.get_workspace_size())}

    def _filter_plans(self, c: Any, g: Any, spec: ConvSpec) -> None:
        """Strict fp32 drops tensor-core (TF32) and down-converting engines; every precision
        drops reduced-precision reductions (accumulation stays fp32)."""
        notes = [c.numerical_note.REDUCED_PRECISION_REDUCTION]
        if spec.io_dtype == "float32" and not spec.tf32:
            notes += [c.numerical_note.TENSOR_CORE, c.numerical_note.DOWN_CONVERT_INPUTS]
        g.deselect_numeric_notes(notes)
        g.deselect_workspace_greater_than(MAX_WORKSPACE_BYTES)

    def _workspace_bytes(self, built: Any) -> int:
        return int(built["workspace"])

    def _execute(
        self, built: Any, spec: ConvSpec, x: Any, params: Mapping[str, Any], y: Any, ws: Any
    ) -> None:
        counted: list[Any] = []
        try:
            t = built["tensors"]
            pack = {t["x"]: self._usable(x, counted).data.ptr,
                    t["w"]: self._usable(params["weight"], counted).data.ptr,
                    t["y"]: y.data.ptr}
            if spec.has_bias:  # the bias node reads the io dtype: a Cout-element cast
                b = self._cupy.asarray(params["bias"], dtype=y.dtype)
                if b is not params["bias"]:
                    counted.append(self.device.adopt(b, "cuDNN bias"))
                pack[t["b"]] = self._usable(b, counted).data.ptr
            with self._lock:  # one handle: bind and enqueue together (execute is async)
                self._bind_stream()
                built["graph"].execute(pack, ws.data.ptr, handle=self.handle)
        finally:
            self.device.free(*counted)  # CuPy's pool is stream-ordered: reuse waits for it

    def _usable(self, a: Any, counted: list[Any]) -> Any:
        """`a`, or a counted C-contiguous copy 16-byte aligned as the graph's tensors are
        described (a view at an odd offset is not); CuPy's own allocations are aligned."""
        b = self._cupy.ascontiguousarray(a)
        if b.data.ptr % TENSOR_ALIGN_BYTES:
            b = b.copy()
        if b is not a:
            counted.append(self.device.adopt(b, "cuDNN input copy"))
        return b

    def _bind_stream(self) -> None:
        """Run on CuPy's current stream, so cuDNN is ordered with the surrounding kernels."""
        ptr = int(self._cupy.cuda.get_current_stream().ptr)
        if ptr != self._stream_ptr:
            self._cudnn.set_stream(handle=self.handle, stream=ptr)
            self._stream_ptr = ptr

    def close(self) -> None:
        super().close()
        self._cudnn.destroy_handle(self.handle)


def _fused_activation(g: Any, y: Any, act: tuple[str, float] | None) -> Any:
    """The activation as a cuDNN pointwise node after the bias (fused by the runtime)."""
    if act is None:
        return y
    kind, slope = act
    if kind == "relu":
        return g.relu(input=y, name="relu")
    if kind == "leaky_relu":
        return g.leaky_relu(input=y, negative_slope=slope, name="leaky_relu")
    if kind == "sigmoid":
        return g.sigmoid(input=y, name="sigmoid")
    if kind == "tanh":
        return g.tanh(input=y, name="tanh")
    if kind == "elu":  # alpha 1, as znni.primitives.activations applies it
        return g.elu(input=y, name="elu")
    raise ValueError(f"activation {kind!r} has no cuDNN pointwise node")
