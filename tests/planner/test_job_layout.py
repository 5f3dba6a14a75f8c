"""The block layout a plan records and the engine cuts (issue 39): hand-computed patches
per block, remainders merged where they cost whole patches, halos, and no drift."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from math import prod
from pathlib import Path

import numpy as np
import pytest
from support.engine_ref import small_network, write_network, write_volume

from znni.engine.compute.layout import choose_block_layout
from znni.engine.geometry import Box, Halo, split_blocks
from znni.engine.job import SegmentJob
from znni.engine.segment import _blocks_and_spec, prepare_run, segment
from znni.model.network import load_network, network_shapes_only
from znni.planner.blocks import (
    axis_cost,
    axis_patches,
    edges_blocks,
    grid_cuts,
    layout_patch_seconds,
    layout_patches,
    merged_cuts,
)

NETS = Path(__file__).resolve().parents[2] / "benchmarks" / "networks"


def n537_width24():  # type: ignore[no-untyped-def]
    """n537 with 24 channels per hidden layer (field of view 163, pool product 8)."""
    raw = json.loads((NETS / "n537.json").read_text())
    convs = [layer for layer in raw["layers"] if layer["kind"] == "conv"]
    for layer in convs[:-1]:
        layer["out_channels"] = 24
    return network_shapes_only(raw, "n537-w24")


def test_cuts_on_the_grid_and_merged_remainders() -> None:
    assert grid_cuts(0, 200, 192) == [0, 192, 200]
    assert grid_cuts(30, 200, 64) == [30, 64, 128, 192, 200]
    assert merged_cuts([30, 64, 128, 192, 200], True, True) == [30, 128, 200]
    assert merged_cuts([0, 200], True, True) == [0, 200]  # one span stays


def test_patches_per_block_axis_by_hand() -> None:
    assert axis_patches(200, 56, 8) == (4, 56)  # the last shifted back
    assert axis_patches(8, 56, 8) == (1, 8)  # a thin remainder: one clipped patch
    assert axis_patches(44, 32, 8) == (2, 32)  # computed up to 48, two patches of 32
    assert axis_patches(5, 32, 8) == (1, 8)
    # 192 + 8: four whole patches and a thin one of (8 + 162) input voxels
    assert axis_cost([0, 192, 200], 56, 8, 163) == 4 * 218 + 170
    assert axis_cost([0, 200], 56, 8, 163) == 4 * 218


def test_issue_case_merges_the_thin_remainder() -> None:
    """200^3 uint8, 64^3 chunks, 3 GiB: a 192^3 block and seven 8-voxel remainders cost
    1.8x the plan; the layout is one 200^3 block of 64 patches (a lone block holds no
    second block in flight)."""
    net = n537_width24()
    layout = choose_block_layout(net, (64, 64, 64), (56, 56, 56), (200, 200, 200),
                                 3 * 2**30, 1, 2_100_000_000)
    assert layout.edges == ((0, 200), (0, 200), (0, 200))
    assert layout_patches(layout.edges, (56, 56, 56), (8, 8, 8)) == [(64, (56, 56, 56))]
    plain = tuple(tuple(grid_cuts(0, 200, 192)) for _ in range(3))
    counts = layout_patches(plain, (56, 56, 56), (8, 8, 8))  # type: ignore[arg-type]
    assert counts[0] == (64, (56, 56, 56)) and counts[1] == (16, (56, 56, 8))
    assert sum(c for c, _ in counts) == 64 + 3 * 16 + 3 * 4 + 1
    fov = net.fov
    merged_s = layout_patch_seconds(layout.edges, (56,) * 3, (8,) * 3, fov, 1, 23.3)
    plain_s = layout_patch_seconds(plain, (56,) * 3, (8,) * 3, fov, 1, 23.3)  # type: ignore[arg-type]
    assert merged_s == pytest.approx(64 * 23.3)
    assert plain_s / merged_s > 1.7  # the issue measured about 1.8x


def test_remainder_stays_where_a_merge_costs_a_whole_patch() -> None:
    """168 + 8 with patch 56: merged, 200 takes four whole patches; apart, three and a thin
    one, which is cheaper (4 * 218 against 3 * 218 + 170)."""
    assert axis_cost([0, 168, 176], 56, 8, 163) < axis_cost([0, 176], 56, 8, 163)


def test_edges_off_the_chunk_grid_are_refused() -> None:
    halo = Halo((1, 1, 1), (1, 1, 1))
    with pytest.raises(ValueError, match="chunk grid"):
        split_blocks(Box((0, 0, 0), (20, 20, 20)), (8, 8, 8), (8, 8, 8), halo, (1, 1, 1),
                     ((0, 12, 20), (0, 20), (0, 20)))


def test_merged_blocks_keep_their_halos() -> None:
    halo = Halo((3, 3, 3), (4, 4, 4))
    edges = ((0, 16, 36), (0, 36), (0, 36))
    blocks = split_blocks(Box((0, 0, 0), (36, 36, 36)), (16, 16, 16), (8, 8, 8), halo,
                          (2, 2, 2), edges)
    assert [b.write.shape for b in blocks] == [(16, 36, 36), (20, 36, 36)]
    assert blocks[1].read == Box((13, -3, -3), (40, 40, 40))
    assert [(b.write.lo, b.write.hi) for b in blocks] == edges_blocks(edges)


def test_engine_cuts_the_plans_layout(tmp_path: Path) -> None:
    """prepare_run records the layout in the plan; the engine's blocks and the blocks a
    run computes are exactly its edges."""
    layers, params = small_network(np.random.default_rng(0))
    net = load_network(write_network(tmp_path, layers, params))
    vol = np.random.default_rng(1).integers(0, 255, size=(21, 26, 19)).astype(np.uint8)
    inp = write_volume(tmp_path / "in.zarr", vol, 3, (8, 8, 8))
    job = SegmentJob(network=net, input_path=inp, output_path=str(tmp_path / "o.zarr"),
                     chunks=(8, 8, 8), memory_limit_bytes=2**30)
    given = prepare_run(SegmentJob(**{**job.__dict__, "block": (8, 8, 8)}))
    assert given.plan is not None  # --block: its plain grid, remainders kept
    assert given.plan.block_edges == ((0, 8, 16, 21), (0, 8, 16, 24, 26), (0, 8, 16, 19))
    prep = prepare_run(job)
    assert prep.plan is not None and prep.plan.block_edges is not None
    blocks, _ = _blocks_and_spec(job, prep)
    planned = edges_blocks(prep.plan.block_edges)  # type: ignore[arg-type]
    assert [(b.write.lo, b.write.hi) for b in blocks] == planned
    report = segment(job)
    assert [list(e) for e in report.plan["block_edges"]] == [list(e) for e in
                                                             prep.plan.block_edges]
    for cuts in prep.plan.block_edges:  # no span thinner than it must be
        widths = [b - a for a, b in zip(cuts, cuts[1:])]
        assert len(widths) == 1 or min(widths) >= 8
    assert report.blocks_total == len(planned)
    # the dashboard's block map draws that layout: every block finished, merged ones too
    from znni.api.blockmap import block_map
    from znni.engine.context import StoreContext

    edges = [list(e) for e in prep.plan.block_edges]
    drawn = block_map(job.output_path, ctx=StoreContext(), edges=edges)
    assert drawn["done"] == drawn["total"] == len(planned) and drawn["edges"] == edges
    plain = block_map(job.output_path, ctx=StoreContext())  # the grid of the block shape
    assert plain["edges"] is None
    if plain["grid"] != drawn["grid"]:  # a merged remainder is not a cell of the plain grid
        assert plain["done"] < plain["total"]


def test_job_seconds_counts_every_stage(tmp_path: Path, monkeypatch) -> None:
    """Patches by hand over the issue's layout; an FFT layer whose transforms are not in
    FFTW's wisdom pays FFTW's planning once, in its own layer times (direct layers plan
    nothing); the first block's read and the last block's write are exposed."""
    from znni.planner.jobtime import COLD_S_PER_POINT, STARTUP_S, job_seconds
    from znni.planner.plan import LayerPlan, Plan
    from znni.primitives.cpu.fft_workspaces import FftSettings, layer_workspaces
    from znni.primitives.fft_sizes import padded_shape

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("ZNNI_FFT_EFFORT", "FFTW_MEASURE")
    net = n537_width24()
    prims = ("fft-keep",) + (None,) * (len(net.ops) - 1)
    layers = (LayerPlan(0, "conv", "cpu", "fft-keep", 5.0, 0),)  # 5 of the patch's 20 s
    plan = Plan("n537-w24", "m", "cpu", (218,) * 3, (56,) * 3, 1, None,  # type: ignore[arg-type]
                prims, layers, 2**30, 20.0, 1.0)
    edges = ((0, 200), (0, 200), (0, 200))
    job = job_seconds(plan, net, edges, in_bytes=1, out_dtype="uint8")
    assert (job.blocks, job.patches) == (1, 64)
    assert job.patches_s == pytest.approx(64 * 20.0)
    assert job.computed_voxels == job.ideal_voxels == 224**3
    # no wisdom of these shapes: every workspace of layer 0 (its 4^3 kernel's spectra, 3^3
    # tiles of 75^3 in chunks of 11 and 5, their image in and 24 images out) is planned; the
    # image transforms' points count (b * padded)
    listed = layer_workspaces(True, (1, 1, 218, 218, 218), (24, 1, 4, 4, 4), FftSettings())
    assert job.cold_shapes == len(listed) == 5
    points = sum(ws.points for ws in listed if ws.images)
    assert points == (11 + 11 * 24 + 5 + 5 * 24) * prod(padded_shape((75, 75, 75)))
    assert job.fftw_planning_s == pytest.approx(COLD_S_PER_POINT["FFTW_MEASURE"] * points)
    # where this machine's calibration measured FFTW's planning, its rate counts
    from znni.planner.calibrate import CACHE_VERSION, cache_path

    cached = cache_path(os.cpu_count() or 1)
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps({"version": CACHE_VERSION,
                                  "cpu_rates": {"fftw_measure_s_per_point": 150e-9}}))
    measured = job_seconds(plan, net, edges, in_bytes=1, out_dtype="uint8")
    assert measured.fftw_planning_s == pytest.approx(150e-9 * points)
    cached.unlink()
    direct = replace(plan, primitives=("direct",) + prims[1:])
    assert job_seconds(direct, net, edges, in_bytes=1, out_dtype="uint8").cold_shapes == 0
    assert job.total_s == pytest.approx(STARTUP_S + job.fftw_planning_s + job.first_pass_s
                                        + job.patches_s + job.io_s)
    warm = job_seconds(plan, net, edges, in_bytes=1, out_dtype="uint8", known_machine=False)
    assert warm.fftw_planning_s == 0 and warm.cold_shapes == 0  # another machine: unknown
    plain = ((0, 192, 200),) * 3
    split = job_seconds(plan, net, plain, in_bytes=1, out_dtype="uint8")
    assert split.blocks == 8 and split.patches == 64 + 3 * 16 + 3 * 4 + 1
    assert split.patches_s / warm.patches_s > 1.7
    assert split.computed_voxels > job.computed_voxels  # thin patches compute 8 voxels


def test_label_outputs_write_their_stored_channels() -> None:
    """Labels store 1 channel: the writes are timed at 1 value a voxel, not the network's
    channels (n537 has 3), in the stored dtype."""
    from znni.planner.jobtime import WRITE_VALUES_PER_S, job_seconds
    from znni.planner.plan import LayerPlan, Plan

    net = n537_width24()
    layers = (LayerPlan(0, "conv", "cpu", "direct", 5.0, 0),)
    plan = Plan("n537-w24", "m", "cpu", (218,) * 3, (56,) * 3, 1, None,  # type: ignore[arg-type]
                ("direct",) * len(net.ops), layers, 2**30, 20.0, 1.0)
    edges = ((0, 112, 200),) * 3  # 8 blocks
    floats = job_seconds(plan, net, edges, in_bytes=1, out_dtype="float32",
                         known_machine=False)
    labels = job_seconds(plan, net, edges, in_bytes=1, out_dtype="uint8", out_channels=1,
                         known_machine=False)
    writes = 200**3 / WRITE_VALUES_PER_S["uint8"]
    read_s = floats.io_total_s - net.out_channels * 200**3 / WRITE_VALUES_PER_S["float32"]
    assert net.out_channels == 3 and labels.io_total_s == pytest.approx(read_s + writes)


def test_plan_json_reports_the_whole_run(tmp_path: Path, capsys) -> None:
    """`znni plan --input --json`: predicted_job_seconds at the top level, the layout the
    run will cut, a peak within the limit; a missing input, an ROI outside the volume and
    a limit nothing fits in are one sentence, exit 2."""
    from znni.cli import main

    layers, params = small_network(np.random.default_rng(0))
    spec = write_network(tmp_path, layers, params)
    vol = np.zeros((21, 26, 19), np.uint8)
    inp = write_volume(tmp_path / "in.zarr", vol, 3, (8, 8, 8))
    args = ["plan", str(spec), "--machine", "ci-2core", "--memory-limit", "1GiB", "--input",
            inp, "--chunks", "8,8,8", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["predicted_job_seconds"] == pytest.approx(out["job_seconds"]["total_s"])
    assert out["predicted_job_seconds"] > out["job_seconds"]["patches_s"] > 0
    assert out["job_peak_bytes"] <= 2**30 and out["block_edges"][0][0] == 0
    assert main(args[:-1]) == 0
    assert "every block's patches" in capsys.readouterr().out
    for bad in (["--input", str(tmp_path / "missing.zarr")], ["--roi", "0:40,:,:"],
                ["--memory-limit", "1KiB"]):
        assert main([*args, *bad]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "error" in err


def test_patch_and_blocks_chosen_together(tmp_path: Path) -> None:
    """Of the plans within each pass budget, the one whose whole run over its own blocks
    is predicted fastest: never slower than the largest pass budget's alone."""
    from znni.engine.compute.execution import plan_job
    from znni.engine.compute.layout import (
        PLAN_FRACTION,
        plan_with_layout,
        with_job_time,
        with_layout,
    )

    net = n537_width24()
    region, budget = Box((0, 0, 0), (400, 400, 400)), 3 * 2**30
    both = plan_with_layout(net, "cpu", (64, 64, 64), region, budget, 1, "float32")
    alone = plan_job(net, "cpu", int(budget * PLAN_FRACTION), region.shape)
    alone = with_job_time(with_layout(alone, net, (64, 64, 64), region, budget, 1), net, 1,
                          "float32", budget_bytes=budget)
    assert both.job_seconds is not None and alone.job_seconds is not None
    searched = both.job_seconds["planning_s"]  # measured (a clock): compared with nothing
    assert alone.job_seconds["planning_s"] == 0  # planned by hand here, not timed
    # total_s holds the measured planning time added in; taking it back out leaves a
    # rounding error of a few ulps (seen: 5e-12 s over 45417 s), so compare to 1e-12
    assert both.job_seconds["total_s"] - searched <= alone.job_seconds["total_s"] * (1 + 1e-12)
    # 400 = 192 + 208 would take 8 patches of 56 per axis, as one block does, but two
    # 208^3 blocks do not fit beside the pass: 128 + 128 + 144 take 9 on one axis
    assert both.job_seconds["computed_voxels"] <= 1.17 * both.job_seconds["ideal_voxels"]
    assert both.job_seconds["peak_bytes"] <= budget


