"""Graph ops on device-resident tensors: nothing goes back to the host between nodes.

`DeviceGraphOps.run` takes device arrays (in the precision's storage dtype) and
returns a new device array, counted against the device's memory cap. Convolutions
go to the planner's GPU primitive (conv_dispatch.device_conv: cuDNN, cuFFT, or the
per-offset GEMM loop); the other ops run their `xp` kernel (graph_kernels.py) in
float32 and store the result back in the storage dtype (fp32 accumulation, as the
precision promises). A node's parameters are uploaded once per (node, precision)
and kept in a cache bounded in bytes and counted on the device.

When an op's output and temporaries do not fit beside the live tensors, it runs in
chunks of output channels (graph_split.py) written into one output buffer; when
even that fails it raises `DeviceOutOfMemory`, and the caller (the engine) runs a
smaller batch of windows.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from math import prod
from typing import Any

import numpy as np

from znni.primitives.base import Activation
from znni.primitives.gpu.device import Device, DeviceOutOfMemory
from znni.primitives.gpu.graph_kernels import KERNELS
from znni.primitives.gpu.graph_split import (
    Shape,
    channel_ranges,
    channel_unit,
    chunk_inputs,
    out_shape,
    workspace_bytes,
)
from znni.primitives.gpu.streaming import chunk_sizes
from znni.primitives.precision import check_precision, storage_dtype

log = logging.getLogger("znni.engine")
CONV_OPS = ("conv", "conv_transpose")
F32 = np.float32


class DeviceParams:
    """Nodes' parameters on the device: weights in the storage dtype, every other array
    float32; LRU bounded in bytes, each entry counted on the device until evicted."""

    def __init__(self, device: Device, precision: str, max_bytes: int) -> None:
        self.device, self.dtype = device, storage_dtype(precision)
        self.max_bytes, self.nbytes = int(max_bytes), 0
        self._items: OrderedDict[str, tuple[dict[str, Any], int, list[Any]]] = OrderedDict()

    def get(self, key: str, params: Mapping[str, Any]) -> dict[str, Any]:
        hit = self._items.get(key)
        if hit is not None:
            self._items.move_to_end(key)
            return hit[0]
        dparams, held = self._upload(params)
        size = sum(int(a.nbytes) for a in held)
        self._items[key] = (dparams, size, held)
        self.nbytes += size
        while self.nbytes > self.max_bytes and len(self._items) > 1:
            _, (_, gone, arrays) = self._items.popitem(last=False)
            self.device.free(*arrays)
            self.nbytes -= gone
        return dparams

    def _upload(self, params: Mapping[str, Any]) -> tuple[dict[str, Any], list[Any]]:
        xp, held = self.device.xp, []
        out: dict[str, Any] = {}
        try:
            for name, value in params.items():
                if not isinstance(value, np.ndarray):
                    out[name] = value
                    continue
                dtype = self.dtype if name == "weight" else F32
                arr = self.device.adopt(xp.asarray(value.astype(dtype, copy=False)),
                                        f"parameter {name}")
                held.append(arr)
                out[name] = arr
        except BaseException:
            self.device.free(*held)
            raise
        return out, held

    def clear(self) -> None:
        for _, _, arrays in self._items.values():
            self.device.free(*arrays)
        self._items.clear()
        self.nbytes = 0


class DeviceGraphOps:
    """Runs graph ops on device arrays at `precision`; `log` gets (op, channel chunks)."""

    def __init__(self, device: Device, precision: str = "fp32",
                 params_cache_bytes: int | None = None) -> None:
        self.device = device
        self.precision = check_precision(precision)
        self.dtype = storage_dtype(precision)
        cache = params_cache_bytes if params_cache_bytes is not None else \
            device.memory_cap_bytes // 8
        self.params = DeviceParams(device, precision, cache)
        self.log: list[tuple[str, int]] = []
        self._warned: set[str] = set()

    # -- moving tensors -------------------------------------------------------------
    def to_device(self, host: np.ndarray) -> Any:
        """A counted device copy of a host array, in the storage dtype (synchronous)."""
        xp = self.device.xp
        return self.device.adopt(xp.asarray(np.asarray(host).astype(self.dtype, copy=False)),
                                 "input")

    def free(self, *arrays: Any) -> None:
        self.device.free(*arrays)

    # -- running one node --------------------------------------------------------------
    def run(self, op: str, key: str, params: Mapping[str, Any], inputs: Sequence[Any],
            primitive: str | None = None, activation: Activation | None = None) -> Any:
        """Node `key`'s `op` on device `inputs` -> a new counted device array."""
        if op not in KERNELS:
            raise ValueError(f"the GPU backend has no kernel for graph op {op!r}")
        shapes = [tuple(a.shape) for a in inputs]
        out = out_shape(op, dict(params), shapes)
        try:
            y = self._whole(op, key, params, inputs, primitive, activation, out)
            self.log.append((op, 1))
            return y
        except DeviceOutOfMemory:
            pass  # too big whole: output channels in chunks, each with its activation
        return self._in_channel_chunks(op, key, params, inputs, primitive, activation, out)

    def _whole(self, op: str, key: str, params: Mapping[str, Any], inputs: Sequence[Any],
               primitive: str | None, activation: Activation | None, out: Shape) -> Any:
        dparams = self.params.get(f"{key}@{self.precision}", params)
        if op in CONV_OPS:
            return self._conv(op, inputs[0], dparams, primitive, activation, key)
        return self._kernel(op, dparams, inputs, out, activation)

    def _conv(self, op: str, x: Any, dparams: dict[str, Any], primitive: str | None,
              activation: Activation | None, key: str) -> Any:
        from znni.primitives.gpu.conv_dispatch import device_conv

        return device_conv(self.device, primitive or "gemm-loop", x, dparams,
                           activation=activation, precision=self.precision,
                           transposed=op == "conv_transpose", key=f"{key}@{self.precision}")

    def _kernel(self, op: str, dparams: Mapping[str, Any], inputs: Sequence[Any], out: Shape,
                activation: Activation | None) -> Any:
        """An `xp` kernel in float32 with its temporaries reserved; the result in the
        storage dtype, counted."""
        dev, xp = self.device, self.device.xp
        in_f32 = sum(prod(a.shape) for a in inputs) * 4
        ws = workspace_bytes(op, dict(dparams), in_f32, out, [tuple(a.shape) for a in inputs])
        if self.dtype != np.dtype(F32):
            ws += in_f32 + prod(out) * 4  # the float32 copies in and out
        dev.reserve(ws + prod(out) * self.dtype.itemsize, f"graph op {op}")
        try:
            args = [a if a.dtype == F32 else a.astype(F32) for a in inputs]
            y = KERNELS[op](xp, dict(dparams), *args)
            if activation is not None:
                y = _activate(xp, y, activation)
            y = xp.ascontiguousarray(y, dtype=self.dtype)
            if any(y is a for a in inputs):
                y = y.copy()
        finally:
            dev.release(ws + prod(out) * self.dtype.itemsize)
        return dev.adopt(y, f"graph op {op} output")

    def _in_channel_chunks(self, op: str, key: str, params: Mapping[str, Any],
                           inputs: Sequence[Any],
                           primitive: str | None, activation: Activation | None,
                           out: Shape) -> Any:
        """The op in the fewest chunks of output channels that fit (graph_split.py), each
        with its parameters uploaded for the chunk alone; DeviceOutOfMemory if none do."""
        p = dict(params)
        unit = channel_unit(op, p, out)
        y = self.device.alloc(out, self.dtype, f"graph op {op} output")
        for per in chunk_sizes(out[1])[1:]:
            ranges = channel_ranges(out[1], unit, per)
            if ranges is None:
                continue
            try:
                for c in ranges:
                    self._chunk(op, p, inputs, c, y, primitive, activation)
            except DeviceOutOfMemory:
                continue
            self.log.append((op, len(ranges)))
            if key not in self._warned:  # once per node: it repeats for every window
                self._warned.add(key)
                log.warning("graph node %s (%s) did not fit the device whole; it runs in %d "
                            "chunks of output channels", key, op, len(ranges))
            return y
        self.device.free(y)
        raise DeviceOutOfMemory(
            f"graph op {op!r} on input {tuple(inputs[0].shape)} does not fit the "
            f"{self.device.memory_cap_bytes}-byte device memory cap even one channel group "
            "at a time"
        )

    def _chunk(self, op: str, p: dict[str, Any], inputs: Sequence[Any], c: tuple[int, int],
               y: Any, primitive: str | None, activation: Activation | None) -> None:
        q, views = chunk_inputs(op, p, list(inputs), (0, out_batch(inputs)), c)
        part_params = DeviceParams(self.device, self.precision, 2**62)
        try:
            dq = part_params.get("chunk", q)
            if op in CONV_OPS:
                part = self._conv(op, views[0], dq, primitive, activation, "")
            else:
                shape = out_shape(op, q, [tuple(v.shape) for v in views])
                part = self._kernel(op, dq, views, shape, activation)
            y[:, c[0]:c[1]] = part
            self.device.free(part)
        finally:
            part_params.clear()

    def close(self) -> None:
        self.params.clear()


def out_batch(inputs: Sequence[Any]) -> int:
    return max(int(a.shape[0]) for a in inputs)


def _activate(xp: Any, y: Any, act: Activation) -> Any:
    """The ReLU family after a norm or a kernel (convs fuse theirs in device_conv)."""
    if act.kind == "linear":
        return y
    kernel = KERNELS.get(act.kind)
    if kernel is None:
        raise ValueError(f"activation {act.kind!r} has no GPU kernel")
    return kernel(xp, {"alpha": act.slope}, y)
