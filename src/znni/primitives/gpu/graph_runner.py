"""Graph ops on a device: upload, run the `xp` kernel on the compute stream, download.

`GraphOps.run` takes host arrays and returns a host array, like every backend
call. Inputs, parameters, the output and the kernel's workspace model are
accounted against the device's memory cap; when the whole op does not fit, it
runs in chunks of fewer samples and then (where the op allows) fewer output
channels (graph_split.py), each written into its part of the host result.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from math import prod
from typing import Any

import numpy as np

from znni.primitives.gpu.device import Device
from znni.primitives.gpu.graph_kernels import KERNELS, Kernel
from znni.primitives.gpu.graph_split import (
    channel_ranges,
    channel_unit,
    chunk_inputs,
    out_shape,
    workspace_bytes,
)
from znni.primitives.gpu.streaming import chunk_sizes

Range = tuple[int, int]
Chunk = tuple[Range, Range]  # (samples, output channels)


class GraphOps:
    """Runs graph ops on `device`; appends (tag, chunks run) of each call to `log`."""

    def __init__(self, device: Device, log: list[tuple[str, int]] | None = None) -> None:
        self.device = device
        self.log = log if log is not None else []

    def run(self, op: str, params: Mapping[str, Any], *arrays: np.ndarray) -> np.ndarray:
        """`op` with the node's `params` on host `arrays` -> float32 host array."""
        kernel = KERNELS.get(op)
        if kernel is None:
            raise ValueError(f"the GPU backend has no kernel for graph op {op!r}")
        xs = [np.asarray(a, np.float32) for a in arrays]
        if any(x.ndim != 5 for x in xs):
            raise ValueError(f"{op} needs 5-D (N, C, Z, Y, X) inputs, got {[x.shape for x in xs]}")
        if op == "identity":
            return xs[0]
        p = dict(params)
        out = out_shape(op, p, [x.shape for x in xs])
        chunks = self._plan(op, p, xs, out)
        result = np.empty(out, np.float32)
        for j, (n, c) in enumerate(chunks):
            q, views = chunk_inputs(op, p, xs, n, c)
            dst = result[n[0] : n[1], c[0] : c[1]]
            ws = self._bytes(op, q, views)[1]
            self._run_chunk(kernel, q, views, dst, ws, f"graph:{op}#{j}")
        self.log.append((f"graph:{op}", len(chunks)))
        return result

    def _bytes(self, op: str, q: dict[str, Any], views: Sequence[np.ndarray]) -> tuple[int, int]:
        """(device bytes of one chunk in all, of which kernel workspace)."""
        in_b = sum(int(v.nbytes) for v in views)
        param_b = sum(int(v.nbytes) for v in q.values() if isinstance(v, np.ndarray))
        shapes = [v.shape for v in views]
        o = out_shape(op, q, shapes)
        ws = workspace_bytes(op, q, in_b, o, shapes)
        return in_b + param_b + prod(o) * 4 + ws, ws

    def _plan(self, op: str, p: dict[str, Any], xs: Sequence[np.ndarray], out: tuple) -> list:
        """The fewest chunks that fit: whole channels over sub-batches first, then fewer
        channels per chunk; ValueError when even one sample of the smallest part does not."""
        free = self.device.memory_cap_bytes - self.device.in_use_bytes
        unit = channel_unit(op, p, out)
        for per in chunk_sizes(out[1]):
            ranges = channel_ranges(out[1], unit, per)
            if ranges is None:
                continue
            for sub in chunk_sizes(out[0]):
                need = max(
                    self._bytes(op, *chunk_inputs(op, p, xs, (0, sub), c))[0] for c in ranges
                )
                if need <= free:
                    return [
                        ((s, min(out[0], s + sub)), c)
                        for s in range(0, out[0], sub)
                        for c in ranges
                    ]
        how = "one sample at a time" if unit.size == 0 else "one sample and channel group at a time"
        raise ValueError(
            f"graph op {op!r} on input {xs[0].shape} does not fit the "
            f"{self.device.memory_cap_bytes}-byte device memory cap even {how}"
        )

    def _run_chunk(
        self,
        kernel: Kernel,
        q: dict[str, Any],
        views: Sequence[np.ndarray],
        dst: np.ndarray,
        ws: int,
        tag: str,
    ) -> None:
        """Upload a chunk's inputs and parameters, run the kernel, download into `dst`."""
        dev = self.device
        copy, comp = dev.stream("copy"), dev.stream("compute")
        held: list[Any] = []
        pins: list[np.ndarray] = []  # alive until the copies that read them have run

        def upload(a: np.ndarray) -> Any:
            pin = dev.pinned(a.shape, a.dtype)
            np.copyto(pin, a)
            pins.append(pin)
            d = dev.alloc(a.shape, a.dtype, f"{tag} input")
            held.append(d)
            dev.copy_to_device(d, pin, copy, tag)
            return d

        dev.reserve(ws, f"{tag} workspace")
        try:
            dins = [upload(v) for v in views]
            dq = {k: upload(v) if isinstance(v, np.ndarray) else v for k, v in q.items()}
            dout = dev.alloc(dst.shape, np.float32, f"{tag} output")
            held.append(dout)
            dev.wait(comp, dev.record(copy))

            def work() -> None:
                dout[...] = kernel(dev.xp, dq, *dins)

            dev.launch(comp, work, tag)
            dev.wait(copy, dev.record(comp))
            pout = dev.pinned(dst.shape)
            dev.copy_to_host(pout, dout, copy, tag)
            dev.synchronize()
            dst[...] = pout
        except BaseException:
            try:
                dev.synchronize()
            except Exception:  # noqa: BLE001 - the first error is the one to report
                pass
            raise
        finally:
            dev.free(*held)
            dev.release(ws)
