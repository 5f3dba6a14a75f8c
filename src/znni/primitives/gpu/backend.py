"""`GpuBackend`: the `Backend` protocol on a device, GPU-only or GPU + host RAM.

Arrays come and go as host numpy arrays (the protocol); inside, each call
picks the largest sub-batch that fits the device's memory cap and streams
the sub-batches through two streams (streaming.py). A conv whose single
sample does not fit is also split over output channels; a primitive that
does not fit at all gives way to the other family (FFT <-> direct), as ZNNi
notes throughput drops where memory forces a slower primitive.

`run_ops` runs a range of a network: the longest tail of ops that fits on
the device runs GPU-only on sub-batches of fragments (one upload, one
download), the ops before it run one layer at a time from host RAM (ZNNi's
GPU + host RAM algorithm with its split layer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from math import ceil, prod
from typing import Any

import numpy as np

from znni.primitives.base import Activation, Conv, Op, Pool, Triple
from znni.primitives.dense import fuse_activations
from znni.primitives.gpu.device import Device, nbytes_of
from znni.primitives.gpu.kept_params import KeptParams
from znni.primitives.gpu.layers import (
    DeviceOp,
    Params,
    alternative,
    apply_op,
    fill_spectra,
    resolve_primitive,
)
from znni.primitives.gpu.streaming import (
    Chunk,
    batch_chunks,
    chunk_sizes,
    stream_bytes,
    stream_chunks,
)
from znni.primitives.gpu.workspace import Workspace
from znni.primitives.reference import maxpool_reference
from znni.triple import as_triple

Shape = tuple[int, ...]
MAX_FFT_BATCH_BYTES = 64 * 2**20


class GpuBackend:
    """The GPU backend. `device` defaults to the CUDA device through CuPy."""

    name = "gpu"

    def __init__(
        self,
        device: Device | None = None,
        memory_cap_bytes: int | None = None,
        fft_batch_bytes: int | None = None,
    ) -> None:
        if device is None:
            from znni.primitives.gpu.cupy_device import CupyDevice

            device = CupyDevice(memory_cap_bytes)
        elif memory_cap_bytes is not None:
            if memory_cap_bytes <= 0:
                raise ValueError(f"memory cap must be positive, got {memory_cap_bytes} bytes")
            device.memory_cap_bytes = int(memory_cap_bytes)
        self.device = device
        self.name = "gpu" if device.name == "cuda" else "gpu-standin"
        cap = device.memory_cap_bytes
        self.fft_batch_bytes = int(
            fft_batch_bytes or max(4096, min(MAX_FFT_BATCH_BYTES, cap // 16))
        )
        self.sub_batches: list[tuple[str, int]] = []  # (op tag, chunks streamed), per call
        self.kept = KeptParams(device)  # conv parameters uploaded once per run, not per call

    # -- the Backend protocol ------------------------------------------------
    def conv3d(
        self,
        x: np.ndarray,
        weight: np.ndarray,
        bias: np.ndarray,
        activation: Activation | None = None,
        primitive: str | None = None,
    ) -> np.ndarray:
        op = Conv(np.asarray(weight, np.float32), np.asarray(bias, np.float32))
        if x.ndim != 5 or x.shape[1] != op.in_channels:
            raise ValueError(
                f"input of shape {x.shape} does not match a kernel of shape {op.weight.shape}"
            )
        dop = DeviceOp(-1, op, activation, resolve_primitive(primitive, op.kernel))
        return self._run_conv(dop, self._host(x))

    def mpf(self, x: np.ndarray, window: Triple) -> np.ndarray:
        return self._run_segment([DeviceOp(-1, Pool(as_triple(window)))], self._host(x))

    def activation(self, x: np.ndarray, activation: Activation) -> np.ndarray:
        return self._run_segment([DeviceOp(-1, activation)], self._host(x))

    def maxpool(self, x: np.ndarray, window: Triple) -> np.ndarray:
        """Strided max-pool, streamed in sub-batches like every other op."""
        x = self._host(x)
        s, c, nz, ny, nx = x.shape
        tail = (c, nz // window[0], ny // window[1], nx // window[2])
        per_sample = nbytes_of(x.shape[1:]) + 2 * nbytes_of(tail)
        sub = self._largest_fit(s, lambda sub, n: sub * per_sample + stream_bytes(n, 0, 0))
        if sub is None:
            raise self._no_fit("maxpool", x.shape)
        out = np.empty((s, *tail), np.float32)

        def compute(j: int, din: Any, dout: Any, ws: Workspace) -> None:
            dout[...] = maxpool_reference(din, window)

        chunks = batch_chunks(s, sub, x.shape[1:], tail)
        stream_chunks(self.device, x, out, chunks, compute, sub * nbytes_of(tail), "maxpool")
        self.sub_batches.append(("maxpool", len(chunks)))
        return out

    # -- whole ranges of a network -----------------------------------------------
    def run_ops(
        self,
        ops: Sequence[Op],
        x: np.ndarray,
        primitives: Sequence[str | None] | None = None,
        start: int = 0,
        stop: int | None = None,
    ) -> tuple[np.ndarray, list[Triple]]:
        """Run ops[start:stop] on an MPF batch; returns the fragment batch and pool windows."""
        stop = len(ops) if stop is None else stop
        dops = []
        for j, op, act in fuse_activations(ops[start:stop]):
            i = start + j
            prim = None
            if isinstance(op, Conv):
                prim = resolve_primitive(primitives[i] if primitives else None, op.kernel)
            dops.append(DeviceOp(i, op, act, prim))
        t = self._host(x)
        shapes = [t.shape]
        for d in dops:
            shapes.append(d.out_shape(shapes[-1]))
        split = next(
            (k for k in range(len(dops)) if self._fit_segment(dops[k:], shapes[k]) is not None),
            len(dops),
        )
        for d in dops[:split]:  # GPU + host RAM: one layer at a time from host memory
            t = self._run_conv(d, t) if isinstance(d.op, Conv) else self._run_segment([d], t)
        if split < len(dops):  # GPU-only on sub-batches of fragments
            t = self._run_segment(dops[split:], t)
        windows = [d.op.window for d in dops if isinstance(d.op, Pool)]
        return t, windows

    # -- internals ---------------------------------------------------------------
    @staticmethod
    def _host(x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x, dtype=np.float32)

    def _free_bytes(self) -> int:
        """Free device memory, counting kept parameters as free: a call's fit counts its
        own parameters, and it gives back the others before it allocates."""
        return self.device.memory_cap_bytes - self.device.in_use_bytes + self.kept.nbytes

    def _largest_fit(self, total: int, need: Any) -> int | None:
        """Largest sub-batch `sub` with need(sub, chunks) within the free device memory."""
        free = self._free_bytes()
        for sub in chunk_sizes(total):
            if need(sub, ceil(total / sub)) <= free:
                return sub
        return None

    def _no_fit(self, what: str, shape: Shape) -> ValueError:
        return ValueError(
            f"{what} on input {shape} does not fit the {self.device.memory_cap_bytes}-byte "
            "device memory cap even one sample at a time; use a smaller patch or more memory"
        )

    def _segment_bytes(self, dops: Sequence[DeviceOp], shape: Shape, chunks: int) -> int:
        shapes = [shape]
        for d in dops:
            shapes.append(d.out_shape(shapes[-1]))
        params = sum(d.param_bytes(shapes[i]) for i, d in enumerate(dops))
        ws = max(d.workspace_bytes(shapes[i], self.fft_batch_bytes) for i, d in enumerate(dops))
        last = len(dops) - 1
        inter = max(
            (nbytes_of(shapes[i]) if i > 0 else 0) + (nbytes_of(shapes[i + 1]) if i < last else 0)
            for i in range(len(dops))
        )
        slots = stream_bytes(chunks, nbytes_of(shapes[0]), nbytes_of(shapes[-1]))
        return params + ws + inter + slots

    def _fit_segment(self, dops: Sequence[DeviceOp], shape: Shape) -> int | None:
        s = shape[0]
        return self._largest_fit(s, lambda sub, n: self._segment_bytes(dops, (sub, *shape[1:]), n))

    def _run_segment(self, dops: Sequence[DeviceOp], x: np.ndarray) -> np.ndarray:
        """Run fused ops back to back on the device over sub-batches of x's batch axis."""
        sub = self._fit_segment(dops, x.shape)
        if sub is None and len(dops) == 1 and not isinstance(dops[0].op, Conv):
            return self._run_channelwise(dops[0], x)
        if sub is None:
            raise self._no_fit(" + ".join(d.tag for d in dops), x.shape)
        shapes = [x.shape]
        for d in dops:
            shapes.append(d.out_shape(shapes[-1]))
        factor = prod(d.batch_factor for d in dops)
        out = np.empty(shapes[-1], np.float32)
        chunks = batch_chunks(x.shape[0], sub, x.shape[1:], shapes[-1][1:], factor)
        sub_shapes = [(sub, *x.shape[1:])]
        for d in dops:
            sub_shapes.append(d.out_shape(sub_shapes[-1]))
        ws_bytes = max(
            d.workspace_bytes(sub_shapes[i], self.fft_batch_bytes) for i, d in enumerate(dops)
        )
        self.kept.retain(self.kept.key(d, sub_shapes[i], 0, None) for i, d in enumerate(dops))
        got = [self.kept.get(d, sub_shapes[i]) for i, d in enumerate(dops)]
        params = [p for p, _ in got]
        compute = self._chain(dops, params)
        tag = "+".join(d.tag for d in dops)
        fill = [p for p, f in got if f]
        stream_chunks(self.device, x, out, chunks, compute, ws_bytes, tag, self._prologue(fill))
        self.sub_batches.append((tag, len(chunks)))
        return out

    def _run_channelwise(self, dop: DeviceOp, x: np.ndarray) -> np.ndarray:
        """MPF or an activation one sample and a group of channels at a time (channels are
        independent), for when one whole sample does not fit."""
        s, c = x.shape[:2]
        out_shape = dop.out_shape(x.shape)
        factor = dop.batch_factor
        chunk_bytes = None
        for g in chunk_sizes(c):
            sh = (1, g, *x.shape[2:])
            n = s * ceil(c / g)
            need = self._segment_bytes([dop], sh, n)
            if need <= self._free_bytes():
                chunk_bytes = dop.workspace_bytes(sh, self.fft_batch_bytes)
                break
        if chunk_bytes is None:
            raise self._no_fit(dop.tag, x.shape)
        chunks = [
            Chunk(
                src=(slice(i, i + 1), slice(c0, min(c, c0 + g))),
                dst=(slice(i * factor, (i + 1) * factor), slice(c0, min(c, c0 + g))),
                in_shape=(1, min(c, c0 + g) - c0, *x.shape[2:]),
                out_shape=(factor, min(c, c0 + g) - c0, *out_shape[2:]),
            )
            for i in range(s)
            for c0 in range(0, c, g)
        ]
        out = np.empty(out_shape, np.float32)
        compute = self._chain([dop], [None])
        stream_chunks(self.device, x, out, chunks, compute, chunk_bytes, f"{dop.tag}[c]")
        self.sub_batches.append((dop.tag, len(chunks)))
        return out

    def _chain(self, dops: Sequence[DeviceOp], params: Sequence[Params | None]) -> Any:
        device, bb = self.device, self.fft_batch_bytes

        def compute(j: int, din: Any, dout: Any, ws: Workspace) -> None:
            t = din
            try:
                for i, d in enumerate(dops):
                    last = i == len(dops) - 1
                    target = dout if last else device.alloc(d.out_shape(t.shape), what=d.tag)
                    try:
                        apply_op(device, d, params[i], t, target, ws, bb)
                    except BaseException:
                        if target is not dout:
                            device.free(target)
                        raise
                    if t is not din:
                        device.free(t)
                    t = target
            except BaseException:
                if t is not din and t is not dout:
                    device.free(t)
                raise

        return compute

    def _prologue(self, params: Sequence[Params | None]) -> Any:
        kept = [p for p in params if p is not None and p.spectra is not None]
        if not kept:
            return None

        def prologue(ws: Workspace) -> None:
            for p in kept:
                fill_spectra(self.device, p, self.fft_batch_bytes, ws)

        return prologue

    def _conv_fit(self, dop: DeviceOp, shape: Shape) -> tuple[int, int] | None:
        """(sub-batch, output channels per group) that fit, fewest groups first."""
        assert isinstance(dop.op, Conv)  # _conv_fit is only called for convs (_run_conv)
        cout = dop.op.out_channels
        for g in chunk_sizes(cout):

            def need(sub: int, n: int, g: int = g) -> int:
                sh = (sub, *shape[1:])
                out_b = sub * g * prod(dop.out_shape(sh)[2:]) * 4
                return (
                    dop.param_bytes(sh, g)
                    + dop.workspace_bytes(sh, self.fft_batch_bytes, g)
                    + stream_bytes(n, nbytes_of(sh), out_b)
                )

            sub = self._largest_fit(shape[0], need)
            if sub is not None:
                return sub, g
        return None

    def _run_conv(self, dop: DeviceOp, x: np.ndarray) -> np.ndarray:
        """A conv streamed over sub-batches and, if one sample is too big, output channels."""
        fit = self._conv_fit(dop, x.shape)
        if fit is None and dop.primitive is not None:
            dop = replace(dop, primitive=alternative(dop.primitive))
            fit = self._conv_fit(dop, x.shape)
        if fit is None:
            raise self._no_fit(f"conv layer {dop.index}", x.shape)
        sub, g = fit
        assert isinstance(dop.op, Conv)  # _run_conv is only called for convs
        cout = dop.op.out_channels
        out_shape = dop.out_shape(x.shape)
        out = np.empty(out_shape, np.float32)
        n_chunks = 0
        for o0 in range(0, cout, g):
            o1 = min(cout, o0 + g)
            chunks = batch_chunks(
                x.shape[0], sub, x.shape[1:], (o1 - o0, *out_shape[2:]), out_lead=(slice(o0, o1),)
            )
            self._conv_group(dop, x, out, chunks, (sub, *x.shape[1:]), o0, o1)
            n_chunks += len(chunks)
        self.sub_batches.append((dop.tag, n_chunks))
        return out

    def _conv_group(
        self,
        dop: DeviceOp,
        x: np.ndarray,
        out: np.ndarray,
        chunks: Any,
        sub_shape: Shape,
        o0: int,
        o1: int,
    ) -> None:
        self.kept.retain([self.kept.key(dop, sub_shape, o0, o1)])
        params, fill = self.kept.get(dop, sub_shape, o0, o1)
        assert params is not None  # dop is a conv
        ws_bytes = dop.workspace_bytes(sub_shape, self.fft_batch_bytes, o1 - o0)
        compute = self._chain([dop], [params])
        tag = f"{dop.tag}[{o0}:{o1}]"
        prologue = self._prologue([params] if fill else [])
        stream_chunks(self.device, x, out, chunks, compute, ws_bytes, tag, prologue)
