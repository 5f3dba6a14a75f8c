"""Shape-only builds of the ZNNi benchmark networks (the ZNNi paper's table) for planner tests."""

from __future__ import annotations

import tracemalloc
from functools import cache
from typing import Any

import numpy as np

from znni.model.network import Network, network_shapes_only
from znni.planner.machine import MachineProfile
from znni.planner.plan import Plan
from znni.planner.search import make_plan

# name -> (layer pattern, conv kernels); 1 input channel, 80 maps, 3 outputs, ReLU, pools 2^3
ZNNI_TABLE = {
    "n337": ("CPCPCPCCCC", (2, 3, 3, 3, 3, 3, 3)),
    "n537": ("CPCPCPCCCC", (4, 5, 5, 5, 5, 5, 5)),
    "n726": ("CPCPCCCC", (6, 7, 7, 7, 7, 7)),
    "n926": ("CPCPCCCC", (8, 9, 9, 9, 9, 9)),
}
ZNNI_FOV = {"n337": 85, "n537": 163, "n726": 117, "n926": 155}


def znni_spec(name: str, maps: int = 80) -> dict[str, Any]:
    pattern, kernels = ZNNI_TABLE[name]
    n_conv = pattern.count("C")
    layers: list[dict[str, Any]] = []
    k = iter(kernels)
    done = 0
    for ch in pattern:
        if ch == "C":
            done += 1
            out = 3 if done == n_conv else maps
            layers += [{"kind": "conv", "out_channels": out, "kernel": next(k)}, {"kind": "relu"}]
        else:
            layers.append({"kind": "maxpool", "window": [2, 2, 2]})
    return {"name": name, "in_channels": 1, "layers": layers}


def znni_network(name: str) -> Network:
    return network_shapes_only(znni_spec(name), name)


@cache
def paper_plan(name: str) -> Plan:
    """make_plan of the ZNNi network `name` on the paper's machine profile (all devices),
    searched once per session and shared: a Plan is frozen. About 3 s each."""
    return make_plan(znni_network(name), machine=MachineProfile.load("znni-paper"))


def traced_peak_bytes(net: Network, backend: Any, prims: list[str | None],
                      size: tuple[int, int, int], seed: int, patches: int = 2) -> int:
    """Peak bytes tracemalloc sees over `patches` dense patches of `net` with random weights
    (a second starts with warm caches, like a real sweep); closes `backend`."""
    from znni.primitives.dense import dense_forward

    rng = np.random.default_rng(seed)
    ops = [
        type(op)(rng.standard_normal(op.weight.shape, dtype=np.float32),
                 np.zeros(op.out_channels, np.float32)) if hasattr(op, "weight") else op
        for op in net.ops
    ]
    tracemalloc.start()
    try:
        for _ in range(patches):
            x = rng.standard_normal((1, net.in_channels, *size), dtype=np.float32)
            y = dense_forward(ops, x, backend, prims)
            del x, y
        _, measured = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        backend.close()
    return measured
