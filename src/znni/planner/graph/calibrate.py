"""Calibration of the graph primitives: Winograd, OpenVINO's conv, instance norm, and
graph_ops' strided and transposed convs.

Their rates had been fitted once, on the AMD EPYC host of the CI kind (machine.py), and
on another CPU they were far off: on an Intel Xeon (AVX-512 FP16) host of the same kind,
Winograd F(4,3) ran 1.3-2.1x its modelled time on eleven U-Net layers, the instance norm
1.1-1.6x, and the graph planner's BasicUNet, UNet and valid U-Net windows took 1.2-1.8x
their predictions (2026-11-24), while OpenVINO's conv, 1.3-2x faster than our Winograd
there, was costed as if slower, and graph_ops' strided and transposed convs, costed at the
direct conv's fitted GEMM rate (276 GFLOP/s there: that fit puts the conv's time in its
gather term), at half their time. So `calibrate.calibrated_profile`, when a graph model
is planned on this machine, also runs each of them at U-Net layer shapes through the real
primitives (OpenVINO's conv where it is installed), and relative least squares on the cost
model's own terms (winograd_costs.winograd_terms, openvino_costs.openvino_terms, the norm's
traffic as graph/search.other_seconds counts it) scales their rates; the constants of
those terms (passes, factors, call costs) stay as fitted.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from znni.model.network import FLOAT_BYTES, LayerShape
from znni.planner.fitting import relative_multipliers
from znni.planner.machine import MachineProfile
from znni.primitives.base import Backend

if TYPE_CHECKING:  # imported where a calibration runs
    from znni.model.graph import Graph

log = logging.getLogger(__name__)

# (Cin, Cout, output side): the levels of BasicUNet's and the valid U-Net's windows
WINOGRAD_SHAPES = ((16, 16, 48), (32, 16, 64), (32, 32, 32), (64, 64, 16), (128, 128, 8),
                   (16, 16, 80))
OPENVINO_SHAPES = ((16, 16, 48), (32, 32, 32), (64, 64, 16), (16, 16, 80))
NORM_SHAPES = ((16, 48), (32, 32), (16, 80), (64, 16))  # (channels, side)
# (op, Cin, Cout, input side) of 3^3 stride-2 convs with pads 1: MONAI UNet's downsamplings
# (phase-split convs) and upsamplings (scatter transposed convs, output padding 1)
GRAPH_GEMM_SHAPES = (("conv", 16, 32, 64), ("conv", 32, 64, 32), ("conv", 64, 128, 16),
                     ("conv_transpose", 192, 32, 8), ("conv_transpose", 64, 16, 16),
                     ("conv_transpose", 32, 2, 32))
QUICK_GRAPH_GEMM_SHAPES = (("conv", 4, 8, 16), ("conv_transpose", 8, 4, 8))
QUICK_WINOGRAD_SHAPES = ((8, 8, 16), (16, 16, 8))
QUICK_NORM_SHAPES = ((8, 16), (16, 8))
REPEATS = 3  # each timed this many times after a warm-up run; the median counts

# one measurement: the model's terms whose rates are fitted, its fixed seconds, measured s
Row = tuple[tuple[float, ...], float, float]
ConvCase = tuple[int, int, int]  # (Cin, Cout, output side) of a 3^3 conv
GemmCase = tuple[str, int, int, int]  # (op, Cin, Cout, input side)


GRAPH_RATE_KEYS = ("winograd_flops_per_s", "winograd_bytes_per_s", "norm_bytes_per_s",
                   "graph_gemm_flops_per_s")


def graph_rates(profile: MachineProfile, quick: bool = False, *,
                openvino: bool = True) -> dict[str, float]:
    """`profile`'s rates with the graph primitives' fitted on this machine: GRAPH_RATE_KEYS,
    and openvino_flops_per_s where `openvino` and OpenVINO is installed (not in a quick
    calibration: compiling takes seconds)."""
    from znni.primitives.backends import make_backend

    backend = make_backend("cpu", spectra_cache_bytes=1)
    rates = dict(profile.cpu_rates)
    try:
        rows = winograd_rows(backend, profile, QUICK_WINOGRAD_SHAPES if quick else WINOGRAD_SHAPES)
        flops_m, bytes_m = relative_fit(rows)
        rates["winograd_flops_per_s"] /= flops_m
        rates["winograd_bytes_per_s"] /= bytes_m
        (norm_m,) = relative_fit(norm_rows(profile, QUICK_NORM_SHAPES if quick else NORM_SHAPES))
        rates["norm_bytes_per_s"] /= norm_m
        gemm_shapes = QUICK_GRAPH_GEMM_SHAPES if quick else GRAPH_GEMM_SHAPES
        (gemm_m,) = relative_fit(graph_gemm_rows(profile, gemm_shapes))
        rates["graph_gemm_flops_per_s"] /= gemm_m
    finally:
        close = getattr(backend, "close", None)
        if close is not None:
            close()
    if openvino and not quick:
        rates.update(openvino_rates(profile))
    return rates


def openvino_rates(profile: MachineProfile) -> dict[str, float]:
    """{"openvino_flops_per_s": fitted} where OpenVINO is installed and works, else {}."""
    from znni.planner.graph.openvino_costs import openvino_ready
    from znni.primitives.backends import make_backend

    if not openvino_ready():
        return {}
    backend = make_backend("cpu", spectra_cache_bytes=1)
    try:
        (ov_m,) = relative_fit(openvino_rows(backend, profile, OPENVINO_SHAPES))
        return {"openvino_flops_per_s": profile.rate("openvino_flops_per_s") / ov_m}
    except (ValueError, RuntimeError) as e:  # installed but not working here
        log.warning("OpenVINO's conv could not be calibrated (%s); its default "
                    "rate is kept", e)
        return {}
    finally:
        close = getattr(backend, "close", None)
        if close is not None:
            close()


def int8_rates(shapes: Sequence[ConvCase] = OPENVINO_SHAPES) -> dict[str, float]:
    """{"openvino_int8_speedup": the median of fp32 / int8 seconds} of one OpenVINO conv per
    shape (primitives/cpu/openvino_quantized_conv), or {} where OpenVINO is missing, fails,
    or does not run the quantized conv in 8 bits here (the default is kept)."""
    from znni.planner.graph.openvino_costs import openvino_ready
    from znni.primitives.cpu.openvino_quantized_conv import compiled_conv

    if not openvino_ready():
        return {}
    ratios = []
    try:
        for cin, cout, side in shapes:
            fp32, _ = compiled_conv(cin, cout, side, int8=False)
            int8, precision = compiled_conv(cin, cout, side, int8=True)
            if precision not in ("u8", "i8"):
                log.warning("OpenVINO ran the quantized conv in %s here; int8 keeps the "
                            "default speed-up", precision)
                return {}
            ratios.append(_median_s(fp32) / _median_s(int8))
    except (ValueError, RuntimeError) as e:
        log.warning("OpenVINO's int8 conv could not be calibrated (%s); its default "
                    "speed-up is kept", e)
        return {}
    return {"openvino_int8_speedup": statistics.median(ratios)}


def relative_fit(rows: list[Row]) -> tuple[float, ...]:
    """Multipliers m >= 0 of the terms with  sum_j m_j term_j + fixed = measured  in relative
    least squares; a term whose multiplier comes out below 0.05 keeps multiplier 1 and the
    others are refitted without it (what calibrate.fit_rates does for the layer primitives)."""
    a = np.array([[term / t for term in terms] for terms, _, t in rows])  # (rows, terms)
    rhs = np.array([1.0 - fixed / t for _, fixed, t in rows])
    return tuple(float(m) for m in relative_multipliers(a, rhs))


def _median_s(fn: Callable[[], object]) -> float:
    fn()  # warm: kernel transforms, compiled layers, workspaces
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _conv_case(
    cin: int, cout: int, side: int, rng: np.random.Generator
) -> tuple[LayerShape, np.ndarray, np.ndarray, np.ndarray]:
    """(layer shape, input, weight, bias) of a 3^3 conv with `side`^3 outputs."""
    n = side + 2
    x = rng.standard_normal((1, cin, n, n, n), dtype=np.float32)  # (N, C, Z, Y, X)
    w = (rng.standard_normal((cout, cin, 3, 3, 3)) / np.sqrt(27 * cin)).astype(np.float32)
    layer = LayerShape(0, "conv", 1, cin, (n, n, n), 1, cout, (side,) * 3, (3, 3, 3))
    return layer, x, w, np.zeros(cout, np.float32)


def conv_rows(backend: Backend, profile: MachineProfile, shapes: Sequence[ConvCase], *,
              primitive: str,
              terms: Callable[[LayerShape], tuple[tuple[float, ...], float]]) -> list[Row]:
    """A 3^3 conv per (Cin, Cout, side) by `primitive`, against `terms`(layer): its model's
    (fitted terms, fixed seconds)."""
    rng = np.random.default_rng(0)
    rows: list[Row] = []
    for cin, cout, side in shapes:
        layer, x, w, b = _conv_case(cin, cout, side, rng)
        seconds = _median_s(partial(backend.conv3d, x, w, b, None, primitive))
        fitted, fixed_s = terms(layer)
        rows.append((fitted, fixed_s, seconds))
    return rows


def winograd_rows(backend: Backend, profile: MachineProfile,
                  shapes: Sequence[ConvCase]) -> list[Row]:
    from znni.planner.graph.winograd_costs import winograd_terms

    def terms(layer: LayerShape) -> tuple[tuple[float, ...], float]:
        gemm_s, moved_s, fixed_s = winograd_terms(layer, profile)
        return (gemm_s, moved_s), fixed_s

    return conv_rows(backend, profile, shapes, primitive="winograd", terms=terms)


def openvino_rows(backend: Backend, profile: MachineProfile,
                  shapes: Sequence[ConvCase]) -> list[Row]:
    from znni.planner.graph.openvino_costs import openvino_terms

    def terms(layer: LayerShape) -> tuple[tuple[float, ...], float]:
        flops_s, rest_s = openvino_terms(layer, profile)
        return (flops_s,), rest_s

    return conv_rows(backend, profile, shapes, primitive="openvino", terms=terms)


def norm_rows(profile: MachineProfile, shapes: Sequence[tuple[int, int]]) -> list[Row]:
    """Instance norm in place, as a window runs it (engine/graph_forward.INPLACE)."""
    from znni.planner.graph.search import NODE_OVERHEAD_S, OP_TRAFFIC
    from znni.primitives.cpu import graph_ops

    reads, writes, _, call_s = OP_TRAFFIC["instance_norm"]
    rng = np.random.default_rng(0)
    rows: list[Row] = []
    for c, side in shapes:
        x = rng.standard_normal((1, c, side, side, side), dtype=np.float32)  # (N, C, Z, Y, X)
        scale, bias = np.ones(c, np.float32), np.zeros(c, np.float32)
        seconds = _median_s(partial(graph_ops.instance_norm, x, scale, bias, 1e-5, out=x))
        moved_bytes = (reads + writes) * x.size * FLOAT_BYTES
        norm_s = moved_bytes / profile.cores / profile.rate("norm_bytes_per_s")
        rows.append(((norm_s,), call_s + NODE_OVERHEAD_S, seconds))
    return rows


def _strided_node(op: str, cin: int, cout: int, side: int, *,
                  rng: np.random.Generator) -> tuple[Graph, np.ndarray]:
    """(one-node graph, input) of a 3^3 stride-2 conv or transposed conv with pads 1."""
    from znni.model.graph import Graph, Node

    shape = (cout, cin, 3, 3, 3) if op == "conv" else (cin, cout, 3, 3, 3)
    weight = (rng.standard_normal(shape) / np.sqrt(27 * cin)).astype(np.float32)
    params = {"weight": weight, "bias": np.zeros(cout, np.float32), "strides": (2, 2, 2),
              "pads": (1,) * 6, "dilations": (1, 1, 1), "group": 1}
    out = (side + 1) // 2 if op == "conv" else 2 * side
    if op == "conv_transpose":
        params["output_padding"] = (1, 1, 1)
    node = Node("calibration", op, ("x",), ("y",), params)
    graph = Graph("calibration", "x", cin, (side,) * 3, (node,), "y", cout, (out,) * 3, "",
                  shapes={"x": (1, cin, side, side, side), "y": (1, cout, out, out, out)})
    x = rng.standard_normal((1, cin, side, side, side), dtype=np.float32)  # (N, C, Z, Y, X)
    return graph, x


def graph_gemm_rows(profile: MachineProfile, shapes: Sequence[GemmCase]) -> list[Row]:
    """graph_ops' phase-split strided convs and scatter transposed convs, as a window runs
    them (engine/graph_forward); the fitted term is their GEMMs (graph/op_costs)."""
    from znni.planner.graph.op_costs import scatter_transpose_work, strided_conv_work
    from znni.planner.graph.search import other_seconds
    from znni.primitives.cpu import graph_ops

    rng = np.random.default_rng(0)
    gemm_rate = profile.rate("graph_gemm_flops_per_s")
    rows: list[Row] = []
    for op, cin, cout, side in shapes:
        graph, x = _strided_node(op, cin, cout, side, rng=rng)
        node, p = graph.nodes[0], graph.nodes[0].params
        if op == "conv":
            seconds = _median_s(partial(graph_ops.conv3d, x, p["weight"], p["bias"],
                                        strides=p["strides"], pads=p["pads"]))
            work = strided_conv_work(graph, node)
        else:
            seconds = _median_s(partial(graph_ops.conv_transpose3d, x, p["weight"], p["bias"],
                                        strides=p["strides"], pads=p["pads"],
                                        output_padding=p["output_padding"]))
            work = scatter_transpose_work(graph, node)
        gemm_s = work.direct_flops / gemm_rate
        rows.append(((gemm_s,), other_seconds(graph, node, profile) - gemm_s, seconds))
    return rows
