"""OME-Zarr in and out on real stores: inputs written by ome-zarr-py (NGFF 0.4 on Zarr 2,
0.5 on Zarr 3), outputs read back by ome-zarr-py and TensorStore, the pyramid against an
independent mean, and resume / ROI runs leaving every level as an uninterrupted run."""

from __future__ import annotations

import json
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
import zarr
from ome_zarr.format import FormatV04, FormatV05
from ome_zarr.io import parse_url
from ome_zarr.reader import Reader
from ome_zarr.writer import write_image
from support.engine_ref import dense_volume, small_network, write_network, write_volume
from support.naive import close

from znni.engine.context import StoreContext
from znni.engine.geometry import Box
from znni.engine.io.ledger import ledger_path, read_ledger
from znni.engine.io.ome import level_path
from znni.engine.io.volume import open_input
from znni.engine.job import SegmentCancelled, SegmentJob
from znni.engine.location import Location
from znni.engine.segment import check_and_plan, segment
from znni.model.network import load_network
from znni.primitives.backends import make_backend

CTX = StoreContext()  # store options (none) and caches for this module's calls

SCALE = 1 / 255


def write_ome(path: Path, vol: np.ndarray, version: str, axes: list, scale: list[float],
              shift: list[float] | None = None, levels: int = 2) -> str:
    """An OME-Zarr image written by ome-zarr-py, halving y, x per level."""
    fmt = FormatV04() if version == "0.4" else FormatV05()
    group = zarr.open_group(str(path), mode="w", zarr_format=fmt.zarr_format)
    n = len(axes)
    transforms = []
    for k in range(levels):
        s = list(scale[: n - 2]) + [v * 2**k for v in scale[n - 2:]]
        t = [{"type": "scale", "scale": s}]
        if shift is not None:
            t.append({"type": "translation", "translation": shift})
        transforms.append(t)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # coordinate_transformations is deprecated upstream
        write_image(vol, group, fmt=fmt, axes=axes,
                    scale_factors=[{"y": 2**k, "x": 2**k} for k in range(1, levels)],
                    coordinate_transformations=transforms,
                    storage_options={"chunks": tuple(min(8, s) for s in vol.shape)})
    return str(path)


def space(unit: str | None = "nanometer") -> list[dict]:
    return [{"name": a, "type": "space", **({"unit": unit} if unit else {})} for a in "zyx"]


