"""make_plan and the Plan value: validity of what is chosen, JSON round trip, limits."""

from __future__ import annotations

import json

import pytest
from support.planner_nets import ZNNI_FOV, ZNNI_TABLE, paper_plan, znni_network

from znni.model.network import Network
from znni.planner.costs import FIRST_PASS_S_PER_PEAK_BYTE
from znni.planner.machine import MachineProfile
from znni.planner.plan import Plan
from znni.planner.search import (
    BATCHES,
    candidate_sizes,
    evaluate,
    make_plan,
    region_voxels_per_second,
)

CI = MachineProfile.load("ci-2core")


@pytest.fixture(params=sorted(ZNNI_TABLE))
def znni_net(request: pytest.FixtureRequest) -> Network:
    return znni_network(request.param)


def test_fov_of_benchmark_networks(znni_net) -> None:
    assert znni_net.fov == (ZNNI_FOV[znni_net.name],) * 3


def test_plan_is_valid_and_fits(znni_net) -> None:
    plan = make_plan(znni_net, machine=CI, device="cpu")
    assert plan.algorithm == "cpu"
    assert znni_net.is_valid_input_size(plan.input_size)
    assert plan.output_size == znni_net.output_size(plan.input_size)
    assert len(plan.primitives) == len(znni_net.ops)
    for op_kind, prim in zip((layer.kind for layer in znni_net.layers), plan.primitives,
                             strict=True):
        assert (prim in ("direct", "fft-keep", "fft-recompute")) == (op_kind == "conv")
        assert (prim is None) == (op_kind != "conv")
    assert plan.peak_bytes <= plan.memory_limit_bytes
    assert plan.predicted_voxels_per_second > 0
    assert [layer.index for layer in plan.layers] == list(range(len(znni_net.ops)))


def test_plan_json_round_trip() -> None:
    plan = paper_plan("n337")  # make_plan on the znni-paper profile, shared with the paper tests
    text = json.dumps(plan.to_dict())
    back = Plan.from_dict(json.loads(text))
    assert back == plan


def test_a_stored_plan_with_theta_reads_as_split_op() -> None:
    """Job rows written before `split_op` hold `theta`, the last op before the split."""
    plan = paper_plan("n337")
    assert plan.algorithm == "cpu-gpu" and plan.split_op is not None
    old = plan.to_dict()
    old["theta"] = old.pop("split_op") - 1
    for alt in old["alternatives"]:
        split = alt.pop("split_op")
        alt["theta"] = None if split is None else split - 1
    assert Plan.from_dict(json.loads(json.dumps(old))) == plan


@pytest.mark.parametrize("name, limit_gib", [("n337", 2.5), ("n537", 6)])
def test_memory_limit_is_respected_and_shrinks_the_patch(name: str, limit_gib: float) -> None:
    net = znni_network(name)
    limit = int(limit_gib * 2**30)
    big = make_plan(net, machine=CI, device="cpu")
    small = make_plan(net, machine=CI, device="cpu", memory_limit_bytes=limit)
    assert small.peak_bytes <= limit < big.peak_bytes
    assert small.input_size[0] < big.input_size[0]


def test_impossible_limit_and_bad_device_raise() -> None:
    net = znni_network("n337")
    with pytest.raises(ValueError, match="fits in"):
        make_plan(net, machine=CI, memory_limit_bytes=10 * 2**20)
    with pytest.raises(ValueError, match="device"):
        make_plan(net, machine=CI, device="tpu")
    with pytest.raises(ValueError, match="no GPU"):
        make_plan(net, machine=CI, device="gpu")


def test_make_plan_calibrates_only_when_asked(monkeypatch) -> None:
    """Without a machine, the detected one gets the rates `calibrate` names (passing nothing
    never measures); with a machine, calibrate=True is refused rather than ignored."""
    from znni.planner import search

    asked = []
    monkeypatch.setattr(search, "detect_machine",
                        lambda *, calibrate: asked.append(calibrate) or CI)
    net = znni_network("n337")
    assert make_plan(net, device="cpu") == make_plan(net, machine=CI, device="cpu")
    make_plan(net, calibrate=None, device="cpu")
    assert asked == [False, None]
    with pytest.raises(ValueError, match="calibrate=True"):
        make_plan(net, machine=CI, calibrate=True)


def test_region_rate_counts_whole_patches_in_whole_batches() -> None:
    plan = make_plan(znni_network("n337"), machine=CI, device="cpu",
                     memory_limit_bytes=3 * 2**30)
    oz, oy, ox = plan.output_size
    first_s = FIRST_PASS_S_PER_PEAK_BYTE * plan.peak_bytes  # once per run
    assert region_voxels_per_second(plan, None) == plan.predicted_voxels_per_second
    one = region_voxels_per_second(plan, (oz, oy, ox))  # one patch: a whole batch's time
    assert one == pytest.approx(oz * oy * ox / (plan.predicted_patch_s + first_s))
    # one voxel more on two axes: four patches, so ceil(4 / S) batches
    region = (oz + 1, oy + 1, ox)
    batches = -(-4 // plan.batch)
    assert region_voxels_per_second(plan, region) == pytest.approx(
        (oz + 1) * (oy + 1) * ox / (batches * plan.predicted_patch_s + first_s))


@pytest.mark.parametrize("name, region", [("n337", (64, 190, 194)), ("n726", (40, 300, 300)),
                                          ("n337", (512, 512, 512))])
def test_plan_for_a_region_is_the_fastest_over_that_region(name: str,
                                                           region: tuple[int, int, int]) -> None:
    """Over a region the patches must tile, the best per-patch rate can lose: a patch just
    short of the region needs two per axis. The plan is the best over the region among
    every size and batch the search considers."""
    net = znni_network(name)
    limit = 4 * 2**30
    plan = make_plan(net, machine=CI, device="cpu", memory_limit_bytes=limit, max_output=region)
    rates = [region_voxels_per_second(p, region)
             for size in candidate_sizes(net, region) for batch in BATCHES
             for p in evaluate(net, CI, "cpu", net.layer_shapes(size, batch), host_bytes=limit,
                               gpu_bytes=0)]
    assert region_voxels_per_second(plan, region) >= 0.99 * max(rates)