def test_no_block_fits_is_one_sentence() -> None:
    """Where two one-chunk blocks and their halos do not fit beside the pass, the run is
    refused (it used to go on with blocks over the budget)."""
    with pytest.raises(ValueError, match="no block fits in the memory budget"):
        choose_block_layout(n537_width24(), (64, 64, 64), (56, 56, 56), (200, 200, 200),
                            2**30, 1, 2**30 - 2**20)


def test_fftw_planning_is_predicted_from_the_wisdom_a_run_leaves(tmp_path: Path,
                                                                 monkeypatch) -> None:
    """Before any run the FFT layers' transforms are cold; a real pass over the patch with
    FFTW_MEASURE plans and saves them; the same prediction then counts none. Sizes no
    other test plans (FFTW's wisdom is per process)."""
    from znni.planner.jobtime import job_seconds
    from znni.planner.plan import Plan
    from znni.primitives.cpu.backend import CpuBackend
    from znni.primitives.dense import dense_forward

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("ZNNI_FFT_EFFORT", "FFTW_MEASURE")
    layers, params = small_network(np.random.default_rng(3))
    net = load_network(write_network(tmp_path, layers, params))
    prims = ("fft-keep", None, None, "fft-recompute", None)
    out = (14, 18, 22)
    size_in = tuple(o + f - 1 for o, f in zip(out, net.fov, strict=True))
    plan = Plan("small", "m", "cpu", size_in, out, 1, None, prims, (),  # type: ignore[arg-type]
                2**28, 0.1, 1.0, spectra_cache_bytes=2**26)
    edges = tuple((0, o) for o in out)
    cold = job_seconds(plan, net, edges, in_bytes=1, out_dtype="float32")
    assert cold.cold_shapes >= 4 and cold.fftw_planning_s > 0
    backend = CpuBackend(fft_effort="FFTW_MEASURE", spectra_cache_bytes=2**26,
                         persist_choices=False)
    try:
        x = np.random.default_rng(0).random((1, 1, *size_in), dtype=np.float32)
        dense_forward(net.ops, x, backend, prims)
    finally:
        backend.close()
    warm = job_seconds(plan, net, edges, in_bytes=1, out_dtype="float32")
    assert warm.cold_shapes == 0 and warm.fftw_planning_s == 0
    assert (tmp_path / "znni" / "fftw-wisdom-single.dat").stat().st_size > 0


