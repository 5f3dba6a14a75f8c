"""Dense application of a whole network to a patch through MPF."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from znni.primitives.base import Activation, Backend, Conv, Op, Pool, Triple
from znni.primitives.fragments import recombine


def fuse_activations(ops: Sequence[Op]) -> list[tuple[int, Op, Activation | None]]:
    """(op index, op, activation right after a conv or None), so backends can fuse them."""
    fused: list[tuple[int, Op, Activation | None]] = []
    i = 0
    while i < len(ops):
        op = ops[i]
        nxt = ops[i + 1] if i + 1 < len(ops) else None
        if isinstance(op, Conv) and isinstance(nxt, Activation):
            fused.append((i, op, nxt))
            i += 2
        else:
            fused.append((i, op, None))
            i += 1
    return fused


def forward_range(
    ops: Sequence[Op],
    x: np.ndarray,
    backend: Backend,
    primitives: Sequence[str | None] | None = None,
    start: int = 0,
    stop: int | None = None,
) -> tuple[np.ndarray, list[Triple]]:
    """Run ops[start:stop] over an MPF batch without recombining it.

    Returns the fragment batch and the pool windows met, so a pass can be split
    between backends (the CPU-GPU pipeline) and recombined once at the end with
    the windows of every part. Backends that keep tensors on their device across
    layers (the GPU backend) provide `run_ops` with this signature and are used
    through it.
    """
    stop = len(ops) if stop is None else stop
    run_ops = getattr(backend, "run_ops", None)
    if run_ops is not None:
        return run_ops(ops, x, primitives, start, stop)
    t = np.ascontiguousarray(x, dtype=np.float32)
    windows: list[Triple] = []
    for j, op, act in fuse_activations(ops[start:stop]):
        i = start + j  # index into the whole network, as plans number their primitives
        if isinstance(op, Conv):
            choice = primitives[i] if primitives is not None else None
            t = backend.conv3d(t, op.weight, op.bias, act, choice)
        elif isinstance(op, Pool):
            t = backend.mpf(t, op.window)  # (S*P, C, ...)
            windows.append(op.window)
        else:
            t = backend.activation(t, op)
    return t, windows


def dense_forward(
    ops: Sequence[Op],
    x: np.ndarray,
    backend: Backend,
    primitives: Sequence[str | None] | None = None,
) -> np.ndarray:
    """Run `ops` densely over a batch of patches.

    x: (B, C, Z, Y, X) float32 with every axis a valid MPF input size
    (n = fov - 1 + P*j). Returns (B, Cout, Z-fov+1, Y-fov+1, X-fov+1).
    `primitives[i]` is the conv algorithm for op i (None: the backend chooses).
    """
    if x.ndim != 5:
        raise ValueError(f"expected a (B, C, Z, Y, X) batch, got shape {x.shape}")
    t, windows = forward_range(ops, x, backend, primitives)
    return recombine(t, x.shape[0], windows)
