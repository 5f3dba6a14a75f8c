"""Ledger durability rules, layout memory rules, progress output, and the default backend."""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import zarr
from support.engine_ref import dense_volume, small_network, write_network, write_volume
from support.naive import close

from znni.engine.compute.execution import plan_job
from znni.engine.compute.layout import (
    block_bytes,
    choose_block_shape,
    input_cache_bytes,
)
from znni.engine.context import StoreContext
from znni.engine.geometry import Box, Halo, patch_tiling, split_blocks
from znni.engine.io.ledger import Ledger, fingerprint, read_ledger
from znni.engine.job import SegmentJob
from znni.engine.location import Location
from znni.engine.segment import segment
from znni.model.network import load_network

CTX = StoreContext()  # store options (none) and caches for this module's calls

PARTS = {"network": "abc", "roi": "0:1,0:1,0:1", "border": "reflect"}


def test_ledger_survives_a_torn_last_line(tmp_path: Path) -> None:
    ledger = Ledger(Location.parse(tmp_path), ctx=CTX)
    ledger.start(PARTS, (8, 8, 8))
    ledger.record(["0:8,0:8,0:8", "0:8,0:8,8:16"])
    with open(ledger.path, "a") as f:
        f.write('{"block": "8:16,0:8,0')  # killed mid-append
    header, done = read_ledger(Location.parse(tmp_path), ctx=CTX)
    assert header is not None and header["fingerprint"] == fingerprint(PARTS)
    assert header["block_shape"] == [8, 8, 8]
    assert done == {"0:8,0:8,0:8", "0:8,0:8,8:16"}
    ledger.resume()
    ledger.record(["8:16,0:8,0:8"])
    assert read_ledger(Location.parse(tmp_path), ctx=CTX)[1] == done | {"8:16,0:8,0:8"}
    lines = ledger.path.read_text().splitlines()
    assert json.loads(lines[-1])["block"] == "8:16,0:8,0:8"


def test_ledger_start_forgets_earlier_blocks(tmp_path: Path) -> None:
    ledger = Ledger(Location.parse(tmp_path), ctx=CTX)
    ledger.start(PARTS, (8, 8, 8))
    ledger.record(["0:8,0:8,0:8"])
    ledger.start({**PARTS, "border": "zero"}, (4, 4, 4))
    header, done = read_ledger(Location.parse(tmp_path), ctx=CTX)
    assert done == set() and header is not None and header["parts"]["border"] == "zero"
    assert not list(tmp_path.glob("*.tmp"))


@pytest.fixture()
def net(tmp_path: Path):
    layers, params = small_network(np.random.default_rng(0))
    return load_network(write_network(tmp_path, layers, params))


@pytest.mark.parametrize("budget", [2**28, 2**30, 2**34])
def test_planned_patch_fits_budget_and_is_mpf_valid(net, budget: int) -> None:
    plan = plan_job(net, "cpu", budget, (200, 200, 200))
    patch = plan.output_size
    assert all(p % q == 0 for p, q in zip(patch, net.pool_product, strict=True))
    assert net.is_valid_input_size(plan.input_size)
    assert plan.peak_bytes <= budget


def test_planned_patch_never_exceeds_region(net) -> None:
    plan = plan_job(net, "cpu", 2**34, (5, 3, 7))
    # at most the region rounded up to the pool product (2, 1, 2): (6, 3, 8)
    assert all(o <= c for o, c in zip(plan.output_size, (6, 3, 8)))


def test_block_shape_is_whole_chunks_within_budget(net) -> None:
    chunks, patch, peak = (4, 4, 4), (32, 32, 32), 2**20
    budget = peak + input_cache_bytes(2**24) + 2 * block_bytes(net, (16, 16, 16), 1)
    block = choose_block_shape(net, chunks, patch, (100, 100, 100), budget, 1, peak)
    assert all(b % c == 0 for b, c in zip(block, chunks, strict=True))
    assert 2 * block_bytes(net, block, 1) <= budget - peak - input_cache_bytes(budget)
    roomy = choose_block_shape(net, chunks, patch, (96, 96, 96), 2**34, 1, peak)
    assert roomy == (32, 32, 32)  # one patch wide, tiled without recomputation


