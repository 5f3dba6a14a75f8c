"""The CPU-GPU pipeline (ZNNi): the CPU runs layers [0, split_op) of patch i+1 while the GPU
runs layers [split_op, end) of patch i.

A producer thread runs the CPU part and hands its fragment batch, with the
pool windows it met, through a queue of one (a double buffer: one patch
waiting, one on the GPU); the calling thread runs the GPU part and
recombines the fragments with the windows of both halves. A failure in
either stage stops the other and is raised to the caller; outputs are
yielded only when complete and in patch order, so a caller that marks work
done per yielded output never marks a patch whose output does not exist.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from znni.primitives.base import Backend, Op, Triple
from znni.primitives.dense import forward_range
from znni.primitives.fragments import recombine

POLL_S = 0.05  # how often a blocked stage checks whether the other one stopped
JOIN_TIMEOUT_S = 600.0


class PipelineError(RuntimeError):
    """The CPU stage of the pipeline failed; the original error is its cause."""


@dataclass
class _Handoff:
    batch: int
    fragments: np.ndarray  # (S, C, Z, Y, X) after layers [0, split_op)
    windows: list[Triple]


@dataclass
class _Failure:
    error: BaseException


_DONE = object()


def _producer(
    ops: Sequence[Op],
    patches: Iterable[np.ndarray],
    cpu: Backend,
    split_op: int,
    primitives: Sequence[str | None] | None,
    handoff: queue.Queue[object],
    stop: threading.Event,
) -> None:
    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                handoff.put(item, timeout=POLL_S)
                return True
            except queue.Full:
                continue
        return False

    try:
        for x in patches:
            if stop.is_set():
                return
            if x.ndim != 5:
                raise ValueError(f"expected a (B, C, Z, Y, X) patch batch, got shape {x.shape}")
            t, windows = forward_range(ops, x, cpu, primitives, 0, split_op)
            if not put(_Handoff(x.shape[0], t, windows)):
                return
        put(_DONE)
    except BaseException as e:  # noqa: BLE001 - handed to the consumer, which raises it
        put(_Failure(e))


def _check_split_op(ops: Sequence[Op], split_op: int) -> None:
    if not 0 <= split_op <= len(ops):
        raise ValueError(f"split_op={split_op} is outside the network's 0..{len(ops)} ops")


def run_patches_cpu_gpu(
    ops: Sequence[Op],
    patches: Iterable[np.ndarray],
    cpu_backend: Backend,
    gpu_backend: Backend,
    split_op: int,
    primitives: Sequence[str | None] | None = None,
) -> Iterator[np.ndarray]:
    """Dense outputs of `patches` ((B, C, Z, Y, X) batches of valid MPF sizes), in order.

    Ops [0, split_op) run on `cpu_backend`, ops [split_op, end) on `gpu_backend`,
    overlapped across consecutive patches. Each output equals
    `dense_forward(ops, x, backend, primitives)`. Closing the iterator early
    stops the CPU stage; an error in either stage is raised here.
    """
    _check_split_op(ops, split_op)
    handoff: queue.Queue[object] = queue.Queue(maxsize=1)
    stop = threading.Event()
    worker = threading.Thread(
        target=_producer,
        args=(ops, patches, cpu_backend, split_op, primitives, handoff, stop),
        name="znni-cpu-stage",
        daemon=True,
    )
    worker.start()
    try:
        while True:
            item = _take(handoff, worker)
            if item is _DONE:
                return
            if isinstance(item, _Failure):
                if isinstance(item.error, ValueError | TypeError):
                    raise item.error
                raise PipelineError(f"CPU stage failed: {item.error}") from item.error
            assert isinstance(item, _Handoff)  # the producer sends nothing else
            t, windows = forward_range(ops, item.fragments, gpu_backend, primitives, split_op, None)
            del item.fragments
            yield recombine(t, item.batch, item.windows + windows)
    finally:
        stop.set()
        _drain(handoff)
        worker.join(JOIN_TIMEOUT_S)


def _take(handoff: queue.Queue[object], worker: threading.Thread) -> object:
    """The next hand-off; raises if the CPU stage died without saying why."""
    while True:
        try:
            return handoff.get(timeout=POLL_S)
        except queue.Empty:
            if not worker.is_alive() and handoff.empty():
                raise PipelineError("the CPU stage stopped without a result") from None


def _drain(handoff: queue.Queue[object]) -> None:
    while True:
        try:
            handoff.get_nowait()
        except queue.Empty:
            return
