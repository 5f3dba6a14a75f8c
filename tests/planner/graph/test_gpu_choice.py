"""The window and batch of a graph model on the GPU (engine.compute.graph_choice with
device="gpu"): the most predicted voxels/s whose device peak fits the cap."""

from __future__ import annotations

from dataclasses import replace
from math import prod

import pytest

from znni.engine.compute.graph_choice import GPU_BATCHES, choose, plan_window
from znni.model.loading import load_model
from znni.planner.machine import MachineProfile


@pytest.fixture(scope="module")
def model(tmp_path_factory, onnx_models):  # noqa: ANN001
    path = onnx_models.copy("basicunet", tmp_path_factory.mktemp("gc") / "b.onnx")
    return load_model(path)


def small_gpu(memory_bytes: int) -> MachineProfile:
    h100 = MachineProfile.load("h100-host")
    return replace(h100, gpus=(replace(h100.gpu, memory_bytes=memory_bytes),))


def test_the_choice_fits_the_device_cap(model) -> None:
    region = (256, 256, 256)
    for cap in (2**28, 2**30, 2**32):
        machine = small_gpu(2**36)
        choice = choose(model, 2**33, region, 0.25, machine, device="gpu", device_cap=cap)
        assert choice.device == "gpu" and choice.precision == "fp32"
        assert choice.device_peak_bytes <= cap
        assert choice.batch in GPU_BATCHES
        assert set(choice.primitives.values()) <= {"cudnn", "cufft-keep", "cufft",
                                                   "gemm-loop"}
        assert len(choice.primitives) == sum(n.op in ("conv", "conv_transpose")
                                             for n in model.graph(choice.window).nodes)


def test_half_precision_fits_more_voxels_in_the_same_cap(model) -> None:
    machine, cap = small_gpu(2**36), 2**28
    sizes = {}
    for precision in ("fp32", "fp16"):
        c = choose(model, 2**33, (512, 512, 512), 0.25, machine, device="gpu",
                   precision=precision, device_cap=cap)
        sizes[precision] = c.batch * prod(c.window)
        assert c.device_peak_bytes <= cap and c.precision == precision
    assert sizes["fp16"] >= sizes["fp32"]


def test_a_window_beyond_the_cap_is_refused(model) -> None:
    with pytest.raises(ValueError, match="device memory"):
        plan_window(model, (256, 256, 256), 2**33, (512, 512, 512), 0.25, small_gpu(2**36),
                    device="gpu", device_cap=2**26)


def test_the_cpu_plans_in_fp32_and_bf16_only(model) -> None:
    cpu = choose(model, 2**30, (64, 64, 64), 0.25, MachineProfile.load("ci-2core"))
    assert cpu.device == "cpu" and cpu.precision == "fp32" and cpu.device_peak_bytes == 0
    bf16 = choose(model, 2**30, (64, 64, 64), 0.25, MachineProfile.load("ci-2core"),
                  precision="bf16")
    # bf16 where a compiled network runs; our own kernels stay fp32 (nothing faster in bf16)
    assert bf16.precision == ("bf16" if bf16.plan.compiled else "fp32")
    with pytest.raises(ValueError, match="needs --device gpu"):
        choose(model, 2**30, (64, 64, 64), 0.25, MachineProfile.load("ci-2core"),
               precision="fp16")


@pytest.mark.parametrize("precision, primitive", [("fp32", "gemm-loop"), ("fp16", "gemm-loop"),
                                                  ("fp32", "cufft-keep"), ("fp16", "cufft")])
def test_the_device_peak_is_the_executors(model, precision, primitive) -> None:
    """The planned device peak against the stand-in executor's counted peak (one batch of
    two 32^3 windows; the staging buffers the test does not allocate are left out), with
    the primitives whose workspace the executor bounds itself (cuDNN's is its size query,
    which the planner assumes: gpu_costs.CUDNN_WORKSPACE_FRACTION)."""
    import numpy as np

    graph_device = pytest.importorskip("znni.engine.compute.graph_device")
    from znni.planner.graph.gpu_costs import conv_costs
    from znni.planner.graph.gpu_search import device_peak
    from znni.primitives.gpu.device import HostDevice
    from znni.primitives.precision import storage_dtype

    machine, graph, batch = small_gpu(2**32), model.graph((32, 32, 32)), 2
    from znni.planner.graph.gpu_search import plan_graph_gpu

    plan = plan_graph_gpu(graph, machine, precision=precision, batch=batch)
    chosen = {n.name: n.primitive for n in plan.nodes if n.primitive}
    picks = {}
    for i, node in enumerate(graph.nodes):
        if node.name in chosen:
            costs = {c.primitive: c for c in conv_costs(graph, node, machine.gpu, precision,
                                                        batch)}
            picks[i] = costs.get(primitive, costs[chosen[node.name]])
            chosen[node.name] = picks[i].primitive
    peak = device_peak(graph, picks, precision, batch, int(0.9 * 2**32))
    device = HostDevice(2**32)
    ops = graph_device.DeviceGraphOps(device, precision)
    x = device.adopt(np.zeros((batch, 1, 32, 32, 32), storage_dtype(precision)))
    graph_device.run_graph_device(graph, x, ops, chosen)
    planned = peak.total_bytes - peak.staging_bytes + x.nbytes
    assert abs(device.peak_bytes - planned) <= 0.1 * device.peak_bytes
