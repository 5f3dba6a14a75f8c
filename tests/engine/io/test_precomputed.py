"""Neuroglancer precomputed (and N5) volumes written by TensorStore, run through segment():
the output equals the Zarr path's for the same data and the independent dense reference,
carries the input's resolution and offset in a valid `info`, and reads back through
TensorStore; ROI, a second scale (--level) and Dask work as for Zarr."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from support.engine_ref import dense_volume, small_network, write_network, write_volume
from support.naive import close

from znni.engine.context import StoreContext
from znni.engine.io.ledger import read_ledger
from znni.engine.io.ome import level_path
from znni.engine.io.precomputed import create_output, existing_chunks
from znni.engine.job import SegmentJob
from znni.engine.location import Location
from znni.engine.segment import segment
from znni.model.network import load_network
from znni.primitives.backends import make_backend

ts = pytest.importorskip("tensorstore")

CTX = StoreContext()
SCALE = 1 / 255
SHAPE = (18, 21, 26)  # (z, y, x)
RES, OFFSET = [4.0, 5.0, 40.0], [100, 200, 30]  # (x, y, z)


def write_precomputed(path: Path, vol: np.ndarray, chunk: list[int],
                      scales: tuple[tuple[list[float], np.ndarray], ...] = ()) -> str:
    """A precomputed image of one channel written by TensorStore: `vol` (z, y, x) at RES and
    OFFSET, then each (resolution, volume) of `scales` as a further scale."""
    for res, v, offset in ((RES, vol, OFFSET), *((r, w, [0, 0, 0]) for r, w in scales)):
        t = ts.open({
            "driver": "neuroglancer_precomputed", "kvstore": {"driver": "file",
                                                              "path": str(path) + "/"},
            "multiscale_metadata": {"type": "image", "data_type": str(v.dtype),
                                    "num_channels": 1},
            "scale_metadata": {"size": list(v.shape[::-1]), "resolution": res,
                               "voxel_offset": offset, "chunk_size": chunk,
                               "encoding": "raw"},
            "create": True, "open": True}).result()
        t = t[ts.d[:].translate_to[0]]
        t[...] = v.transpose()[..., None]  # (z, y, x) -> (x, y, z, channel)
    return f"precomputed://{path}"


def read_precomputed(path: Path, scale: int = 0) -> np.ndarray:
    """(C, Z, Y, X) values of a precomputed volume, read by TensorStore alone."""
    t = ts.open({"driver": "neuroglancer_precomputed", "scale_index": scale,
                 "kvstore": {"driver": "file", "path": str(path) + "/"}}).result()
    return np.asarray(t.read().result()).transpose()  # (X, Y, Z, C) -> (C, Z, Y, X)


@pytest.fixture()
def setup(tmp_path: Path) -> dict[str, Any]:
    rng = np.random.default_rng(42)
    layers, params = small_network(rng)
    net = load_network(write_network(tmp_path, layers, params, 1, SCALE))
    vol = rng.integers(0, 256, size=SHAPE).astype(np.uint8)
    half = vol[::2, ::2, ::2].copy()
    return {"layers": layers, "params": params, "net": net, "vol": vol, "half": half,
            "zarr": write_volume(tmp_path / "in.zarr", vol, 3, (6, 7, 8)),
            "pc": write_precomputed(tmp_path / "in.pc", vol, [8, 7, 6],
                                    (([8.0, 10.0, 80.0], half),))}


def _run(setup: dict[str, Any], inp: str | Location, out: str, **kw: Any) -> Any:
    job = SegmentJob(network=setup["net"], input_path=inp, output_path=out, chunks=(6, 7, 8),
                     block=(6, 7, 8), memory_limit_bytes=2**28, **kw)
    return segment(job, backend=make_backend("reference"))


def test_precomputed_in_and_out_equals_the_zarr_run(setup: dict, tmp_path: Path) -> None:
    _run(setup, setup["zarr"], str(tmp_path / "out.zarr"))
    out = tmp_path / "out.pc"
    report = _run(setup, setup["pc"], f"precomputed://{out}")
    assert report.blocks_computed == report.blocks_total >= 8
    got = read_precomputed(out)
    want = np.asarray(zarr.open_array(str(tmp_path / "out.zarr"), mode="r")[...])
    assert got.shape == (2, *SHAPE) and np.array_equal(got, want)
    ref = dense_volume(setup["layers"], setup["params"], setup["vol"][None], "reflect", SCALE)
    assert close(got, ref)
    info = json.loads((out / "info").read_text())
    assert info["type"] == "image" and info["data_type"] == "float32"
    assert info["num_channels"] == 2 and len(info["scales"]) == 1
    scale = info["scales"][0]
    assert scale["resolution"] == RES and scale["voxel_offset"] == OFFSET
    assert scale["size"] == list(SHAPE[::-1]) and scale["chunk_sizes"] == [[8, 7, 6]]
    assert json.loads((out / "znni.json").read_text())["znni"]["input"] == \
        f"precomputed://{tmp_path / 'in.pc'}"
    header, done = read_ledger(Location.parse(f"precomputed://{out}"), ctx=CTX)  # beside the info
    assert (out / "znni-ledger.jsonl").is_file() and len(done) == report.blocks_total
    again = _run(setup, setup["pc"], f"precomputed://{out}")  # resumes: nothing to do
    assert again.blocks_computed == 0


def test_zarr_input_to_precomputed_uint8_with_roi(setup: dict, tmp_path: Path) -> None:
    roi = ((3, 14), (0, 12), (9, 26))
    _run(setup, setup["zarr"], str(tmp_path / "out.zarr"), roi=roi, dtype="uint8")
    out = tmp_path / "roi.pc"
    _run(setup, setup["zarr"], f"precomputed://{out}", roi=roi, dtype="uint8")
    got = read_precomputed(out)
    want = np.asarray(zarr.open_array(str(tmp_path / "out.zarr"), mode="r")[...])
    assert got.dtype == np.uint8 and np.array_equal(got, want)
    inside = (slice(None), *(slice(a, b) for a, b in roi))
    assert got[inside].any()
    outside = got.copy()
    outside[inside] = 0
    assert not outside.any()  # nothing written outside the ROI
    scale = json.loads((out / "info").read_text())["scales"][0]
    assert scale["resolution"] == [1.0, 1.0, 1.0] and scale["voxel_offset"] == [0, 0, 0]


def test_second_scale_by_level_keeps_its_resolution(setup: dict, tmp_path: Path) -> None:
    inp = level_path(Location.parse(setup["pc"]), 1, ctx=CTX)
    out = tmp_path / "mip1.pc"
    _run(setup, inp, f"precomputed://{out}")
    got = read_precomputed(out)
    ref = dense_volume(setup["layers"], setup["params"], setup["half"][None], "reflect", SCALE)
    assert got.shape == (2, *setup["half"].shape) and close(got, ref)
    scale = json.loads((out / "info").read_text())["scales"][0]
    assert scale["resolution"] == [8.0, 10.0, 80.0] and scale["voxel_offset"] == [0, 0, 0]


def test_n5_input_equals_the_zarr_run(setup: dict, tmp_path: Path) -> None:
    n5 = tmp_path / "in.n5"
    t = ts.open({"driver": "n5", "kvstore": {"driver": "file", "path": str(n5) + "/"},
                 "metadata": {"dimensions": list(SHAPE), "blockSize": [5, 6, 7],
                              "dataType": "uint8", "compression": {"type": "raw"}},
                 "create": True}).result()
    t[...] = setup["vol"]
    _run(setup, setup["zarr"], str(tmp_path / "out.zarr"))
    _run(setup, f"n5://{n5}", str(tmp_path / "n5out.zarr"))
    a, b = (np.asarray(zarr.open_array(str(tmp_path / n), mode="r")[...])
            for n in ("out.zarr", "n5out.zarr"))
    assert np.array_equal(a, b)


def test_dask_workers_write_precomputed(setup: dict, tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    out = tmp_path / "dask.pc"  # the workers open both volumes from their paths
    report = _run(setup, setup["pc"], f"precomputed://{out}", scheduler="local:1")
    assert report.blocks_computed == report.blocks_total >= 8
    ref = dense_volume(setup["layers"], setup["params"], setup["vol"][None], "reflect", SCALE)
    assert close(read_precomputed(out), ref)  # the workers' own backend: not bit-equal


def test_segmentation_output_and_conflicting_info(tmp_path: Path) -> None:
    path = Location.parse(f"precomputed://{tmp_path / 'seg.pc'}")
    arr = create_output(path, (1, 4, 5, 6), "uint16", (4, 5, 6), (8.0, 8.0, 40.0), (1, 2, 3),
                        ctx=CTX, volume_type="segmentation")
    labels = np.arange(120, dtype=np.uint16).reshape(1, 4, 5, 6)  # (C, Z, Y, X)
    arr[(slice(None), slice(0, 4), slice(0, 5), slice(0, 6))] = labels
    info = json.loads((tmp_path / "seg.pc" / "info").read_text())
    assert info["type"] == "segmentation" and info["data_type"] == "uint16"
    assert np.array_equal(read_precomputed(tmp_path / "seg.pc"), labels)
    assert existing_chunks(path, (1, 4, 5, 6), "uint16", ctx=CTX,
                           volume_type="segmentation") == (4, 5, 6)
    with pytest.raises(ValueError, match=r"conflicts with this job: type segmentation "
                       r"\(expected image\), num_channels 1 \(expected 2\)"):
        existing_chunks(path, (2, 4, 5, 6), "uint16", ctx=CTX)
    with pytest.raises(ValueError, match="one channel of uint8"):
        create_output(path, (2, 4, 5, 6), "float32", (4, 5, 6), (1.0,) * 3, (0, 0, 0),
                      ctx=CTX, volume_type="segmentation")


def test_preview_reads_a_precomputed_output_and_its_precomputed_input(setup: dict,
                                                                      tmp_path: Path) -> None:
    """`znni preview` of a precomputed output (its input precomputed too, both through
    TensorStore) shows the same slice as the Zarr run's preview, and the dashboard's block
    map the same blocks."""
    from znni.engine.output.preview import preview_png, read_slice

    _run(setup, setup["zarr"], str(tmp_path / "out.zarr"))
    out = Location.parse(f"precomputed://{tmp_path / 'out.pc'}")
    plain = Location.parse(tmp_path / "out.zarr")
    _run(setup, setup["pc"], str(out))
    for axis, index in (("z", None), ("x", 3)):
        got = read_slice(out, axis, index, ctx=CTX)
        want = read_slice(plain, axis, index, ctx=CTX)
        assert (got.index, got.extent) == (want.index, want.extent)
        assert np.array_equal(got.image, want.image) and np.array_equal(got.output, want.output)
    assert preview_png(out, ctx=CTX).startswith(b"\x89PNG")
    from znni.api.blockmap import block_map  # the dashboard's map of the same run

    drawn, want = block_map(out, ctx=CTX), block_map(plain, ctx=CTX)
    assert drawn == want and drawn["done"] == drawn["total"] >= 8


def test_ome_output_of_a_precomputed_input_keeps_its_voxel_size(setup: dict,
                                                                tmp_path: Path) -> None:
    """An OME-Zarr output of a precomputed input at 4 x 5 x 40 nm (x, y, z) says so: its
    scale and translation in nanometres, and its pyramid halves y and x first (z is 8x
    coarser), as for an OME-Zarr input of that voxel size."""
    from znni.engine.io.ome import ome_level

    out = str(tmp_path / "out.ome.zarr")
    _run(setup, setup["pc"], out, output_format="ome-zarr", pyramid=2)
    level0, level2 = (ome_level(Location.parse(out), k, ctx=CTX) for k in (0, 2))
    rz, ry, rx = RES[2], RES[1], RES[0]
    assert level0.scale == (rz, ry, rx) and level0.units == ("nanometer",) * 3
    assert level0.translation == (OFFSET[2] * rz, OFFSET[1] * ry, OFFSET[0] * rx)
    assert level2.scale == (rz, 4 * ry, 4 * rx)  # two halvings of y and x, none of z
    got = np.asarray(zarr.open_array(str(level0.array_location), mode="r")[...])
    _run(setup, setup["zarr"], str(tmp_path / "plain.zarr"))
    assert np.array_equal(got, zarr.open_array(str(tmp_path / "plain.zarr"), mode="r")[...])
