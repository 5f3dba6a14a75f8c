"""Calibration of the graph primitives (planner/graph/calibrate.py): the fit on the cost
model's own terms, the rates each model term reads, and a real quick calibration."""

from __future__ import annotations

import numpy as np
import pytest

from znni.model.network import LayerShape
from znni.planner.graph import calibrate as cg
from znni.planner.graph.search import openvino_seconds, other_seconds
from znni.planner.graph.winograd_costs import winograd_seconds, winograd_terms
from znni.planner.machine import DEFAULT_CPU_RATES, MachineProfile


def _profile(**rates: float) -> MachineProfile:
    return MachineProfile(name="t", cores=2, memory_bytes=2**34,
                          cpu_rates={**DEFAULT_CPU_RATES, **rates})


def _layer(cin: int, cout: int, side: int) -> LayerShape:
    return LayerShape(0, "conv", 1, cin, (side + 2,) * 3, 1, cout, (side,) * 3, (3, 3, 3))


def test_fit_recovers_known_multipliers_of_two_terms() -> None:
    """Rows made from terms scaled by (1.7, 0.6) plus a fixed part: the fit finds both."""
    rows = []
    for gemm_s, moved_s, fixed_s in ((1.0, 0.2, 0.01), (0.3, 0.9, 0.02), (2.0, 2.0, 0.0),
                                     (0.05, 0.4, 0.03)):
        rows.append(((gemm_s, moved_s), fixed_s, 1.7 * gemm_s + 0.6 * moved_s + fixed_s))
    assert cg.relative_fit(rows) == pytest.approx((1.7, 0.6), rel=1e-6)


def test_fit_keeps_a_term_it_cannot_see() -> None:
    """A term whose best multiplier is negative (noise) keeps 1; the other is refitted."""
    rows = [((1.0, 0.01), 0.0, 2.0), ((2.0, 0.02), 0.0, 4.0), ((0.5, 0.3), 0.0, 0.9)]
    m = cg.relative_fit(rows)
    assert m[1] == 1.0 and m[0] == pytest.approx(1.75, rel=0.1)


def test_each_model_term_reads_its_own_rate() -> None:
    base = _profile()
    layer = _layer(16, 16, 32)
    gemm_s, moved_s, fixed_s = winograd_terms(layer, base)
    assert gemm_s + moved_s + fixed_s == pytest.approx(winograd_seconds(layer, base))
    faster_gemm = _profile(winograd_flops_per_s=2 * DEFAULT_CPU_RATES["winograd_flops_per_s"])
    faster_moves = _profile(winograd_bytes_per_s=2 * DEFAULT_CPU_RATES["winograd_bytes_per_s"])
    assert winograd_terms(layer, faster_gemm)[0] == pytest.approx(gemm_s / 2)
    assert winograd_terms(layer, faster_moves)[1] == pytest.approx(moved_s / 2)
    ov = _profile(openvino_flops_per_s=2 * DEFAULT_CPU_RATES["openvino_flops_per_s"])
    assert openvino_seconds(layer, ov) < openvino_seconds(layer, base)

    rng = np.random.default_rng(0)
    graph, _ = cg._strided_node("conv", 8, 16, 32, rng=rng)
    node = graph.nodes[0]
    fast = _profile(graph_gemm_flops_per_s=4 * DEFAULT_CPU_RATES["graph_gemm_flops_per_s"])
    fast_direct = _profile(direct_flops_per_s=4 * DEFAULT_CPU_RATES["direct_flops_per_s"])
    assert other_seconds(graph, node, fast) < other_seconds(graph, node, base)
    assert other_seconds(graph, node, fast_direct) == other_seconds(graph, node, base)


def test_shipped_profiles_keep_their_predictions() -> None:
    """The shipped profiles name the new rates at the rates the terms read before (memory
    and direct), so their plans do not change."""
    for name in ("ci-2core", "h100-host", "znni-paper"):
        rates = MachineProfile.load(name).cpu_rates
        assert rates["winograd_bytes_per_s"] == rates["memory_bytes_per_s"]
        assert rates["norm_bytes_per_s"] == rates["memory_bytes_per_s"]
        assert rates["graph_gemm_flops_per_s"] == rates["direct_flops_per_s"]


def test_quick_graph_calibration_on_this_machine() -> None:
    """Real primitives at small shapes: every fitted rate is positive and finite, and the
    rows it fits carry real (positive) times and model terms."""
    base = _profile()
    rates = cg.graph_rates(base, quick=True)
    keys = ("winograd_flops_per_s", "winograd_bytes_per_s", "norm_bytes_per_s",
            "graph_gemm_flops_per_s")
    assert all(np.isfinite(rates[k]) and rates[k] > 0 for k in keys)
    assert rates["openvino_flops_per_s"] == base.cpu_rates["openvino_flops_per_s"]  # not quick
    rows = cg.graph_gemm_rows(base, cg.QUICK_GRAPH_GEMM_SHAPES)
    assert len(rows) == 2 and all(t > 0 and terms[0] > 0 and fixed > 0
                                  for terms, fixed, t in rows)


def test_an_openvino_that_does_not_import_keeps_its_default_rate(monkeypatch, caplog) -> None:
    """OpenVINO found but broken (its import fails): the calibration still finishes, keeps
    OpenVINO's default rate and says why."""
    import sys

    from znni.planner.graph import search as graph_search

    if not graph_search.openvino_ready():
        pytest.skip("needs the openvino package installed")
    monkeypatch.setitem(sys.modules, "openvino", None)  # `import openvino` raises ImportError
    for name in ("WINOGRAD_SHAPES", "NORM_SHAPES", "GRAPH_GEMM_SHAPES"):
        monkeypatch.setattr(cg, name, getattr(cg, "QUICK_" + name))
    base = _profile()
    with caplog.at_level("WARNING", logger="znni.planner.graph.calibrate"):
        rates = cg.graph_rates(base)
    assert rates["openvino_flops_per_s"] == base.cpu_rates["openvino_flops_per_s"]
    assert "OpenVINO's conv could not be calibrated" in caplog.text
    assert all(np.isfinite(v) and v > 0 for v in rates.values())
