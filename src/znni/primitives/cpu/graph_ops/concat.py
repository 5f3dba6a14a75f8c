"""Channel concatenation (ONNX Concat on axis 1) with the copies on all cores.

A U-Net's skip concat makes the largest fresh buffer of a window (2C x 64^3 is
32 MiB: above glibc's mmap threshold, so every window pays its page faults);
faulting and filling it from two threads took 2.7-3 ms instead of numpy's 3.9 ms.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from znni.primitives.cpu.graph_ops._parallel import run_tiles


def concat_channels(xs: Sequence[np.ndarray], pads: Sequence[int] | None = None) -> np.ndarray:
    """np.concatenate(xs, axis=1) of float32 (N, C_i, Z, Y, X) arrays that agree elsewhere;
    with `pads` (z_b, y_b, x_b, z_e, y_e, x_e >= 0), written into the interior of a zero
    border at once, as the padded conv reading it wants (one buffer and pass, not two)."""
    if not xs:
        raise ValueError("concat needs at least one input")
    arrs = [np.asarray(x, np.float32) for x in xs]
    head = arrs[0].shape
    for a in arrs:
        if a.ndim < 2 or a.shape[0] != head[0] or a.shape[2:] != head[2:]:
            raise ValueError(
                f"inputs must agree on every axis but 1, got {[a.shape for a in arrs]}"
            )
    p = [0] * 6 if pads is None else [int(v) for v in pads]
    if len(p) != 6 or min(p) < 0 or (any(p) and len(head) != 5):
        raise ValueError(f"pads must be six ints >= 0 on (N, C, Z, Y, X) inputs, got {pads}")
    size = tuple(head[2 + a] + p[a] + p[a + 3] for a in range(len(head) - 2))
    out = np.empty((head[0], sum(a.shape[1] for a in arrs)) + size, np.float32)
    inside = tuple(slice(p[a], p[a] + head[2 + a]) for a in range(len(head) - 2))
    pieces = []  # (input, channel from, channel to, output channel)
    start = 0
    for i, a in enumerate(arrs):
        c = a.shape[1]
        half = (c + 1) // 2  # two pieces per input: both cores copy even a single big one
        pieces += [(i, 0, half, start), (i, half, c, start + half)]
        start += c

    def run(part: Sequence[tuple[int, int, int, int]]) -> list[None]:
        for i, c0, c1, o in part:
            if c1 > c0:
                dst = out[:, o : o + c1 - c0]  # (N, c, Z', Y', X')
                if any(p):
                    _zero_border(dst, p)
                dst[(slice(None), slice(None), *inside)] = arrs[i][:, c0:c1]
        return [None] * len(part)

    run_tiles(run, pieces, out.nbytes)
    return out


def _zero_border(a: np.ndarray, p: Sequence[int]) -> None:
    """Zero the pads-wide faces of (N, C, Z, Y, X) `a`; the interior is left as it is."""
    z, y, x = a.shape[2:]
    a[:, :, : p[0]] = 0.0
    a[:, :, z - p[3] :] = 0.0
    a[:, :, :, : p[1]] = 0.0
    a[:, :, :, y - p[4] :] = 0.0
    a[:, :, :, :, : p[2]] = 0.0
    a[:, :, :, :, x - p[5] :] = 0.0
