"""Host-side planning of a graph op on the device: output shape, memory model, chunks.

A chunk is a range of samples and a range of output channels. `chunk_inputs`
cuts the host inputs and the node's parameters down to what that chunk reads
(numpy views: nothing is copied until the upload); `channel_unit` says how an
op may be cut along channels. Every op is independent across samples; channel
splits follow the op (whole groups for group norm and grouped convs, nothing
for softmax). `workspace_bytes` bounds a kernel's device temporaries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import ceil, prod
from typing import Any

import numpy as np

from znni.primitives.graph_args import (
    MODES,
    NEAREST_MODES,
    PAD_MODES,
    TRANSFORMS,
    choice,
    six,
    triple,
)
from znni.primitives.shapes import conv_out_size, pool_out_size, transpose_out_size

Shape = tuple[int, ...]
POINTWISE = {"relu", "leaky_relu", "prelu", "elu", "selu", "sigmoid", "tanh", "clip", "identity"}
BINARY = {"add", "sub", "mul", "div"}
# temporaries as a multiple of (input + output) bytes, from the kernels in graph_kernels.py
WORKSPACE_FACTOR = {"resize": 3, "softmax": 3, "instance_norm": 3, "group_norm": 3}


@dataclass(frozen=True)
class Unit:
    """How output channels may be cut: chunks of whole `size`-channel groups, or (when
    `within`) parts of one group; size 0 means not at all."""

    size: int
    within: bool = False


def _spatial(p: dict[str, Any], shape: Shape, kind: str) -> Shape:
    """Validated spatial output shape of a conv, transposed conv or pool."""
    x = shape[2:]
    if kind == "conv":
        k, s = p["weight"].shape[2:], triple(p["strides"], "strides", 1)
        d, pads = triple(p["dilations"], "dilations", 1), six(p["pads"])
        out = tuple(conv_out_size(x[i], k[i], s[i], d[i], pads[i], pads[i + 3]) for i in range(3))
    elif kind == "conv_transpose":
        k, s = p["weight"].shape[2:], triple(p["strides"], "strides", 1)
        d, pads = triple(p["dilations"], "dilations", 1), six(p["pads"])
        op = triple(p["output_padding"], "output_padding", 0)
        out = tuple(
            transpose_out_size(x[i], k[i], s[i], d[i], pads[i], pads[i + 3], op[i])
            for i in range(3)
        )
    else:
        k, s = triple(p["kernel"], "kernel", 1), triple(p["strides"], "strides", 1)
        d, pads = triple(p.get("dilations", (1, 1, 1)), "dilations", 1), six(p["pads"])
        if any(max(pads[i], pads[i + 3]) >= d[i] * (k[i] - 1) + 1 for i in range(3)):
            raise ValueError(f"pads {pads} must be smaller than the (dilated) kernel {k}")
        cm = bool(p["ceil_mode"])
        out = tuple(
            pool_out_size(x[i], k[i], s[i], d[i], pads[i], pads[i + 3], cm) for i in range(3)
        )
    if min(out) < 1:
        raise ValueError(f"empty output {out}: input {x}, pads {p.get('pads')}")
    return out


def _groups(p: dict[str, Any], cin: int, w_in: int, transposed: bool) -> int:
    g = int(p["group"])
    if g < 1 or cin % g or (not transposed and p["weight"].shape[0] % g):
        raise ValueError(f"groups={g} must divide Cin={cin} and Cout")
    if (w_in * g if not transposed else w_in) != cin:
        raise ValueError(f"weight of shape {p['weight'].shape} does not fit Cin={cin}")
    return g


def out_shape(op: str, p: dict[str, Any], shapes: Sequence[Shape]) -> Shape:
    """The node's output shape for input shapes `shapes`; ValueError on bad parameters."""
    x = shapes[0]
    if op == "conv":
        _groups(p, x[1], p["weight"].shape[1], False)
        return (x[0], p["weight"].shape[0], *_spatial(p, x, op))
    if op == "conv_transpose":
        g = _groups(p, x[1], p["weight"].shape[0], True)
        return (x[0], p["weight"].shape[1] * g, *_spatial(p, x, op))
    if op in ("maxpool", "avgpool"):
        return (*x[:2], *_spatial(p, x, op))
    if op == "resize":
        choice(p["mode"], "mode", MODES)
        choice(p["coordinate_transformation_mode"], "coordinate_transformation_mode", TRANSFORMS)
        choice(p.get("nearest_mode", "round_prefer_floor"), "nearest_mode", NEAREST_MODES)
        return (*x[:2], *triple(p["size"], "out_size", 1))
    if op == "concat":
        return (x[0], sum(s[1] for s in shapes), *x[2:])
    if op in BINARY:
        other = shapes[1] if len(shapes) > 1 else np.shape(p["constant"])
        return tuple(np.broadcast_shapes(x, other))
    if op == "slice":  # axis 0 is the whole batch (the importer refuses batch slices)
        return (x[0], *(len(range(*s)) for s in p["slices"][1:]))
    if op == "pad":
        choice(p["mode"], "mode", PAD_MODES)
        pads = six(p["pads"], allow_negative=True)
        out = tuple(x[2 + i] + pads[i] + pads[i + 3] for i in range(3))
        if min(min(x[2 + i] - max(0, -pads[i]) - max(0, -pads[i + 3]) for i in range(3)), *out) < 1:
            raise ValueError(f"pads {pads} crop {x[2:]} to nothing")
        return (*x[:2], *out)
    if op == "group_norm" and (int(p["groups"]) < 1 or x[1] % int(p["groups"])):
        raise ValueError(f"num_groups={p['groups']} must be >= 1 and divide C={x[1]}")
    return x


