"""A whole window's network compiled by OpenVINO: the largest compiled piece the graph
planner may choose ("openvino-network").

One compiled model runs every node of the window between its input and output, in
OpenVINO's blocked layouts, with one memory plan and no return to numpy between nodes:
what our node-by-node executor pays between convs (pools, transposed convs, concats,
norms, each a pass over memory and a Python call) it does not. The planner chooses it
per run against our per-node plan by predicted time (planner.graph.network_costs), so
windows, batches, blending and tiling stay ours; this file only compiles and runs.

Compiles are slow (0.2-0.5 s for a U-Net), so they start on a background thread when a
worker is made and overlap the first block's read (`CompiledNetworks.start`); compiled
networks are kept per (model file, input shape, output, precision, threads), bounded by
count. `precision` "bf16" asks OpenVINO's CPU plugin for bfloat16 inference (fp32
accumulation in its kernels) where the CPU has bf16 units; everywhere else it computes
in fp32 ("f32" forced: the plugin's default may be bf16 on such CPUs). `precision`
"int8" compiles a quantized IR (`model_path` the `.xml` NNCF's quantization saved,
openvino_int8.py) with the f32 hint: its convs between FakeQuantize nodes run on int8
kernels, the rest in fp32; the key holds that path, so it keys the quantized network.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

log = logging.getLogger("znni.primitives")
MAX_NETWORKS = 4  # compiled networks kept per process (one window shape per run, mostly)
NetworkKey = tuple[str, tuple[int, ...], str, str, int | None]
_COMPILER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="znni-ov-compile")


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX), from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


class OpenVinoNetwork:
    """An ONNX file (int8: a quantized OpenVINO IR) compiled for inputs of `input_shape`
    (B, C, Z, Y, X)."""

    def __init__(self, onnx_path: str, input_shape: tuple[int, ...], output: str,
                 precision: str = "fp32", threads: int | None = None) -> None:
        t0 = time.perf_counter()
        import openvino as ov  # the fast path's dependency, imported when first compiled

        if precision not in ("fp32", "bf16", "int8"):
            raise ValueError(f"OpenVINO networks run in fp32, bf16 or int8, not {precision!r}")
        core = ov.Core()
        model = core.read_model(onnx_path)
        if len(model.inputs) != 1:
            raise ValueError(f"{onnx_path}: a network with {len(model.inputs)} inputs")
        model.reshape({model.inputs[0]: ov.PartialShape(list(input_shape))})
        index = [i for i, o in enumerate(model.outputs) if output in o.get_names()]
        if not index:
            raise ValueError(f"{onnx_path}: no output {output!r} for OpenVINO")
        hint = "bf16" if precision == "bf16" and cpu_has_bf16() else "f32"
        if precision == "bf16" and hint != "bf16":
            log.warning("this CPU has no bf16 units (AVX512-BF16 or AMX): bf16 runs in fp32")
        config = {"INFERENCE_PRECISION_HINT": hint, "PERFORMANCE_HINT": "LATENCY",
                  "INFERENCE_NUM_THREADS": int(threads or os.cpu_count() or 1)}
        self.compiled = core.compile_model(model, "CPU", config)
        self.output_index = index[0]
        self.input_shape = tuple(input_shape)
        self.inference_precision = "int8" if precision == "int8" else hint
        self._request = self.compiled.create_infer_request()
        self.compile_s = time.perf_counter() - t0  # OpenVINO's import, read and compile
        self._lock = threading.Lock()  # one request: calls from several threads take turns

    def run(self, x: np.ndarray) -> np.ndarray:
        """(B, C, Z, Y, X) float32 -> the network's output, float32 (a new array)."""
        if tuple(x.shape) != self.input_shape:
            raise ValueError(f"compiled for inputs {self.input_shape}, got {tuple(x.shape)}")
        with self._lock:
            self._request.infer({0: np.ascontiguousarray(x, np.float32)}, share_inputs=True)
            out = self._request.get_output_tensor(self.output_index).data
            return np.array(out, dtype=np.float32, copy=True)  # the request reuses its buffer


class CompiledNetworks:
    """Compiled networks of this process by everything that shapes them, LRU by count;
    `start` compiles on a background thread, `get` waits for it."""

    def __init__(self, max_networks: int = MAX_NETWORKS) -> None:
        self.max_networks = max_networks
        # (onnx path, input shape, output, precision, threads) -> its compile
        self._items: OrderedDict[NetworkKey, Future[OpenVinoNetwork]] = OrderedDict()
        self._lock = threading.Lock()

    def start(self, onnx_path: str, input_shape: tuple[int, ...], output: str,
              precision: str = "fp32", threads: int | None = None) -> Future[OpenVinoNetwork]:
        key = (os.path.abspath(onnx_path), tuple(input_shape), output, precision, threads)
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit
            future = _COMPILER.submit(OpenVinoNetwork, onnx_path, input_shape, output,
                                      precision, threads)
            self._items[key] = future
            while len(self._items) > self.max_networks:
                self._items.popitem(last=False)
            return future

    def get(self, onnx_path: str, input_shape: tuple[int, ...], output: str,
            precision: str = "fp32", threads: int | None = None) -> OpenVinoNetwork:
        return self.start(onnx_path, input_shape, output, precision, threads).result()

    def discard(self, onnx_path: str, input_shape: tuple[int, ...], output: str,
                precision: str = "fp32", threads: int | None = None) -> None:
        """Forget a network no run will use (a compile started ahead of a plan that chose
        otherwise): cancelled if it has not begun, else dropped once compiled."""
        key = (os.path.abspath(onnx_path), tuple(input_shape), output, precision, threads)
        with self._lock:
            future = self._items.pop(key, None)
        if future is not None:
            future.cancel()

    def __contains__(self, key: NetworkKey) -> bool:
        """Whether (onnx_path, input_shape, output, precision, threads) is held."""
        path, *rest = key
        with self._lock:
            return (os.path.abspath(path), *rest) in self._items


NETWORKS = CompiledNetworks()  # this process's compiled networks (workers share them)