def mean_level(a: np.ndarray, step: tuple[int, int, int], dtype: str) -> np.ndarray:
    """Independent reference: each output voxel is the mean of its window, loop by loop."""
    c, z, y, x = a.shape
    shape = [-(-n // s) for n, s in zip((z, y, x), step)]
    out = np.zeros((c, *shape), np.float64)
    for i in range(shape[0]):
        for j in range(shape[1]):
            for k in range(shape[2]):
                w = a[:, i * step[0]:(i + 1) * step[0], j * step[1]:(j + 1) * step[1],
                      k * step[2]:(k + 1) * step[2]]
                out[:, i, j, k] = w.reshape(c, -1).astype(np.float64).mean(axis=1)
    return np.rint(out).astype(np.uint8) if dtype == "uint8" else out.astype(np.float32)


@pytest.fixture()
def net(tmp_path: Path) -> dict:
    rng = np.random.default_rng(5)
    layers, params = small_network(rng)
    spec = write_network(tmp_path, layers, params, scale=SCALE)
    return dict(layers=layers, params=params, network=load_network(spec), spec=spec)


def run(net: dict, inp: str, out: Path, **kw) -> None:
    kw.setdefault("memory_limit_bytes", 2**28)
    segment(SegmentJob(net["network"], inp, str(out), **kw), backend=make_backend("reference"))


def levels_of(path: Path) -> list[np.ndarray]:
    group = zarr.open_group(str(path), mode="r")
    paths = [d["path"] for d in group.attrs["ome"]["multiscales"][0]["datasets"]]
    return [np.asarray(group[p][...]) for p in paths]


@pytest.mark.parametrize("version", ["0.4", "0.5"])
def test_ome_input_gives_ome_output_with_pyramid(tmp_path: Path, net: dict, version: str) -> None:
    vol = np.random.default_rng(1).integers(0, 256, size=(12, 34, 30)).astype(np.uint8)
    inp = write_ome(tmp_path / "in.ome.zarr", vol, version, space("micrometer"),
                    [0.4, 0.05, 0.05], shift=[1.0, 2.0, 3.0])
    out = tmp_path / "out.ome.zarr"
    run(net, inp, out, chunks=(4, 8, 8), block=(4, 8, 8), pyramid=3)
    got = levels_of(out)
    ref = dense_volume(net["layers"], net["params"], vol[None], "reflect", SCALE)
    assert close(got[0], ref)
    # z (0.4) is much coarser than y, x (0.05): y, x halve until they pass half of z's size
    steps = [(1, 2, 2), (1, 2, 2), (1, 2, 2)]
    for k, step in enumerate(steps, start=1):
        assert got[k].shape == mean_level(got[k - 1], step, "float32").shape
        np.testing.assert_allclose(got[k], mean_level(got[k - 1], step, "float32"), atol=1e-6)
    meta = zarr.open_group(str(out), mode="r").attrs.asdict()
    ms = meta["ome"]["multiscales"][0]
    assert meta["ome"]["version"] == "0.5"
    assert [a["name"] for a in ms["axes"]] == ["c", "z", "y", "x"]
    assert ms["axes"][0]["type"] == "channel" and ms["axes"][1]["unit"] == "micrometer"
    first, second = ms["datasets"][0]["coordinateTransformations"], ms["datasets"][1][
        "coordinateTransformations"]
    assert first[0]["scale"] == [1.0, 0.4, 0.05, 0.05]
    assert first[1]["translation"] == [0.0, 1.0, 2.0, 3.0]
    assert second[0]["scale"] == [1.0, 0.4, 0.1, 0.1]
    assert second[1]["translation"] == pytest.approx([0.0, 1.0, 2.025, 3.025])
    prov = meta["znni"]
    assert prov["network"]["digest"] == net["network"].digest and prov["mode"] == "exact"
    assert prov["input"] == str(Path(inp).resolve()) and prov["level"] == 0
    assert prov["input_array"] == str((Path(inp) / "s0").resolve())
    assert zarr.open_array(str(out / "0"), mode="r").metadata.dimension_names == (
        "c", "z", "y", "x")
    _read_back_with_ome_zarr_and_tensorstore(out, got)


def _read_back_with_ome_zarr_and_tensorstore(out: Path, got: list[np.ndarray]) -> None:
    import tensorstore as ts

    nodes = list(Reader(parse_url(str(out)))())
    image = nodes[0]
    assert len(image.data) == len(got)
    for level, values in zip(image.data, got):
        np.testing.assert_array_equal(np.asarray(level), values)
    ms = image.metadata
    assert [a["name"] for a in ms["axes"]] == ["c", "z", "y", "x"]
    FormatV05().validate_coordinate_transformations(4, len(got), ms["coordinateTransformations"])
    store = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(out / "0")}},
                    open=True).result()
    np.testing.assert_array_equal(store.read().result(), got[0])
    assert list(store.domain.labels) == ["c", "z", "y", "x"]


def test_level_and_channel_axis(tmp_path: Path) -> None:
    """A (c, z, y, x) image's level 1 is read as that level, with its own voxel size."""
    rng = np.random.default_rng(2)
    vol = rng.integers(0, 256, size=(2, 6, 16, 12)).astype(np.uint8)
    axes = [{"name": "c", "type": "channel"}, *space()]
    inp = write_ome(tmp_path / "in.ome.zarr", vol, "0.5", axes, [1.0, 30.0, 4.0, 4.0])
    v0 = open_input(Location.parse(inp), 2, ctx=CTX)
    assert v0.has_channel_axis and v0.shape == (6, 16, 12) and v0.ome.scale == (30.0, 4.0, 4.0)
    level1 = level_path(Location.parse(inp), 1, ctx=CTX)
    v1 = open_input(level1, 2, ctx=CTX)
    assert v1.ome.level == 1 and v1.shape == (6, 8, 6) and v1.ome.scale == (30.0, 8.0, 8.0)
    got = v1.read(Box.from_shape(v1.shape))
    np.testing.assert_array_equal(got, np.asarray(zarr.open_array(str(level1), mode="r")[...]))