def _computed(block: tuple[int, ...], patch: tuple[int, ...], region: tuple[int, ...],
              origin: tuple[int, int, int] = (0, 0, 0)) -> int:
    """Output voxels the patches compute over the region (from `origin`) cut into blocks,
    counted patch by patch as the engine tiles them (geometry.split_blocks,
    geometry.patch_tiling)."""
    total = 0
    hi = (origin[0] + region[0], origin[1] + region[1], origin[2] + region[2])
    boxes = split_blocks(Box(origin, hi), block, block, Halo((0,) * 3, (0,) * 3), (1, 1, 1))
    for b in boxes:
        extent = b.write.shape
        clipped = tuple(min(p, e) for p, e in zip(patch, extent, strict=True))
        total += sum(box.size for box in patch_tiling(extent, clipped))
    return total


@pytest.mark.parametrize("chunks, patch, region, want", [
    ((64, 64, 64), (152, 152, 152), (512, 512, 512), (448, 448, 448)),
    ((32, 96, 96), (64, 190, 190), (64, 384, 384), (64, 288, 288)),
    ((64, 64, 64), (64, 200, 120), (128, 400, 250), (64, 448, 192)),
])
def test_block_shape_lets_patches_tile_it_with_least_recomputation(
    net, chunks, patch, region, want
) -> None:
    """A block just wider than a patch takes two per axis: the old rule (the fewest chunks
    holding a patch) computed 1.6-1.9x the output on these; the block chosen computes the
    least that any whole-chunk block does, counted patch by patch."""
    block = choose_block_shape(net, chunks, patch, region, 2**34, 1, 2**20)
    assert block == want
    fewest = tuple(-(-p // c) * c for p, c in zip(patch, chunks, strict=True))
    assert _computed(block, patch, region) < _computed(fewest, patch, region)
    every = itertools.product(*(range(c, -(-r // c) * c + 1, c)
                                for c, r in zip(chunks, region, strict=True)))
    wide = [b for b in every if all(e >= min(p, r) for e, p, r in zip(b, patch, region,
                                                                         strict=True))]
    assert _computed(block, patch, region) <= 1.01 * min(_computed(b, patch, region)
                                                         for b in wide)


@pytest.mark.parametrize("patch, origin, region", [
    ((64, 150, 150), (0, 32, 32), (64, 384, 384)),
    ((64, 100, 100), (0, 64, 100), (64, 256, 256)),
    ((64, 96, 200), (0, 96, 96), (64, 300, 300)),
])
def test_block_shape_counts_an_roi_off_the_chunk_grid_as_it_is_cut(
    net, patch, origin, region
) -> None:
    """Blocks are cut on the chunk grid from voxel 0, so an ROI that starts off it begins
    and ends with short blocks; counted from the ROI's start instead, the blocks chosen
    computed 1.5-2.3x the output of the best on these."""
    chunks = (64, 64, 64)
    block = choose_block_shape(net, chunks, patch, region, 2**34, 1, 2**20, origin=origin)
    unaware = choose_block_shape(net, chunks, patch, region, 2**34, 1, 2**20)
    assert _computed(block, patch, region, origin) < _computed(unaware, patch, region, origin)
    every = itertools.product(*(range(c, -(-(o + r) // c) * c + 1, c)
                                for c, o, r in zip(chunks, origin, region, strict=True)))
    wide = [b for b in every if all(e >= min(p, r) for e, p, r in zip(b, patch, region,
                                                                         strict=True))]
    assert _computed(block, patch, region, origin) <= 1.01 * min(
        _computed(b, patch, region, origin) for b in wide)


def test_block_shape_holds_whole_batches_of_the_plans_patches(net) -> None:
    """A block batches only its own patches: with a batch of 2, a one-patch block runs
    every patch alone. Of the blocks that recompute nothing, the smallest holding whole
    batches is taken (100x100x200 ran 4.24 s against 4.80 for 100^3 blocks, 2026-11-24)."""
    chunks, patch, region = (50, 100, 100), (100, 100, 100), (200, 700, 700)
    alone = choose_block_shape(net, chunks, patch, region, 2**34, 1, 2**20, batch=1)
    paired = choose_block_shape(net, chunks, patch, region, 2**34, 1, 2**20, batch=2)
    assert alone == (100, 100, 100)
    per_block = 1
    for b, p in zip(paired, patch, strict=True):
        per_block *= -(-b // p)
    assert per_block == 2 and _computed(paired, patch, region) == _computed(alone, patch, region)


def test_progress_log_lines_when_not_quiet(tmp_path: Path, net, caplog) -> None:
    vol = np.random.default_rng(1).integers(0, 255, size=(9, 10, 11)).astype(np.uint8)
    inp = write_volume(tmp_path / "in.zarr", vol, 3, (9, 10, 11))
    job = SegmentJob(network=net, input_path=inp, output_path=str(tmp_path / "o.zarr"),
                     chunks=(5, 5, 6), block=(5, 5, 6))
    with caplog.at_level(logging.INFO, logger="znni.engine"):
        segment(job, quiet=False)
    assert any("8/8 blocks" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="znni.engine"):
        segment(SegmentJob(**{**job.__dict__, "overwrite": True}), quiet=True)
    assert not caplog.records


def test_default_backend_4d_input(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    layers, params = small_network(rng, 2)
    net = load_network(write_network(tmp_path, layers, params, 2))
    vol = rng.standard_normal((2, 23, 29, 31)).astype(np.float32)
    inp = write_volume(tmp_path / "in.zarr", vol, 3, (1, 8, 8, 8))
    job = SegmentJob(network=net, input_path=inp, output_path=str(tmp_path / "o.zarr"),
                     chunks=(8, 8, 8), block=(8, 16, 16), border="zero")
    report = segment(job)  # the machine's default backend (the fast CPU one when present)
    assert report.blocks_total >= 8
    assert close(zarr.open_array(str(job.output_path))[...], dense_volume(layers, params, vol, "zero"))


def test_segment_follows_a_plan(tmp_path: Path) -> None:
    import znni.planner
    from znni.planner.machine import MachineProfile
    from znni.planner.search import make_plan
    from znni.primitives.backends import make_backend

    rng = np.random.default_rng(6)
    layers, params = small_network(rng)
    net = load_network(write_network(tmp_path, layers, params))
    profile = Path(znni.planner.__file__).parent / "profiles" / "ci-2core.json"
    plan = make_plan(net, machine=MachineProfile.load(profile), device="cpu",
                     memory_limit_bytes=2**28)
    vol = rng.standard_normal((19, 21, 23)).astype(np.float32)
    inp = write_volume(tmp_path / "in.zarr", vol, 2, (8, 8, 8))
    job = SegmentJob(network=net, input_path=inp, output_path=str(tmp_path / "o.zarr"),
                     chunks=(5, 7, 6), block=(10, 7, 12))
    report = segment(job, plan=plan, backend=make_backend("cpu"))
    layout = {k: report.plan[k] for k in ("block_shape", "block_edges", "job_seconds")}
    assert report.plan == {**plan.to_dict(), **layout} and report.blocks_total >= 8
    assert layout["block_edges"] == ((0, 10, 19), (0, 7, 14, 21), (0, 12, 23))  # --block
    ref = dense_volume(layers, params, vol[None], "reflect")
    assert close(zarr.open_array(str(job.output_path))[...], ref)