def channel_unit(op: str, p: dict[str, Any], out: Shape) -> Unit:
    """How `op` may be split along its output channels."""
    if op == "softmax":
        return Unit(0)
    if op == "group_norm":
        return Unit(out[1] // int(p["groups"]))
    if op in ("conv", "conv_transpose"):
        return Unit(out[1] // int(p["group"]), within=True)
    return Unit(1)


def channel_ranges(channels: int, unit: Unit, per_chunk: int) -> list[tuple[int, int]] | None:
    """Output channel ranges of at most `per_chunk` channels allowed by `unit`, or None."""
    if per_chunk >= channels:
        return [(0, channels)]
    if unit.size == 0 or (per_chunk < unit.size and not unit.within):
        return None
    if per_chunk >= unit.size:
        step = per_chunk // unit.size * unit.size
        return [(o, min(channels, o + step)) for o in range(0, channels, step)]
    return [
        (o, min(g + unit.size, o + per_chunk))
        for g in range(0, channels, unit.size)
        for o in range(g, g + unit.size, per_chunk)
    ]


def _cut(a: np.ndarray, n: tuple[int, int], c: tuple[int, int]) -> np.ndarray:
    """Samples n and channels c of a 5-D operand, keeping broadcast (size-1) axes whole."""
    a5 = a.reshape((1,) * (5 - a.ndim) + a.shape)
    whole = slice(None)
    return a5[slice(*n) if a5.shape[0] > 1 else whole, slice(*c) if a5.shape[1] > 1 else whole]


def _conv_cut(
    p: dict[str, Any], x: np.ndarray, c: tuple[int, int], transposed: bool
) -> tuple[dict[str, Any], tuple[int, int]]:
    """Parameters and input channels of a (transposed) conv for output channels c."""
    g, w = int(p["group"]), p["weight"]
    cin = x.shape[1]
    cog = w.shape[1] if transposed else w.shape[0] // g
    g0, g1 = c[0] // cog, ceil(c[1] / cog)
    ci = (g0 * cin // g, g1 * cin // g)
    if transposed:
        lo = c[0] - g0 * cog if g1 - g0 == 1 else 0
        hi = lo + (c[1] - c[0]) if g1 - g0 == 1 else cog
        w = w[ci[0] : ci[1], lo:hi]
    else:
        w = w[c[0] : c[1]]
    bias = p.get("bias")
    q = {**p, "weight": w, "group": g1 - g0, "bias": None if bias is None else bias[c[0] : c[1]]}
    return q, ci


def chunk_inputs(
    op: str, p: dict[str, Any], xs: Sequence[np.ndarray], n: tuple[int, int], c: tuple[int, int]
) -> tuple[dict[str, Any], list[np.ndarray]]:
    """(parameters, host input views) of output samples n and output channels c."""
    if op in ("conv", "conv_transpose"):
        q, ci = _conv_cut(p, xs[0], c, op == "conv_transpose")
        return q, [xs[0][n[0] : n[1], ci[0] : ci[1]]]
    if op == "slice":
        sl = [range(*s) for s in p["slices"]]
        rn, rc = range(xs[0].shape[0])[n[0] : n[1]], sl[1][c[0] : c[1]]
        view = xs[0][_as_slice(rn), _as_slice(rc)]
        rest = tuple((0, m, 1) for m in view.shape[:2])
        return {**p, "slices": rest + tuple(p["slices"][2:])}, [view]
    if op == "concat":
        parts, o = [], 0
        for a in xs:
            lo, hi = max(c[0], o), min(c[1], o + a.shape[1])
            if lo < hi:
                parts.append(a[n[0] : n[1], lo - o : hi - o])
            o += a.shape[1]
        return p, parts
    q = dict(p)
    for key in ("scale", "bias", "mean", "var"):
        if q.get(key) is not None and np.size(q[key]) > 1:
            q[key] = np.asarray(q[key]).reshape(-1)[c[0] : c[1]]
    if op == "prelu" and np.size(p["slope"]) > 1:
        q["slope"] = np.asarray(p["slope"]).reshape(-1)[c[0] : c[1]]
    if op == "group_norm":
        q["groups"] = int(p["groups"]) * (c[1] - c[0]) // xs[0].shape[1]
    if op in BINARY and len(xs) == 1:
        q["constant"] = _cut(np.asarray(p["constant"], np.float32), n, c)
    return q, [_cut(a, n, c) for a in xs]


def _as_slice(r: range) -> slice:
    """A range as a slice that indexes the same positions (a negative stop means none)."""
    stop = r.stop if r.stop >= 0 else None
    return slice(r.start, stop, r.step)


def workspace_bytes(
    op: str, p: dict[str, Any], in_bytes: int, out: Shape, shapes: Sequence[Shape]
) -> int:
    """Upper bound on a kernel's device temporaries (its result included)."""
    out_b = prod(out) * 4
    if op == "conv":
        x = shapes[0]
        pads = six(p["pads"])
        padded = x[0] * x[1] * prod(x[2 + i] + pads[i] + pads[i + 3] for i in range(3)) * 4
        return 2 * padded + 3 * out_b
    if op == "conv_transpose":
        x = shapes[0]
        kvol = prod(p["weight"].shape[2:])
        full = out_b + x[0] * out[1] * prod(x[2:]) * 4 * kvol  # crop + overrun bound
        return full + 2 * x[0] * out[1] * prod(x[2:]) * 4 + 2 * out_b
    if op in ("maxpool", "avgpool"):
        x, k, st = shapes[0], triple(p["kernel"], "kernel", 1), p["strides"]
        d, pads = p.get("dilations", (1, 1, 1)), six(p["pads"])
        grown = [x[2 + i] + pads[i] + pads[i + 3] + d[i] * (k[i] - 1) + st[i] for i in range(3)]
        return 3 * x[0] * x[1] * prod(grown) * 4 + 2 * out_b  # padded input, two accumulators
    factor = WORKSPACE_FACTOR.get(op, 2)
    return factor * (in_bytes + out_b)
