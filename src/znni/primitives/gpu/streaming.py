"""GPU + host RAM: stream sub-batches between host and device with two streams.

ZNNi's GPU + host RAM algorithm: a tensor that does not fit on the device
lives in host RAM and is processed in sub-batches. Two slots of device
buffers (and of pinned host buffers) alternate, so while the compute stream
works on sub-batch j, the copy stream uploads sub-batch j+1 and downloads
j-1. Per slot, events order the reuse: an upload into a slot waits for the
compute that last read it, a compute waits for the download that last read
its output slot, and the host refills a pinned buffer only after the copy
that last read it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import ceil, prod
from typing import Any

import numpy as np

from znni.primitives.gpu.device import Device
from znni.primitives.gpu.workspace import Workspace


def chunk_sizes(total: int) -> list[int]:
    """Candidate chunk sizes for `total` items, largest first, each giving a distinct
    number of chunks (the sub-batches and channel groups tried under a memory cap)."""
    sizes: list[int] = []
    for n in range(1, total + 1):
        size = ceil(total / n)
        if not sizes or size < sizes[-1]:
            sizes.append(size)
    return sizes

Index = tuple[slice, ...]


@dataclass(frozen=True)
class Chunk:
    """One sub-batch: where it is read from the host input and written to the host output."""

    src: Index
    dst: Index
    in_shape: tuple[int, ...]
    out_shape: tuple[int, ...]


# compute(chunk number, device input, device output, workspace) runs on the compute stream.
Compute = Callable[[int, Any, Any, Workspace], None]


def _view(buf: Any, shape: tuple[int, ...]) -> Any:
    """The leading prod(shape) elements of a flat slot buffer, shaped `shape`."""
    return buf[: prod(shape)].reshape(shape)


def slots_for(n_chunks: int) -> int:
    return 1 if n_chunks == 1 else 2


def stream_bytes(n_chunks: int, in_bytes: int, out_bytes: int) -> int:
    """Device bytes of the slot buffers for chunks of at most in/out bytes."""
    return slots_for(n_chunks) * (in_bytes + out_bytes)


class _Slots:
    """Device and pinned buffers of the (one or two) slots, accounted on the device."""

    def __init__(self, device: Device, n: int, in_size: int, out_size: int, tag: str) -> None:
        self.device = device
        self.din = [device.alloc((in_size,), np.float32, f"{tag} input slot") for _ in range(n)]
        self.dout = [device.alloc((out_size,), np.float32, f"{tag} output slot") for _ in range(n)]
        self.pin = [device.pinned((in_size,)) for _ in range(n)]
        self.pout = [device.pinned((out_size,)) for _ in range(n)]
        n_events = [None] * n
        self.h2d: list[Any] = list(n_events)  # upload from pin[k] / into din[k] finished
        self.comp: list[Any] = list(n_events)  # compute reading din[k], writing dout[k] finished
        self.d2h: list[Any] = list(n_events)  # download from dout[k] into pout[k] finished

    def free(self) -> None:
        self.device.free(*self.din, *self.dout)
        self.din, self.dout = [], []


def stream_chunks(
    device: Device,
    x: np.ndarray,
    out: np.ndarray,
    chunks: Sequence[Chunk],
    compute: Compute,
    workspace_bytes: int,
    tag: str = "op",
    prologue: Callable[[Workspace], None] | None = None,
) -> None:
    """Run `compute` over `chunks` of host `x` into host `out`, overlapping copies and compute.

    `workspace_bytes` is reserved on the device for the whole call (one chunk
    computes at a time); `prologue` runs first on the compute stream (e.g. kernel
    spectra). On any failure every stream is drained before the error is raised.
    """
    n = len(chunks)
    in_size = max(prod(c.in_shape) for c in chunks)
    out_size = max(prod(c.out_shape) for c in chunks)
    copy, comp = device.stream("copy"), device.stream("compute")
    device.reserve(workspace_bytes, f"{tag} workspace")
    slots: _Slots | None = None
    try:
        slots = _Slots(device, slots_for(n), in_size, out_size, tag)
        if prologue is not None:
            device.launch(
                comp, lambda: prologue(Workspace(workspace_bytes, tag)), f"{tag} prologue"
            )
        _run(device, x, out, chunks, compute, workspace_bytes, tag, slots, copy, comp)
        device.synchronize()
    except BaseException:
        try:
            device.synchronize()
        except Exception:  # noqa: BLE001 - the first error is the one to report
            pass
        raise
    finally:
        if slots is not None:
            slots.free()
        device.release(workspace_bytes)


def _run(
    device: Device,
    x: np.ndarray,
    out: np.ndarray,
    chunks: Sequence[Chunk],
    compute: Compute,
    workspace_bytes: int,
    tag: str,
    s: _Slots,
    copy: Any,
    comp: Any,
) -> None:
    ns = len(s.din)

    def stage(j: int) -> None:  # host -> pinned -> device input slot
        k, c = j % ns, chunks[j]
        if s.h2d[k] is not None:
            device.host_wait(s.h2d[k])  # the pinned buffer's last upload is done
        pin = _view(s.pin[k], c.in_shape)
        np.copyto(pin, x[c.src])
        if s.comp[k] is not None:
            device.wait(copy, s.comp[k])  # the slot's last reader finished
        device.copy_to_device(_view(s.din[k], c.in_shape), pin, copy, f"{tag}#{j}")
        s.h2d[k] = device.record(copy)

    def launch(j: int) -> None:
        k, c = j % ns, chunks[j]
        din, dout = _view(s.din[k], c.in_shape), _view(s.dout[k], c.out_shape)
        device.wait(comp, s.h2d[k])
        if s.d2h[k] is not None:
            device.wait(comp, s.d2h[k])  # the output slot was downloaded
        work = Workspace(workspace_bytes, tag)
        device.launch(comp, lambda: compute(j, din, dout, work), f"{tag}#{j}")
        s.comp[k] = device.record(comp)

    def finish(j: int) -> None:  # pinned -> host output
        k, c = j % ns, chunks[j]
        device.host_wait(s.d2h[k])
        out[c.dst] = _view(s.pout[k], c.out_shape)

    def download(j: int) -> None:
        k, c = j % ns, chunks[j]
        if j - ns >= 0:
            finish(j - ns)  # pout[k] is free again
        device.wait(copy, s.comp[k])
        device.copy_to_host(
            _view(s.pout[k], c.out_shape), _view(s.dout[k], c.out_shape), copy, f"{tag}#{j}"
        )
        s.d2h[k] = device.record(copy)

    stage(0)
    for j in range(len(chunks)):
        launch(j)
        if j + 1 < len(chunks):
            stage(j + 1)  # queued on the copy stream before download(j): overlaps compute(j)
        download(j)
    for j in range(max(0, len(chunks) - ns), len(chunks)):
        finish(j)


def batch_chunks(
    batch: int,
    sub: int,
    in_tail: tuple[int, ...],
    out_tail: tuple[int, ...],
    out_factor: int = 1,
    out_lead: Index = (),
) -> list[Chunk]:
    """Chunks of `sub` samples along axis 0; output rows scale by `out_factor` (MPF)."""
    chunks = []
    for s0 in range(0, batch, sub):
        s1 = min(batch, s0 + sub)
        chunks.append(
            Chunk(
                src=(slice(s0, s1),),
                dst=(slice(s0 * out_factor, s1 * out_factor), *out_lead),
                in_shape=(s1 - s0, *in_tail),
                out_shape=((s1 - s0) * out_factor, *out_tail),
            )
        )
    return chunks
