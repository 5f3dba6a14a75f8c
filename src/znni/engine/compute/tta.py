"""Test-time flips (`--tta flips[:AXES]`): nnU-Net's mirroring, before blending.

Every window's (or exact tile's, or MPF patch's) prediction is the mean over the input
flipped along every subset of the chosen spatial axes: flip the input, run, flip the
output back. A flipped MPF patch through valid convolutions and strided pools is the
flipped dense output of its windows, each window's pools aligned to its own flipped
start, so flipping whole patches is exact (docs/design.md, "Test-time flips"). The
flipped copies of one window run as consecutive items of the batch (window-major), so
the planner's batch, and so the memory cap, is unchanged: the cost is 2^k forward
passes per window, which the plans count (`flipped_plan`, graph_choice's `flips`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from math import prod
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from znni.model.network import Network
    from znni.planner.plan import Plan

AXIS_NAMES = "zyx"
TTA_HELP = "flips (all 8 combinations of z, y, x) or flips:AXES such as flips:zx"


@dataclass(frozen=True)
class FlipSpec:
    """The spatial axes flipped (0 z, 1 y, 2 x, sorted); picklable, sent to workers."""

    axes: tuple[int, ...] = (0, 1, 2)

    @classmethod
    def parse(cls, text: str | None) -> FlipSpec | None:
        """`flips` or `flips:AXES` (a subset of z, y, x); None for None. ValueError of one
        sentence naming the value otherwise."""
        if text is None:
            return None
        name, sep, letters = str(text).partition(":")
        bad = (name != "flips" or (sep and not letters)
               or any(c not in AXIS_NAMES for c in letters) or len(set(letters)) != len(letters))
        if bad:
            raise ValueError(f"--tta {text!r} is not one of: {TTA_HELP}")
        if not sep:
            return cls()
        return cls(tuple(sorted(AXIS_NAMES.index(c) for c in letters)))

    @property
    def text(self) -> str:
        """The canonical option value (`flips` for all three axes), as recorded."""
        if self.axes == (0, 1, 2):
            return "flips"
        return "flips:" + "".join(AXIS_NAMES[a] for a in self.axes)

    @property
    def count(self) -> int:
        """Forward passes per window: 2^k."""
        return 2 ** len(self.axes)

    def variants(self) -> tuple[tuple[int, ...], ...]:
        """Every subset of the axes (spatial indices), the identity first."""
        return tuple(c for k in range(len(self.axes) + 1)
                     for c in itertools.combinations(self.axes, k))


def canonical(text: str | None) -> str | None:
    """The recorded form of a --tta value (checked), None for none."""
    spec = FlipSpec.parse(text)
    return None if spec is None else spec.text


def flip_count(text: str | None) -> int:
    """Forward passes per window for a --tta value: 1 without flips."""
    spec = FlipSpec.parse(text)
    return 1 if spec is None else spec.count


def _flip(a: np.ndarray, variant: tuple[int, ...]) -> np.ndarray:
    """`a` (..., Z, Y, X) flipped on the spatial axes of `variant` (a view)."""
    lead = a.ndim - 3
    return np.flip(a, tuple(lead + v for v in variant)) if variant else a


def flip_batch(x: np.ndarray, spec: FlipSpec) -> np.ndarray:
    """(B, C, Z, Y, X) -> (B * V, C, Z, Y, X): each window's V flipped copies together."""
    variants = spec.variants()
    return np.stack([_flip(x[b], v) for b in range(x.shape[0]) for v in variants])


