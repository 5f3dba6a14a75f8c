"""With the ZNNi paper's machine profile the plans reproduce the paper's findings (SC16):
MPF throughout, S = 1, FFT conv on the CPU, larger patches better, CPU-GPU beats both."""

from __future__ import annotations

import pytest
from support.planner_nets import ZNNI_TABLE, paper_plan, znni_network

from znni.planner.machine import MachineProfile
from znni.planner.search import evaluate, make_plan

PAPER = MachineProfile.load("znni-paper")


@pytest.fixture(scope="module", params=sorted(ZNNI_TABLE), name="paper_plan")
def paper_plan_fixture(request: pytest.FixtureRequest):
    return znni_network(request.param), paper_plan(request.param)  # make_plan(net, machine=PAPER)


def test_cpu_gpu_beats_either_device_alone(paper_plan) -> None:
    _, plan = paper_plan
    by_alg = {a.algorithm: a for a in plan.alternatives}
    assert plan.algorithm == "cpu-gpu"
    best_single = max(by_alg[a].predicted_voxels_per_second for a in ("cpu", "gpu", "gpu-ram"))
    assert by_alg["cpu-gpu"].predicted_voxels_per_second > best_single
    assert all(a.feasible for a in plan.alternatives)


def test_cpu_only_uses_s1_mpf_and_fft(paper_plan) -> None:
    net, _ = paper_plan
    cpu = make_plan(net, machine=PAPER, device="cpu")
    assert cpu.batch == 1
    # MPF throughout: the plan runs every pool as fragments, so the output is dense and a
    # multiple of the pool product
    assert all(o % p == 0 for o, p in zip(cpu.output_size, net.pool_product, strict=True))
    # FFT on the CPU for every 80 -> 80 map layer, the ones that dominate the cost (the
    # 1-map first layer and the 3-map last layer may be direct)
    shapes = net.layer_shapes(cpu.input_size)
    heavy = [sh.index for sh in shapes if sh.kind == "conv" and min(sh.channels_in,
                                                                   sh.channels_out) == 80]
    assert heavy and all(cpu.primitives[i].startswith("fft") for i in heavy)


def test_larger_patches_are_better_on_the_cpu(paper_plan) -> None:
    net, _ = paper_plan
    rates = []
    for j in (2, 6, 12, 24):
        size = net.input_size_for((8 * j,) * 3)
        plans = evaluate(net, PAPER, "cpu", net.layer_shapes(size), host_bytes=10**13, gpu_bytes=0)
        rates.append(plans[0].predicted_voxels_per_second)
    assert rates == sorted(rates)