def test_resume_after_cancel_equals_uninterrupted(tmp_path: Path, net: dict,
                                                  monkeypatch) -> None:
    """Blocks that do not align with the deepest factor make pyramid updates wait for their
    neighbours; a cancelled and resumed run still leaves every level bit-equal. The run is
    cancelled at its first record, so coarse chunks are written as soon as a block's levels
    are made (flush 0): with writes held 2 s, the first record of a run this small may
    come after its last block (test_pyramid_writes.py cancels and resumes the builder)."""
    monkeypatch.setenv("ZNNI_PYRAMID_FLUSH_S", "0")
    vol = np.random.default_rng(3).integers(0, 256, size=(14, 22, 26)).astype(np.uint8)
    inp = write_ome(tmp_path / "in.ome.zarr", vol, "0.5", space(None), [1.0, 1.0, 1.0])
    opts = dict(chunks=(3, 5, 5), block=(3, 5, 5), pyramid=2, dtype="uint8")
    run(net, inp, tmp_path / "whole.ome.zarr", **opts)
    whole = levels_of(tmp_path / "whole.ome.zarr")
    for k in (1, 2):
        np.testing.assert_array_equal(whole[k], mean_level(whole[k - 1], (2, 2, 2), "uint8"))
    out = tmp_path / "out.ome.zarr"
    cancel, seen = threading.Event(), []

    def progress(event) -> None:
        seen.append(event)
        cancel.set()  # from the first recorded block: the sweep stops after its current one

    job = SegmentJob(net["network"], inp, str(out), memory_limit_bytes=2**28, **opts)
    with pytest.raises(SegmentCancelled):
        segment(job, backend=make_backend("reference"), progress=progress, cancel=cancel)
    _, done = read_ledger(Location.parse(out), ctx=CTX)
    assert 1 <= len(done) < 5 * 5 * 6
    # out of the group's listing
    assert ledger_path(Location.parse(out), ctx=CTX).parent.name == "0"
    run(net, inp, out, **opts)
    for a, b in zip(levels_of(out), whole):
        np.testing.assert_array_equal(a, b)


