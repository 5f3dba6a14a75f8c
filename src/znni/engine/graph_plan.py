"""What a run of an ONNX graph model will do: its dense-output mode and why, its grid,
and the window (windowed) or tile (exact) chosen within the memory budget."""

from __future__ import annotations

from typing import Any

from znni.engine.exact_graph import choose_tile, tile_output
from znni.engine.layout import PLAN_FRACTION, memory_budget_bytes
from znni.engine.windowed import WORKSPACE_FACTOR, choose_window
from znni.model.graph import window_dependence
from znni.model.onnx_model import OnnxModel

UNBOUNDED = (10**6, 10**6, 10**6)  # no region: the window is bounded by memory only
EXACT_REASON = (
    "window-independent: valid convolutions and pools, crops, upsampling and merges; "
    "tiled on its downsampling grid, equal to one run over the border-extended volume"
)


def graph_plan(
    model: OnnxModel, limit_bytes: int | None, region: tuple[int, int, int] = UNBOUNDED
) -> dict[str, Any]:
    """A JSON-ready summary (the `znni plan` and POST /v1/plan body for graph models)."""
    budget = int(memory_budget_bytes(limit_bytes) * PLAN_FRACTION)
    common = {
        "network": model.name,
        "in_channels": model.in_channels,
        "out_channels": model.out_channels,
        "size_factor": list(model.size_factor),
        "min_window": list(model.min_window),
        "fixed_window": list(model.fixed_window) if model.fixed_window else None,
        "memory_budget_bytes": budget,
    }
    if model.mode == "exact":
        tile = choose_tile(model, budget, region)
        return {
            "mode": "exact",
            "reason": EXACT_REASON,
            **common,
            "context": list(model.context),
            "window": list(tile),
            "tile_output": list(tile_output(model, tile)),
            "window_peak_bytes": WORKSPACE_FACTOR * model.graph(tile).peak_tensor_bytes(),
        }
    window = choose_window(model, budget, region)
    graph = model.graph(window)
    reason = window_dependence(graph) or "its output has the window's own size"
    return {
        "mode": "windowed",
        "reason": reason,
        **common,
        "window": list(window),
        "window_peak_bytes": WORKSPACE_FACTOR * graph.peak_tensor_bytes(),
    }
