"""Fresh mappings: a sequential pass's allocations of FRESH_ABOVE_BYTES or more are mapped
afresh every pass (glibc unmaps them on free), and the planner charges their page faults
to the layer that makes them, at the machine's fresh_page_bytes_per_s."""

from __future__ import annotations

from dataclasses import replace

import pytest

from znni.model.network import network_shapes_only
from znni.planner.hostsim import FRESH_ABOVE_BYTES, replay_pass
from znni.planner.machine import MachineProfile
from znni.planner.search import evaluate
from znni.primitives.cpu.heap import SEQUENTIAL_MMAP_THRESHOLD_BYTES

MiB = 2**20


def _net(out_channels: int, kernel: list[int]):  # type: ignore[no-untyped-def]
    return network_shapes_only({"name": "t", "in_channels": 1, "layers": [
        {"kind": "conv", "out_channels": out_channels, "kernel": kernel},
        {"kind": "maxpool", "window": [2, 2, 2]},
        {"kind": "conv", "out_channels": 3, "kernel": [1, 1, 1]}]})


def test_the_threshold_is_the_sequential_passes_mmap_threshold() -> None:
    assert FRESH_ABOVE_BYTES == SEQUENTIAL_MMAP_THRESHOLD_BYTES == 64 * MiB


def test_outputs_at_or_above_the_threshold_are_fresh_each_pass_and_small_ones_are_not() -> None:
    net = _net(16, [3, 1, 3])
    shapes = net.layer_shapes(net.input_size_for((100, 110, 96)))
    conv, pool, last = shapes[0], shapes[1], shapes[2]
    assert conv.out_bytes >= 64 * MiB and pool.out_bytes >= 64 * MiB  # hand-sized
    assert last.out_bytes < 64 * MiB
    replay = replay_pass(shapes, ["direct", None, "direct"], threads=2)
    # the direct conv's per-worker column buffers are a few MiB: only its output is fresh
    assert replay.layer_fresh_bytes == [conv.out_bytes, pool.out_bytes, 0]
    # the same counts on every patch, not only the first
    one = replay_pass(shapes, ["direct", None, "direct"], threads=2, patches=1)
    assert one.layer_fresh_bytes == replay.layer_fresh_bytes


def test_fft_workspaces_reused_from_the_lru_are_not_fresh_on_later_patches() -> None:
    net = _net(8, [3, 3, 3])
    shapes = net.layer_shapes(net.input_size_for((96, 96, 96)))
    prims: list[str | None] = ["fft-recompute", None, "direct"]
    kept = replay_pass(shapes, prims, threads=2, workspace_bytes=2**34, patches=2)
    first = replay_pass(shapes, prims, threads=2, workspace_bytes=2**34, patches=1)
    dropped = replay_pass(shapes, prims, threads=2, workspace_bytes=0, patches=2)
    # the first patch maps its big transform workspaces; a later one takes them from the
    # LRU when it may keep them, and maps them again when it may not
    out = shapes[0].out_bytes
    assert out < FRESH_ABOVE_BYTES  # hand-sized: the output comes from the heap
    assert first.layer_fresh_bytes[0] >= FRESH_ABOVE_BYTES
    assert kept.layer_fresh_bytes[0] == 0
    assert dropped.layer_fresh_bytes[0] == first.layer_fresh_bytes[0]


def test_the_plan_charges_fresh_pages_at_the_machines_rate() -> None:
    net = _net(16, [3, 1, 3])
    base = MachineProfile.load("ci-2core")
    fast = replace(base, cpu_rates={**base.cpu_rates, "fresh_page_bytes_per_s": 1e18})
    slow = replace(base, cpu_rates={**base.cpu_rates, "fresh_page_bytes_per_s": 1e8})
    shapes = net.layer_shapes(net.input_size_for((100, 110, 96)))
    limit = 8 * 2**30
    (p_fast,) = evaluate(net, fast, "cpu", shapes, host_bytes=limit, gpu_bytes=0)
    (p_slow,) = evaluate(net, slow, "cpu", shapes, host_bytes=limit, gpu_bytes=0)
    assert p_fast.primitives == p_slow.primitives
    replay = replay_pass(shapes, list(p_slow.primitives), threads=base.cores,
                         workspace_bytes=p_slow.workspace_cache_bytes)
    assert sum(replay.layer_fresh_bytes) >= 2 * FRESH_ABOVE_BYTES
    for lf, ls, fresh in zip(p_fast.layers, p_slow.layers, replay.layer_fresh_bytes,
                             strict=True):
        assert ls.predicted_s - lf.predicted_s == pytest.approx(fresh / 1e8, rel=1e-6)
    assert p_slow.predicted_patch_s - p_fast.predicted_patch_s == pytest.approx(
        sum(replay.layer_fresh_bytes) / 1e8, rel=1e-6)
