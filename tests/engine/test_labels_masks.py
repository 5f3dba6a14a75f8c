"""Labels, masks and empty blocks (issue 42, parts 2 and 3) on real Zarr stores.

Labels are checked against numpy's argmax / threshold of the float output of a separate
run; masked and empty-block runs against the unmasked run (inside) and 0 (outside), with
the blocks computed counted from the report and from the engine's trace.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from support.engine_ref import small_network, write_network, write_volume

from znni.engine.job import SegmentJob
from znni.engine.output.labels import LabelSpec, parse_labels
from znni.engine.segment import check_and_plan, segment
from znni.engine.workers.base import TRACE_ENV
from znni.model.network import load_network
from znni.primitives.backends import make_backend

SHAPE, BLOCK, FACTOR = (32, 32, 32), (8, 8, 8), 4  # 64 blocks; the mask at 1/4 per axis
TOTAL = 64


@pytest.fixture()
def volumes(tmp_path: Path) -> dict:
    """A 2-class network, an input whose z < 8 slab is all 0, a mask (8^3: voxel = 4^3 input
    voxels) off for x >= 20, and the float output of a plain run."""
    rng = np.random.default_rng(42)
    layers, params = small_network(rng)
    net = load_network(write_network(tmp_path, layers, params, 1, 1 / 255, -0.25))
    vol = rng.integers(1, 256, size=SHAPE).astype(np.uint8)
    vol[:8] = 0  # the first layer of blocks (z) reads only zeros in its write box
    mask = np.ones((8, 8, 8), np.uint8)
    mask[:, :, 5:] = 0  # x >= 20 off: blocks x in [16, 24) partly, x >= 24 wholly outside
    base = dict(network=net, input_path=write_volume(tmp_path / "in.zarr", vol, 3, (8, 8, 8)),
                chunks=BLOCK, block=BLOCK, memory_limit_bytes=2**28)
    float_out = str(tmp_path / "float.zarr")
    report = segment(SegmentJob(output_path=float_out, **base), backend=make_backend("reference"))
    assert report.blocks_computed == TOTAL and report.blocks_skipped == 0
    return {"base": base, "float": zarr.open_array(float_out)[...], "vol": vol,
            "mask": write_volume(tmp_path / "mask.zarr", mask, 3, (4, 4, 4)),
            "inside": np.kron(mask, np.ones((FACTOR,) * 3, np.uint8)).astype(bool)}


def _run(tmp: Path, name: str, volumes: dict, **kw) -> tuple:
    job = SegmentJob(output_path=str(tmp / name), **volumes["base"], **kw)
    return segment(job, backend=make_backend("reference")), str(tmp / name)


def test_label_spec_parses_and_applies_as_numpy() -> None:
    values = np.random.default_rng(0).random((3, 4, 5, 6)).astype(np.float32)  # (C, Z, Y, X)
    got = parse_labels("argmax").apply(values)
    assert got.dtype == np.uint8 and np.array_equal(got[0], np.argmax(values, axis=0))
    spec = parse_labels("threshold:0.25:2")
    assert spec == LabelSpec("threshold", 0.25, 2)
    assert np.array_equal(spec.apply(values)[0], (values[2] > 0.25).astype(np.uint8))
    assert parse_labels("threshold:0.5") == LabelSpec("threshold", 0.5, 0)
    assert LabelSpec("argmax").dtype(300) == "uint16" and LabelSpec("argmax").dtype(256) == "uint8"
    for bad, words in [("threshold", "needs a number"), ("threshold:x", "needs a number"),
                       ("threshold:0.5:c", "channel"), ("argmin", "is not one of"),
                       ("threshold:nan", "finite")]:
        with pytest.raises(ValueError, match=words):
            parse_labels(bad)


def test_labels_equal_numpy_of_the_float_run(tmp_path: Path, volumes: dict) -> None:
    ref = volumes["float"]  # (2, Z, Y, X)
    report, out = _run(tmp_path, "argmax.zarr", volumes, labels="argmax")
    got = zarr.open_array(out)
    assert got.shape == (1, *SHAPE) and got.dtype == np.uint8
    assert np.array_equal(got[0], np.argmax(ref, axis=0))
    assert report.blocks_computed == TOTAL
    _, out = _run(tmp_path, "thr.zarr", volumes, labels="threshold:0.5:1")
    assert np.array_equal(zarr.open_array(out)[0], (ref[1] > 0.5).astype(np.uint8))
    prov = zarr.open_array(out).attrs["znni"]
    assert prov["labels"] == "threshold:0.5:1" and prov["dtype"] == "uint8"


def test_ome_zarr_labels_image_with_nearest_levels(tmp_path: Path, volumes: dict) -> None:
    from ome_zarr.io import parse_url
    from ome_zarr.reader import Label, Reader

    _, out = _run(tmp_path, "lab.ome.zarr", volumes, labels="argmax", output_format="ome-zarr",
                  pyramid=2)
    group = zarr.open_group(out, mode="r")
    assert group["labels"].attrs["ome"]["labels"] == ["argmax"]
    image = group["labels/argmax"].attrs["ome"]
    assert image["image-label"]["source"] == {"image": "../../"}
    level0 = np.argmax(volumes["float"], axis=0)[None]  # (1, Z, Y, X)
    assert np.array_equal(group["labels/argmax/0"][...], level0)
    # nearest, never a mean: each coarse voxel is the first of its 2x2x2 (twice: 4x4x4)
    assert np.array_equal(group["labels/argmax/1"][...], level0[:, ::2, ::2, ::2])
    assert np.array_equal(group["labels/argmax/2"][...], level0[:, ::4, ::4, ::4])
    nodes = list(Reader(parse_url(out))())
    labels = [n for n in nodes if any(isinstance(s, Label) for s in n.specs)]
    assert len(labels) == 1
    assert [tuple(d.shape) for d in labels[0].data] == [(1, 32, 32, 32), (1, 16, 16, 16),
                                                         (1, 8, 8, 8)]
    assert np.array_equal(np.asarray(labels[0].data[1]), level0[:, ::2, ::2, ::2])


def _expected_counts(vol: np.ndarray, inside: np.ndarray) -> tuple[int, int]:
    """(blocks computed, blocks skipped), from the volumes directly: a block is skipped when
    its write box is wholly outside the mask or its input there is all 0."""
    computed = 0
    for z in range(0, SHAPE[0], 8):
        for y in range(0, SHAPE[1], 8):
            for x in range(0, SHAPE[2], 8):
                box = np.s_[z:z + 8, y:y + 8, x:x + 8]
                computed += bool(inside[box].any() and vol[box].any())
    return computed, TOTAL - computed


def test_mask_and_empty_blocks_cut_the_compute(tmp_path: Path, volumes: dict,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    trace = tmp_path / "trace"
    monkeypatch.setenv(TRACE_ENV, str(trace))
    vol, inside, ref = volumes["vol"], volumes["inside"], volumes["float"]
    computed, skipped = _expected_counts(vol, inside)
    assert (computed, skipped) == (36, 28)  # 16 outside the mask, 12 more empty
    report, out = _run(tmp_path, "masked.zarr", volumes, mask_path=volumes["mask"],
                       skip_empty=0.0)
    assert (report.blocks_computed, report.blocks_skipped) == (computed, skipped)
    assert len(trace.read_text().splitlines()) == computed  # the workers computed only those
    keep = inside & (np.arange(SHAPE[0]) >= 8)[:, None, None]  # inside, not in the empty slab
    got = zarr.open_array(out)[...]
    assert np.array_equal(got[:, keep], ref[:, keep])  # the unmasked run's values, bit for bit
    assert not got[:, ~keep].any()  # the fill value elsewhere
    assert report.plan["job_seconds"]["skipped_blocks"] == 16  # the plan knows the mask's
    # with labels: 0 wherever a block was skipped or the mask is off
    report, out = _run(tmp_path, "masked-labels.zarr", volumes, mask_path=volumes["mask"],
                       skip_empty=0.0, labels="argmax")
    assert report.blocks_skipped == skipped
    got = zarr.open_array(out)[0]
    assert np.array_equal(got, np.where(keep, np.argmax(ref, axis=0), 0))


def test_mask_alone_and_skip_empty_alone(tmp_path: Path, volumes: dict) -> None:
    inside, ref = volumes["inside"], volumes["float"]
    report, out = _run(tmp_path, "mask-only.zarr", volumes, mask_path=volumes["mask"])
    assert (report.blocks_computed, report.blocks_skipped) == (48, 16)
    got = zarr.open_array(out)[...]
    assert np.array_equal(got[:, inside], ref[:, inside]) and not got[:, ~inside].any()
    report, out = _run(tmp_path, "empty-only.zarr", volumes, skip_empty=0.0)
    assert (report.blocks_computed, report.blocks_skipped) == (48, 16)
    got = zarr.open_array(out)[...]
    assert not got[:, :8].any() and np.array_equal(got[:, 8:], ref[:, 8:])
    # another background value: nothing is all 7, so every block is computed
    report, _ = _run(tmp_path, "seven.zarr", volumes, skip_empty=7.0)
    assert report.blocks_skipped == 0


def test_resume_refuses_other_options_and_keeps_output(tmp_path: Path, volumes: dict) -> None:
    _, out = _run(tmp_path, "r.zarr", volumes, mask_path=volumes["mask"], labels="argmax")
    with pytest.raises(ValueError, match="labels differs"):
        check_and_plan(SegmentJob(output_path=out, **volumes["base"], labels="threshold:0.5",
                                  mask_path=volumes["mask"]))
    with pytest.raises(ValueError, match="mask"):
        check_and_plan(SegmentJob(output_path=out, **volumes["base"], labels="argmax"))
    before = zarr.open_array(out)[...]
    report, _ = _run(tmp_path, "r.zarr", volumes, mask_path=volumes["mask"], labels="argmax")
    assert report.blocks_computed == 0 and report.blocks_skipped == 0  # all done already
    assert np.array_equal(zarr.open_array(out)[...], before)


@pytest.mark.parametrize("kw, words", [
    ({"labels": "threshold"}, "needs a number after threshold"),
    ({"labels": "threshold:0.5:2"}, "channel 2 is out of range"),
    ({"labels": "argmax", "dtype": "uint8"}, "leave out --dtype uint8"),
    ({"mask_path": "MISSING"}, "does not exist"),
    ({"mask_path": "BAD"}, "does not divide"),
    ({"skip_empty": float("nan")}, "finite"),
])
def test_bad_options_are_refused_before_anything_is_written(
        tmp_path: Path, volumes: dict, kw: dict, words: str) -> None:
    if kw.get("mask_path") == "MISSING":
        kw = {**kw, "mask_path": str(tmp_path / "nothing.zarr")}
    if kw.get("mask_path") == "BAD":
        kw = {**kw, "mask_path": write_volume(tmp_path / "m3.zarr", np.ones((3, 8, 8), "u1"), 3,
                                              (3, 8, 8))}
    out = tmp_path / "never.zarr"
    with pytest.raises(ValueError, match=words) as e:
        segment(SegmentJob(output_path=str(out), **volumes["base"], **kw))
    assert "\n" not in str(e.value) and not out.exists()


def test_argmax_of_one_channel_is_refused_with_a_hint() -> None:
    with pytest.raises(ValueError, match="use --labels threshold:T"):
        LabelSpec("argmax").check(1)


@pytest.mark.slow
def test_dask_local_cluster_skips_and_labels_as_the_local_run(
        tmp_path: Path, volumes: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZNNI_BACKEND", "reference")  # the workers' backend
    opts = dict(mask_path=volumes["mask"], skip_empty=0.0, labels="argmax")
    local, out_local = _run(tmp_path, "local.zarr", volumes, **opts)
    job = SegmentJob(output_path=str(tmp_path / "dask.zarr"), scheduler="local:2",
                     **volumes["base"], **opts)
    report = segment(job)
    assert (report.blocks_computed, report.blocks_skipped) == (36, 28)
    assert (local.blocks_computed, local.blocks_skipped) == (36, 28)
    assert np.array_equal(zarr.open_array(str(job.output_path))[...],
                          zarr.open_array(out_local)[...])


def test_precomputed_labels_output_is_a_segmentation(tmp_path: Path, volumes: dict) -> None:
    """A precomputed:// output of labels is neuroglancer's `segmentation` type, read back by
    TensorStore equal to the Zarr run's labels."""
    import json

    import tensorstore as ts

    path = tmp_path / "seg"
    job = SegmentJob(output_path=f"precomputed://{path}", labels="argmax",
                     mask_path=volumes["mask"], **volumes["base"])
    assert segment(job, backend=make_backend("reference")).blocks_skipped == 16
    info = json.loads((path / "info").read_text())
    assert info["type"] == "segmentation" and info["data_type"] == "uint8"
    store = ts.open({"driver": "neuroglancer_precomputed", "kvstore": f"file://{path}"}).result()
    got = np.asarray(store.read().result())[..., 0].transpose(2, 1, 0)  # (x, y, z) -> (z, y, x)
    expect = np.where(volumes["inside"], np.argmax(volumes["float"], axis=0), 0)
    assert np.array_equal(got, expect)


