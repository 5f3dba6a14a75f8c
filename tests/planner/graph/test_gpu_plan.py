"""The graph planner on the GPU: primitives by rate and capability, the device peak at each
precision, batches and windows within the device cap (costs only: nothing timed here but
the stand-in calibration)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from znni.model.graph import Graph, Node
from znni.planner.graph.gpu_costs import GPU_CONV_PRIMITIVES, conv_costs, gpu_conv_primitives
from znni.planner.graph.gpu_search import (
    device_cap_bytes,
    device_peak,
    plan_graph_gpu,
)
from znni.planner.machine import MachineProfile


def conv_graph(layers: list[tuple[int, int, int, int]], window: int, cin: int = 1) -> Graph:
    """A chain of convs (Cout, kernel, stride, pad) over a `window`^3 input, each
    followed by a ReLU."""
    rng = np.random.default_rng(0)
    nodes, shapes = [], {"x": (1, cin, window, window, window)}
    prev, side, c = "x", window, cin
    for i, (cout, k, stride, pad) in enumerate(layers):
        side = (side + 2 * pad - k) // stride + 1
        params = {"weight": rng.standard_normal((cout, c, k, k, k)).astype(np.float32),
                  "bias": np.zeros(cout, np.float32), "strides": (stride,) * 3,
                  "pads": (pad,) * 6, "dilations": (1, 1, 1), "group": 1}
        nodes.append(Node(f"conv{i}", "conv", (prev,), (f"c{i}",), params))
        nodes.append(Node(f"relu{i}", "relu", (f"c{i}",), (f"r{i}",)))
        shapes[f"c{i}"] = shapes[f"r{i}"] = (1, cout, side, side, side)
        prev, c = f"r{i}", cout
    return Graph("chain", "x", cin, (window,) * 3, tuple(nodes), prev, c, (side,) * 3, "d",
                 shapes)


@pytest.fixture(scope="module")
def h100() -> MachineProfile:
    return MachineProfile.load("h100-host")


def picks(plan) -> dict[str, str]:  # noqa: ANN001
    return plan.primitives


def test_the_planner_names_the_executors_primitives() -> None:
    dispatch = pytest.importorskip("znni.primitives.gpu.conv_dispatch")
    assert GPU_CONV_PRIMITIVES == dispatch.GPU_CONV_PRIMITIVES


def test_large_kernels_go_to_cufft_and_small_ones_to_cudnn(h100) -> None:
    graph = conv_graph([(16, 3, 1, 1), (16, 9, 1, 4), (16, 3, 1, 1)], 48, cin=16)
    plan = plan_graph_gpu(graph, h100, precision="fp32")
    assert picks(plan)["conv0"] == "cudnn" and picks(plan)["conv2"] == "cudnn"
    assert picks(plan)["conv1"].startswith("cufft")
    node = next(n for n in plan.nodes if n.name == "conv1")
    assert [c[0] for c in node.candidates][0] == node.primitive  # fastest first
    assert node.predicted_s == min(c[1] for c in node.candidates)


def test_the_choice_follows_the_rates(h100) -> None:
    graph = conv_graph([(16, 9, 1, 4)], 48, cin=16)
    slow_fft = replace(h100.gpu, fft_flops_per_s=1e9, madd_flops_per_s=1e9)
    plan = plan_graph_gpu(graph, replace(h100, gpus=(slow_fft,)))
    assert picks(plan)["conv0"] == "cudnn"


def test_strided_convs_never_go_to_cufft(h100) -> None:
    graph = conv_graph([(16, 3, 2, 1), (16, 9, 2, 4)], 64, cin=16)
    fast_fft = replace(h100.gpu, fft_flops_per_s=1e20, madd_flops_per_s=1e20,
                       memory_bytes_per_s=1e20)
    plan = plan_graph_gpu(graph, replace(h100, gpus=(fast_fft,)))
    assert set(picks(plan).values()) == {"cudnn"}
    for node in plan.nodes:
        assert not any(c[0].startswith("cufft") for c in node.candidates)


def test_cudnn_is_never_planned_where_it_is_not_installed(h100) -> None:
    no_cudnn = replace(h100, gpus=(replace(h100.gpu, has_cudnn=False),))
    graph = conv_graph([(16, 3, 1, 1), (16, 3, 2, 1)], 48, cin=16)
    plan = plan_graph_gpu(graph, no_cudnn)
    assert picks(plan)["conv1"] == "gemm-loop"  # strided: the loop is all that is left
    assert "cudnn" not in picks(plan).values()
    assert gpu_conv_primitives(graph.nodes[0], no_cudnn.gpu) == ("cufft-keep", "cufft",
                                                                 "gemm-loop")


def test_half_precision_halves_the_tensors_and_speeds_up_cudnn(h100) -> None:
    graph = conv_graph([(32, 3, 1, 1), (32, 3, 1, 1), (32, 3, 1, 1)], 96)
    peaks = {}
    for precision in ("fp32", "tf32", "bf16", "fp16"):
        plan = plan_graph_gpu(graph, h100, precision=precision, batch=2)
        chosen = {i: c for i, n in enumerate(graph.nodes) if n.op == "conv"
                  for c in conv_costs(graph, n, h100.gpu, precision, 2)
                  if c.primitive == plan.primitives[n.name]}
        peaks[precision] = device_peak(graph, chosen, precision, 2, device_cap_bytes(h100))
        assert plan.precision == precision and plan.device == "gpu"
        assert plan.device_peak_bytes == peaks[precision].total_bytes
    assert peaks["fp16"].tensors_bytes * 2 == peaks["fp32"].tensors_bytes
    assert peaks["bf16"].tensors_bytes == peaks["fp16"].tensors_bytes
    assert peaks["tf32"].tensors_bytes == peaks["fp32"].tensors_bytes
    cudnn = {p: conv_costs(graph, graph.nodes[2], h100.gpu, p)[0].seconds
             for p in ("fp32", "tf32", "fp16")}
    assert cudnn["fp16"] < cudnn["tf32"] < cudnn["fp32"]


def test_the_window_time_overlaps_copies_with_compute(h100) -> None:
    graph = conv_graph([(4, 3, 1, 1)], 64)
    plan = plan_graph_gpu(graph, h100, batch=4)
    assert plan.predicted_window_s == pytest.approx(max(plan.compute_s, plan.transfer_s) / 4)
    slow_bus = replace(h100, gpus=(replace(h100.gpu, transfer_bytes_per_s=1e6),))
    slow = plan_graph_gpu(graph, slow_bus, batch=4)
    assert slow.transfer_s > slow.compute_s
    assert slow.predicted_window_s == pytest.approx(slow.transfer_s / 4)


def test_a_tight_cap_gives_up_kept_spectra_then_refuses(h100) -> None:
    graph = conv_graph([(16, 9, 1, 4), (16, 9, 1, 4)], 48, cin=16)
    roomy = plan_graph_gpu(graph, h100)
    assert "cufft-keep" in picks(roomy).values()
    # the cuFFT plan cache's reservation is 1/16 of a cap this small, not 256 MiB
    cap = roomy.device_peak_bytes - 2**28 - roomy.spectra_bytes // 4
    tight = plan_graph_gpu(graph, h100, cap)
    assert tight.device_peak_bytes <= cap
    assert tight.spectra_bytes < roomy.spectra_bytes
    assert tight.spectra_bytes <= cap // 8  # the executor's bound of its kept spectra
    with pytest.raises(ValueError, match="bytes of device memory"):
        plan_graph_gpu(graph, h100, 2**20)


def test_the_device_cap_is_the_devices_within_the_memory_limit(h100) -> None:
    assert device_cap_bytes(h100) == int(0.9 * h100.gpu.memory_bytes)
    assert device_cap_bytes(h100, 2**30) == 2**30
    with pytest.raises(ValueError, match="no GPU"):
        device_cap_bytes(h100.without_gpus())


def test_profiles_carry_rates_by_precision(h100, tmp_path) -> None:
    gpu = h100.gpu
    assert set(gpu.cudnn_flops_per_s) == {"fp32", "tf32", "bf16", "fp16"}
    assert gpu.conv_rate("cudnn", "fp16") > gpu.conv_rate("cudnn", "tf32") \
        > gpu.conv_rate("cudnn", "fp32")
    path = tmp_path / "m.json"
    h100.save(path)
    assert MachineProfile.load(path).gpu == gpu
    d = h100.to_dict()
    d["gpus"][0]["cudnn_flops_per_s"] = {"fp32": 1e12}  # the others keep the defaults
    partial = MachineProfile.from_dict(d).gpu
    assert partial.cudnn_flops_per_s["fp32"] == 1e12 and partial.cudnn_flops_per_s["fp16"] > 0
    d["gpus"][0]["cudnn_flops_per_s"] = {"fp64": 1e12}
    with pytest.raises(ValueError, match="cudnn_flops_per_s"):
        MachineProfile.from_dict(d)


def test_device_tensors_follow_the_device_executors_lifetimes() -> None:
    from znni.planner.graph.gpu_costs import device_tensor_bytes

    graph = conv_graph([(4, 3, 1, 1), (8, 3, 1, 1)], 16)
    x, r0, r1 = 1 * 16**3 * 4, 4 * 16**3 * 4, 8 * 16**3 * 4  # fp32 bytes
    # each ReLU runs in its conv's call (no buffer); r0 is freed after the second conv
    assert device_tensor_bytes(graph, 1, 4) == x + r0 + r1
    assert device_tensor_bytes(graph, 2, 2) == x + r0 + r1