def test_a_one_patch_run_is_charged_one_patch_peak() -> None:
    """A job of a single patch peaks as one pass (jobtime.one_patch_peak_bytes); with two
    patches the second meets the workspaces the first left cached (the plan's peak)."""
    from znni.planner.hostsim import replay_pass
    from znni.planner.jobtime import job_seconds, one_patch_peak_bytes
    from znni.planner.machine import MachineProfile
    from znni.planner.search import make_plan
    from znni.primitives.cpu.backend import usable_cores

    net = n537_width24()
    plan = make_plan(net, machine=MachineProfile.load("znni-paper"), device="cpu",
                     memory_limit_bytes=8 * 2**30, max_output=(48, 48, 48))
    shapes = net.layer_shapes(plan.input_size, plan.batch)
    one, two = (replay_pass(shapes, list(plan.primitives), threads=usable_cores(), patches=n,
                            workspace_bytes=plan.workspace_cache_bytes).peak_bytes
                for n in (1, 2))
    assert one < two  # its FFT layers follow a direct one: the cache carries over
    assert one_patch_peak_bytes(plan, net) == plan.peak_bytes - (two - one)
    z = plan.output_size[0]
    single = job_seconds(plan, net, ((0, z), (0, z), (0, z)), in_bytes=1, out_dtype="uint8",
                         known_machine=False)
    double = job_seconds(plan, net, ((0, z), (0, z), (0, 2 * z)), in_bytes=1,
                         out_dtype="uint8", known_machine=False)
    assert (single.patches, double.patches) == (1, 2)
    held = single.peak_bytes - one_patch_peak_bytes(plan, net)
    assert held > 0 and double.peak_bytes >= plan.peak_bytes + held


def test_the_input_cache_counts_no_more_than_the_input_read() -> None:
    """The input chunk cache's bound (a sixteenth of the budget, at most 256 MiB) is what a
    large run's cache may reach; a small input is all it can hold."""
    from znni.engine.compute.layout import INPUT_CACHE_BYTES, cached_input_bytes

    net = n537_width24()  # field of view 163
    small = ((0, 64), (0, 70), (0, 30))
    assert cached_input_bytes(net, small, 1, 8 * 2**30) == 226 * 232 * 192
    assert cached_input_bytes(net, small, 2, 8 * 2**30) == 2 * 226 * 232 * 192
    big = ((0, 2000), (0, 2000), (0, 2000))
    assert cached_input_bytes(net, big, 1, 8 * 2**30) == INPUT_CACHE_BYTES
    assert cached_input_bytes(net, big, 1, 2**30) == 2**30 // 16
    assert cached_input_bytes(net, big, 1, 0) == 0  # no budget: no cache counted