def test_windowed_model_labels_and_mask_equal_its_float_run(tmp_path: Path) -> None:
    """A padded (windowed, MONAI-blended) ONNX model: labels and the mask wrap its worker as
    they wrap MPF's; read boxes there are the windows' (clipped to the volume)."""
    torch = pytest.importorskip("torch")
    from znni.model.loading import load_model

    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Conv3d(1, 3, 3, padding=1), torch.nn.Softmax(dim=1))
    torch.onnx.export(net.eval(), (torch.zeros(1, 1, 8, 8, 8),), tmp_path / "w.onnx",
                      input_names=["x"], dynamo=False,
                      dynamic_axes={"x": {2: "z", 3: "y", 4: "x"}})
    model = load_model(tmp_path / "w.onnx", scale=1 / 255)
    assert model.mode == "windowed"
    vol = np.random.default_rng(3).integers(1, 256, size=(16, 16, 16)).astype(np.uint8)
    vol[8:] = 0
    mask = np.ones((4, 4, 4), np.uint8)
    mask[:, :2] = 0  # y < 8 off
    base = dict(network=model, input_path=write_volume(tmp_path / "in.zarr", vol, 3, (8,) * 3),
                window=(8, 8, 8), chunks=(8, 8, 8), block=(8, 8, 8))
    segment(SegmentJob(output_path=str(tmp_path / "f.zarr"), **base))
    job = SegmentJob(output_path=str(tmp_path / "l.zarr"), labels="argmax", skip_empty=0.0,
                     mask_path=write_volume(tmp_path / "m.zarr", mask, 3, (4, 4, 4)), **base)
    report = segment(job)
    assert (report.blocks_computed, report.blocks_skipped) == (2, 6)
    keep = np.zeros((16, 16, 16), bool)
    keep[:8, 8:] = True
    expect = np.where(keep, np.argmax(zarr.open_array(str(tmp_path / "f.zarr"))[...], 0), 0)
    assert np.array_equal(zarr.open_array(str(job.output_path))[0], expect)