def test_lost_blocks_are_recomputed_with_their_levels(tmp_path: Path, net: dict) -> None:
    """As after a SIGKILL: blocks missing from the ledger, with garbage in their level-0
    boxes and pyramid regions, are recomputed and every level equals a clean run."""
    vol = np.random.default_rng(4).integers(0, 256, size=(16, 24, 24)).astype(np.uint8)
    inp = write_ome(tmp_path / "in.ome.zarr", vol, "0.4", space(), [1.0, 1.0, 1.0])
    opts = dict(chunks=(4, 8, 8), block=(4, 8, 8), pyramid=2)
    out = tmp_path / "out.ome.zarr"
    run(net, inp, out, **opts)
    clean = levels_of(out)
    lines = ledger_path(Location.parse(out), ctx=CTX).read_text().splitlines()
    keep, lost = lines[:20], [json.loads(line)["block"] for line in lines[20:]]
    ledger_path(Location.parse(out), ctx=CTX).write_text("\n".join(keep) + "\n")
    group = zarr.open_group(str(out), mode="r+")
    for key in lost:
        lo_hi = [tuple(int(v) for v in part.split(":")) for part in key.split(",")]
        for k, name in enumerate(("0", "1", "2")):
            f = 2**k
            box = tuple(slice(a // f, -(-b // f)) for a, b in lo_hi)
            group[name][(slice(None), *box)] = 7.0
    run(net, inp, out, **opts)
    for a, b in zip(levels_of(out), clean):
        np.testing.assert_array_equal(a, b)


def test_roi_runs_keep_every_level_consistent(tmp_path: Path, net: dict) -> None:
    vol = np.random.default_rng(6).integers(0, 256, size=(12, 20, 22)).astype(np.uint8)
    inp = write_ome(tmp_path / "in.ome.zarr", vol, "0.5", space(), [1.0, 1.0, 1.0])
    opts = dict(chunks=(4, 4, 4), block=(4, 8, 8), pyramid=2)
    run(net, inp, tmp_path / "whole.ome.zarr", **opts)
    out = tmp_path / "out.ome.zarr"
    run(net, inp, out, roi=((0, 12), (0, 9), (0, 22)), **opts)  # 9: inside a level-2 voxel
    run(net, inp, out, roi=((0, 12), (9, 20), (0, 22)), overwrite=True, **opts)
    for a, b in zip(levels_of(out), levels_of(tmp_path / "whole.ome.zarr")):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_plain_output_records_provenance_and_ome_on_request(tmp_path: Path, net: dict) -> None:
    vol = np.random.default_rng(7).integers(0, 256, size=(10, 12, 14)).astype(np.uint8)
    inp = write_volume(tmp_path / "in.zarr", vol, 2, (5, 6, 7))
    run(net, inp, tmp_path / "plain.zarr", roi=((0, 5), (None, None), (None, None)))
    prov = zarr.open_array(str(tmp_path / "plain.zarr"), mode="r").attrs["znni"]
    assert prov["roi"] == [[0, 5], [0, 12], [0, 14]] and prov["border"] == "reflect"
    assert prov["plan"]["algorithm"] and prov["input_array"] == str(Path(inp).resolve())
    assert prov["version"] and prov["network"]["name"] == net["network"].name
    run(net, inp, tmp_path / "o.ome.zarr", output_format="ome-zarr")
    ms = zarr.open_group(str(tmp_path / "o.ome.zarr"), mode="r").attrs["ome"]["multiscales"][0]
    assert len(ms["datasets"]) == 1  # 14 voxels: no level is needed to get under 256
    assert "unit" not in ms["axes"][1]


def test_provenance_of_a_windowed_plan(tmp_path: Path, net: dict) -> None:
    from znni.engine.output.provenance import provenance

    vol = np.zeros((4, 4, 4), np.uint8)
    volume = open_input(Location.parse(write_volume(tmp_path / "in.zarr", vol, 3, (4, 4, 4))), 1,
                        ctx=CTX)
    plan = {"mode": "windowed", "window": [32, 32, 32], "overlap": 0.25, "blend": "gaussian"}
    job = SegmentJob(net["network"], volume.path, str(tmp_path / "o"))
    record = provenance(job, volume, Box.from_shape((4, 4, 4)), plan)
    assert record["mode"] == "windowed" and record["roi"] is None
    assert record["window"] == {"window": [32, 32, 32], "overlap": 0.25, "blend": "gaussian"}


def _refused(tmp_path: Path, net: dict, inp: str, match: str, **kw) -> None:
    out = tmp_path / "refused.ome.zarr"
    with pytest.raises(ValueError, match=match):
        check_and_plan(SegmentJob(net["network"], inp, str(out), **kw))
    assert not out.exists()


def test_refusals_write_nothing(tmp_path: Path, net: dict) -> None:
    vol = np.zeros((3, 4, 10, 10), np.uint8)
    timed = write_ome(tmp_path / "t.ome.zarr", vol, "0.5",
                      [{"name": "t", "type": "time"}, *space()], [1.0] * 4, levels=1)
    _refused(tmp_path, net, timed, "has a time axis 't'")
    flat = write_ome(tmp_path / "f.ome.zarr", vol[0, 0], "0.4", space()[1:], [1.0, 1.0], levels=1)
    _refused(tmp_path, net, flat, "has 2 space axes")
    plain_group = tmp_path / "g.zarr"
    zarr.open_group(str(plain_group), mode="w")
    _refused(tmp_path, net, str(plain_group), "without multiscales")
    old = tmp_path / "old.zarr"
    zarr.open_group(str(old), mode="w", zarr_format=2).attrs["multiscales"] = [
        {"version": "0.3", "axes": ["z", "y", "x"], "datasets": [{"path": "0"}]}]
    _refused(tmp_path, net, str(old), "version '0.3'")
    good = write_ome(tmp_path / "ok.ome.zarr", vol[0], "0.5", space(), [1.0] * 3, levels=1)
    _refused(tmp_path, net, good, "pyramid 9 asks for more levels", pyramid=9)
    _refused(tmp_path, net, good, "--pyramid applies", output_format="zarr", pyramid=1)
    _refused(tmp_path, net, good, "output format 'tiff'", output_format="tiff")
    ms_path = Path(good) / "zarr.json"
    meta = json.loads(ms_path.read_text())
    meta["attributes"]["ome"]["multiscales"][0]["datasets"][0]["coordinateTransformations"] = [
        {"type": "scale", "scale": [1.0, "x", 1.0]}]
    ms_path.write_text(json.dumps(meta))
    _refused(tmp_path, net, good, "coordinate transformation")


def test_existing_output_must_match(tmp_path: Path, net: dict) -> None:
    vol = np.random.default_rng(8).integers(0, 256, size=(8, 12, 12)).astype(np.uint8)
    inp = write_ome(tmp_path / "in.ome.zarr", vol, "0.5", space(), [1.0, 1.0, 1.0])
    out = tmp_path / "out.ome.zarr"
    run(net, inp, out, pyramid=1)
    before = sorted(p.name for p in out.rglob("*"))
    for kw, match in ((dict(pyramid=2), "has 1 pyramid levels"),
                      (dict(output_format="zarr"), "is an OME-Zarr image, not zarr")):
        with pytest.raises(ValueError, match=match):
            check_and_plan(SegmentJob(net["network"], inp, str(out), overwrite=True, **kw))
    assert sorted(p.name for p in out.rglob("*")) == before
    run(net, inp, out)  # no --pyramid: the existing output's depth; resumes (all done)
    assert len(levels_of(out)) == 2


@pytest.mark.slow
def test_dask_workers_write_level_0_and_the_client_the_pyramid(tmp_path: Path, net: dict,
                                                               monkeypatch) -> None:
    monkeypatch.setenv("ZNNI_BACKEND", "reference")
    vol = np.random.default_rng(10).integers(0, 256, size=(8, 20, 20)).astype(np.uint8)
    inp = write_ome(tmp_path / "in.ome.zarr", vol, "0.5", space(), [1.0, 1.0, 1.0])
    opts = dict(chunks=(4, 5, 5), block=(4, 5, 5), pyramid=2)
    run(net, inp, tmp_path / "local.ome.zarr", **opts)
    job = SegmentJob(net["network"], inp, str(tmp_path / "dask.ome.zarr"), scheduler="local:2",
                     memory_limit_bytes=2**28, **opts)
    segment(job)
    for a, b in zip(levels_of(tmp_path / "dask.ome.zarr"), levels_of(tmp_path / "local.ome.zarr")):
        np.testing.assert_allclose(a, b, atol=1e-6)


@pytest.mark.slow
def test_sigkill_then_resume_leaves_every_level_as_a_clean_run(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    rng = np.random.default_rng(11)  # wide enough that a block takes tens of milliseconds
    layers = [{"kind": "conv", "out_channels": 8, "kernel": [3, 3, 3]}, {"kind": "relu"},
              {"kind": "conv", "out_channels": 8, "kernel": [3, 3, 3]}, {"kind": "tanh"},
              {"kind": "conv", "out_channels": 1, "kernel": [1, 1, 1]}, {"kind": "sigmoid"}]
    params = {}
    for i, (cout, cin, k) in {0: (8, 1, 3), 2: (8, 8, 3), 4: (1, 8, 1)}.items():
        w = rng.standard_normal((cout, cin, k, k, k)) / np.sqrt(cin * k**3)
        params[f"{i}.weight"] = w.astype(np.float32)
        params[f"{i}.bias"] = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    spec = write_network(tmp_path, layers, params, scale=1 / 255)
    vol = np.random.default_rng(12).integers(0, 256, size=(24, 40, 40)).astype(np.uint8)
    inp = write_ome(tmp_path / "in.ome.zarr", vol, "0.5", space(), [1.0, 1.0, 1.0])
    # coarse chunks wait 50 ms at most (not 2 s), so that the 64 blocks of this sub-second
    # run are recorded in several batches, one of which the kill can follow
    env = {**os.environ, "ZNNI_BACKEND": "reference", "OMP_NUM_THREADS": "1",
           "ZNNI_PYRAMID_FLUSH_S": "0.05"}

    def cmd(out: Path) -> list[str]:  # blocks of 6: the level-2 footprints cross blocks
        return [sys.executable, "-m", "znni.cli", "segment", str(spec), inp, str(out),
                "--chunks", "6,10,10", "--block", "6,10,10", "--pyramid", "2", "--quiet"]

    assert subprocess.run(cmd(tmp_path / "clean.ome.zarr"), env=env).returncode == 0
    out = tmp_path / "out.ome.zarr"
    proc = subprocess.Popen(cmd(out), env=env)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            where = Location.parse(out)
            if ledger_path(where, ctx=CTX).exists() and len(read_ledger(where, ctx=CTX)[1]) >= 24:
                break
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert 24 <= len(read_ledger(Location.parse(out), ctx=CTX)[1]) < 64
    assert subprocess.run(cmd(out), env=env).returncode == 0
    for a, b in zip(levels_of(out), levels_of(tmp_path / "clean.ome.zarr")):
        np.testing.assert_array_equal(a, b)


def test_float_outputs_are_stored_with_blosc_lz4_and_uint8_ones_with_zstd(tmp_path: Path) -> None:
    """float32 network outputs barely compress, so they get the cheap codec; both read back
    exactly through zarr and TensorStore."""
    import tensorstore as ts

    from znni.engine.io.formats.zarr_array import create_zarr_array

    rng = np.random.default_rng(5)
    values = {"float32": rng.standard_normal((2, 9, 8, 7)).astype(np.float32),
              "uint8": rng.integers(0, 256, (2, 9, 8, 7)).astype(np.uint8)}
    for dtype, codec in (("float32", "BloscCodec"), ("uint8", "ZstdCodec")):
        path = tmp_path / f"{dtype}.zarr"
        arr = create_zarr_array(Location.parse(path), (2, 9, 8, 7), dtype, (4, 4, 4), ctx=CTX)
        arr[...] = values[dtype]
        assert [type(c).__name__ for c in arr.compressors] == [codec]
        if dtype == "float32":
            assert arr.compressors[0].cname.value == "lz4"
        np.testing.assert_array_equal(zarr.open_array(str(path), mode="r")[...], values[dtype])
        store = ts.open({"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}},
                        open=True).result()
        np.testing.assert_array_equal(store.read().result(), values[dtype])
