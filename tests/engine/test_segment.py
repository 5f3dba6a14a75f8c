"""segment() on real Zarr volumes equals the independent whole-volume dense reference."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import zarr
from support.engine_ref import dense_volume, small_network, write_network, write_volume
from support.naive import close

from znni.engine.context import StoreContext
from znni.engine.io.ledger import read_ledger
from znni.engine.job import SegmentCancelled, SegmentJob
from znni.engine.segment import check_and_plan, segment
from znni.model.network import load_network
from znni.primitives.backends import make_backend

CTX = StoreContext()  # store options (none) and caches for this module's calls

SCALE, SHIFT = 1 / 255, -0.25

CASES = [
    # block sizes (3), both borders, both formats, uint8/float32, 3D/4D, ROIs touching faces
    dict(shape=(23, 29, 31), block=(8, 8, 8), chunks=(8, 8, 8), border="reflect", fmt=3),
    dict(shape=(23, 29, 31), block=(12, 10, 16), chunks=(6, 5, 8), border="zero", fmt=2),
    dict(shape=(23, 29, 31), block=(7, 9, 11), chunks=(7, 9, 11), border="reflect", fmt=2,
         in_dtype="float32"),
    dict(shape=(17, 21, 19), block=(6, 6, 6), chunks=(3, 6, 6), border="zero", fmt=3,
         roi=((0, 11), (4, 21), (5, 19))),
    dict(shape=(17, 21, 19), block=(5, 8, 6), chunks=(5, 4, 6), border="reflect", fmt=3,
         roi=((6, 17), (0, 13), (0, 7)), channels=2, in_dtype="float32"),
    dict(shape=(15, 13, 17), block=(4, 4, 4), chunks=(4, 4, 4), border="reflect", fmt=2,
         channels=2, out_dtype="uint8"),
    dict(shape=(40, 50, 60), block=(16, 20, 24), chunks=(8, 10, 12), border="reflect", fmt=3),
]


def _run_case(tmp_path: Path, case: dict, seed: int) -> None:
    rng = np.random.default_rng(seed)
    channels = case.get("channels", 1)
    layers, params = small_network(rng, channels)
    net = load_network(write_network(tmp_path, layers, params, channels, SCALE, SHIFT))
    in_dtype = case.get("in_dtype", "uint8")
    vol = rng.integers(0, 256, size=(channels, *case["shape"])).astype(in_dtype)  # (C, Z, Y, X)
    stored = vol if channels > 1 else vol[0]
    inp = write_volume(tmp_path / "in.zarr", stored, case["fmt"], (5,) * stored.ndim)
    roi = case.get("roi")
    job = SegmentJob(
        network=net, input_path=inp, output_path=str(tmp_path / "out.zarr"), roi=roi,
        border=case["border"], dtype=case.get("out_dtype", "float32"), chunks=case["chunks"],
        block=case["block"], memory_limit_bytes=2**28,
    )
    report = segment(job, backend=make_backend("reference"))
    assert report.blocks_total >= 8 and report.blocks_computed == report.blocks_total
    ref = dense_volume(layers, params, vol, case["border"], SCALE, SHIFT)
    out = zarr.open_array(str(tmp_path / "out.zarr"), mode="r")
    assert out.shape == (2, *case["shape"])
    assert out.metadata.zarr_format == 3
    assert tuple(out.chunks) == (2, *case["chunks"])
    got = out[...]
    sl = (slice(None),) + tuple(slice(a, b) for a, b in (roi or [(0, n) for n in case["shape"]]))
    assert report.voxels_written == got[sl][0].size
    if case.get("out_dtype") == "uint8":
        assert got.dtype == np.uint8
        expect = np.rint(np.clip(ref[sl], 0, 1) * 255)
        assert np.abs(got[sl].astype(float) - expect).max() <= 1  # rounding ties may flip
    else:
        assert close(got[sl], ref[sl])
    outside = np.ones(got.shape, dtype=bool)
    outside[sl] = False
    assert not got[outside].any()  # nothing written outside the ROI


@pytest.mark.parametrize("i", range(len(CASES)))
def test_segment_equals_whole_volume_reference(tmp_path: Path, i: int) -> None:
    _run_case(tmp_path, CASES[i], seed=i)


def _job(tmp_path: Path, **kw) -> tuple[SegmentJob, np.ndarray, list, dict]:
    rng = np.random.default_rng(7)
    layers, params = small_network(rng)
    net = load_network(write_network(tmp_path, layers, params))
    vol = rng.standard_normal((19, 22, 25)).astype(np.float32)
    inp = write_volume(tmp_path / "in.zarr", vol, 3, (8, 8, 8))
    args = dict(network=net, input_path=inp, output_path=str(tmp_path / "out.zarr"),
                chunks=(5, 6, 7), block=(5, 6, 7))
    args.update(kw)
    return SegmentJob(**args), vol, layers, params


def test_cancel_then_resume_recomputes_only_unfinished(tmp_path: Path) -> None:
    job, vol, layers, params = _job(tmp_path)
    cancel = threading.Event()
    events = []

    def on_progress(ev) -> None:
        events.append(ev)
        if ev.blocks_done == 10:
            cancel.set()

    with pytest.raises(SegmentCancelled):
        segment(job, progress=on_progress, cancel=cancel, backend=make_backend("reference"))
    _, done = read_ledger(job.output_path, ctx=CTX)
    assert 10 <= len(done) < events[0].blocks_total
    report = segment(job, backend=make_backend("reference"))
    assert report.blocks_computed == report.blocks_total - len(done)
    assert close(zarr.open_array(str(job.output_path))[...], dense_volume(layers, params, vol[None],
                                                                     "reflect"))
    again = segment(job, backend=make_backend("reference"))
    assert again.blocks_computed == 0 and again.voxels_written == 0


def test_different_job_refused_unless_overwrite(tmp_path: Path) -> None:
    job, vol, layers, params = _job(tmp_path)
    segment(job, backend=make_backend("reference"))
    other = SegmentJob(**{**job.__dict__, "border": "zero"})
    with pytest.raises(ValueError, match=r"different job \(border differs\).*--overwrite"):
        check_and_plan(other)
    report = segment(SegmentJob(**{**other.__dict__, "overwrite": True}),
                     backend=make_backend("reference"))
    assert report.blocks_computed == report.blocks_total
    ref = dense_volume(layers, params, vol[None], "zero")
    assert close(zarr.open_array(str(job.output_path))[...], ref)


def test_stage_times_and_progress_reported(tmp_path: Path) -> None:
    job, *_ = _job(tmp_path)
    seen = []
    report = segment(job, progress=seen.append, backend=make_backend("reference"))
    stages = report.stage_seconds  # reported, not bounded: no speed is asserted here
    assert set(stages) >= {"read", "compute", "write", "wait"}
    assert stages["compute"] > 0 and report.voxels_per_second > 0
    assert [e.blocks_done for e in seen] == list(range(1, report.blocks_total + 1))
    assert seen[-1].voxels_done == seen[-1].voxels_total == 19 * 22 * 25


def test_first_block_is_read_while_the_output_is_created(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    """The output's creation waits here until the first block's read has begun: a run that
    read only after creating its output would never start, and the wait would time out."""
    import znni.engine.segment as seg
    from znni.engine.workers.mpf import BlockWorker

    job, vol, layers, params = _job(tmp_path)
    reading, created = threading.Event(), []
    read = BlockWorker.read

    def read_and_tell(self, block):  # noqa: ANN001, ANN202
        reading.set()
        return read(self, block)

    open_target = seg.open_target

    def open_after_the_read(*args, **kw):  # noqa: ANN002, ANN003, ANN202
        created.append(reading.wait(timeout=30))
        return open_target(*args, **kw)

    monkeypatch.setattr(BlockWorker, "read", read_and_tell)
    monkeypatch.setattr(seg, "open_target", open_after_the_read)
    segment(job, backend=make_backend("reference"))
    assert created == [True]
    assert close(zarr.open_array(str(job.output_path))[...], dense_volume(layers, params, vol[None],
                                                                     "reflect"))


def test_a_failed_output_creation_stops_the_early_read(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    import znni.engine.segment as seg

    job, *_ = _job(tmp_path)

    def refuse(*args, **kw):  # noqa: ANN002, ANN003, ANN202
        raise ValueError("output refused")

    monkeypatch.setattr(seg, "open_target", refuse)
    with pytest.raises(ValueError, match="output refused"):
        segment(job, backend=make_backend("reference"))
    assert not [t for t in threading.enumerate() if t.name.startswith("znni-read")]
    assert not Path(job.output_path).exists()