def test_masks_of_bool_4d_and_ome_zarr_levels_cut_the_same_blocks(tmp_path: Path,
                                                                   volumes: dict) -> None:
    """The same mask as a full-resolution bool (1, z, y, x) array and as level 1 (1/4 per
    axis) of an OME-Zarr image written by ome-zarr-py: the same blocks skipped, the same
    output."""
    import warnings

    from ome_zarr.format import FormatV05
    from ome_zarr.writer import write_multiscale

    inside = volumes["inside"]
    full = write_volume(tmp_path / "full.zarr", inside[None], 3, (1, 16, 16, 16))
    group = zarr.open_group(str(tmp_path / "mask.ome.zarr"), mode="w", zarr_format=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        levels = [inside[::2, ::2, ::2].astype(np.uint8), inside[::4, ::4, ::4].astype(np.uint8)]
        write_multiscale(levels, group, fmt=FormatV05(), axes="zyx",
                         storage_options={"chunks": (8, 8, 8)})
    outputs = []
    for i, mask in enumerate((full, str(tmp_path / "mask.ome.zarr/s1"))):
        report, out = _run(tmp_path, f"m{i}.zarr", volumes, mask_path=mask)
        assert (report.blocks_computed, report.blocks_skipped) == (48, 16)
        outputs.append(zarr.open_array(out)[...])
    assert np.array_equal(outputs[0], outputs[1])
    assert np.array_equal(outputs[0][:, inside], volumes["float"][:, inside])