def unflip_mean(y: np.ndarray, spec: FlipSpec) -> np.ndarray:
    """(B * V, Cout, Z, Y, X) outputs of `flip_batch`'s inputs -> (B, Cout, Z, Y, X) means:
    each flipped back and summed in float32 in the variants' order, then divided by V."""
    variants = spec.variants()
    n = len(variants)
    out = np.empty((y.shape[0] // n, *y.shape[1:]), np.float32)  # (B, Cout, Z, Y, X)
    for b in range(out.shape[0]):
        out[b] = _flip(y[b * n], variants[0])
        for k in range(1, n):
            out[b] += _flip(y[b * n + k], variants[k])
    out /= np.float32(n)
    return out


def tta_forward(forward: Callable[[np.ndarray], np.ndarray], x: np.ndarray, spec: FlipSpec,
                chunk: int) -> np.ndarray:
    """(B, C, *W) -> (B, Cout, *W'): `forward` over the B * V flipped inputs, at most `chunk`
    at a time (the planner's batch: its memory), each output flipped back into its
    window's float32 sum as it comes (the same order as unflip_mean), then the means."""
    variants = spec.variants()
    n = len(variants)
    items = [(b, k) for b in range(x.shape[0]) for k in range(n)]
    out: np.ndarray | None = None
    for i in range(0, len(items), max(1, chunk)):
        part = items[i: i + max(1, chunk)]
        ys = forward(np.stack([_flip(x[b], variants[k]) for b, k in part]))  # (b, Cout, *W')
        if out is None:
            out = np.empty((x.shape[0], *ys.shape[1:]), np.float32)  # (B, Cout, *W')
        for (b, k), y in zip(part, ys, strict=True):
            if k == 0:
                out[b] = _flip(y, variants[k])
            else:
                out[b] += _flip(y, variants[k])
    assert out is not None
    out /= np.float32(n)
    return out


def flipped_items(items: Iterable[np.ndarray], spec: FlipSpec) -> Iterator[np.ndarray]:
    """Each (1, C, *S) item followed by its flipped copies (MPF patches: one stream)."""
    variants = spec.variants()
    for x in items:
        for v in variants:
            yield np.ascontiguousarray(_flip(x, v))


def unflipped_means(outputs: Iterable[np.ndarray], spec: FlipSpec) -> Iterator[np.ndarray]:
    """The (Cout, *S') outputs of `flipped_items`, V at a time -> each item's mean."""
    variants = spec.variants()
    n, k = len(variants), 0
    acc: np.ndarray | None = None
    for y in outputs:
        back = _flip(y, variants[k])
        acc = np.array(back, np.float32) if acc is None else acc + back  # None: k == 0
        k += 1
        if k == n:
            yield acc / np.float32(n)
            k, acc = 0, None


def flipped_plan(plan: Plan, count: int, network: Network | None = None) -> Plan:
    """A sequential network's plan with `count` flipped passes per patch: its patch and
    layer times times `count`, its throughput (and its alternatives') divided. The flipped
    copies stream through the planned batch; beside it the peak counts the batch's flipped
    copies before they are stacked and one patch's float32 mean (workers/mpf.py), given
    the `network`."""
    if count == 1:
        return plan
    layers = tuple(replace(layer, predicted_s=layer.predicted_s * count)
                   for layer in plan.layers)
    extra = 0 if network is None else 4 * (
        plan.batch * network.in_channels * prod(plan.input_size)
        + network.out_channels * prod(plan.output_size))
    alternatives = tuple(replace(a, predicted_voxels_per_second=a.predicted_voxels_per_second
                                 / count) for a in plan.alternatives)
    return replace(plan, predicted_patch_s=plan.predicted_patch_s * count,
                   predicted_voxels_per_second=plan.predicted_voxels_per_second / count,
                   layers=layers, peak_bytes=plan.peak_bytes + extra, alternatives=alternatives)


def flip_back_into(xp: Any, total: Any, y: Any, variant: tuple[int, ...], first: bool,
                   last: bool, count: int) -> None:
    """One flipped copy's (Cout, Z, Y, X) output `y` flipped back into its window's float32
    `total` with `xp` (numpy, or CuPy on the device): set by the first copy, added by the
    others, divided by `count` after the last; the host's order (tta_forward)."""
    back = xp.flip(y, tuple(1 + v for v in variant)) if variant else y
    if first:
        total[...] = back
    else:
        total += back
    if last:
        total /= xp.float32(count)


def tta_parts(text: str | None) -> dict[str, str]:
    """The ledger fingerprint's part for a --tta value (engine/io/ledger.py): its recorded
    form, or nothing without flips, so earlier outputs' ledgers still match."""
    return {} if text is None else {"tta": str(canonical(text))}
