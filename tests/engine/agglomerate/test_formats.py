"""`znni agglomerate` writes where `znni segment` writes: an OME-Zarr output is an NGFF
label image, a precomputed:// output a neuroglancer segmentation, and `znni view` shows
each (and a plain Zarr array of ids) as a segmentation layer; uint8 affinities from an
OME-Zarr image read as they are stored."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from support.agglomerate_ref import blockwise, smooth_affinities

from znni.cli import main
from znni.engine.context import StoreContext
from znni.engine.location import Location
from znni.engine.output.viewer import view_state

SHAPE = (16, 18, 20)


@pytest.fixture
def affs(tmp_path: Path) -> tuple[np.ndarray, str]:
    values = smooth_affinities(SHAPE, 31)
    path = tmp_path / "affs.zarr"
    zarr.create_array(str(path), shape=values.shape, chunks=(3, 8, 8, 8),
                      dtype="float32")[...] = values
    return values, str(path)


def _layer_kind(out: str) -> str:
    state = view_state(Location.parse(out), ctx=StoreContext())
    return str(state["layers"][-1]["type"])


def test_ome_zarr_output_is_a_label_image(tmp_path: Path, affs) -> None:
    values, path = affs
    out = tmp_path / "seg.ome.zarr"
    assert main(["agglomerate", path, str(out), "--output-format", "ome-zarr", "--block",
                 "8,8,8", "--quiet"]) == 0
    root = zarr.open_group(str(out), mode="r")
    labels = np.asarray(root["labels/segmentation/0"][...])
    _, _, (expected,) = blockwise(values, SHAPE, [0.5])
    assert np.array_equal(labels[0], expected)
    assert "image-label" in root["labels/segmentation"].attrs.get("ome", {})
    assert _layer_kind(str(out)) == "segmentation"


def test_precomputed_output_is_a_segmentation(tmp_path: Path, affs) -> None:
    pytest.importorskip("tensorstore")
    values, path = affs
    out = f"precomputed://{tmp_path / 'seg'}"
    assert main(["agglomerate", path, out, "--block", "8,8,8", "--quiet"]) == 0
    import json

    info = json.loads((tmp_path / "seg" / "info").read_text())
    assert info["type"] == "segmentation" and info["data_type"] == "uint64"
    import tensorstore as ts

    store = ts.open({"driver": "neuroglancer_precomputed",
                     "kvstore": f"file://{tmp_path / 'seg'}"}).result()
    stored = np.asarray(store.read().result())[..., 0].transpose(2, 1, 0)  # (x,y,z) -> (z,y,x)
    _, _, (expected,) = blockwise(values, SHAPE, [0.5])
    assert np.array_equal(stored, expected)
    assert _layer_kind(out) == "segmentation"


def test_a_plain_zarr_array_of_ids_is_a_segmentation_layer(tmp_path: Path, affs) -> None:
    _, path = affs
    out = tmp_path / "seg.zarr"
    assert main(["agglomerate", path, str(out), "--quiet"]) == 0
    assert _layer_kind(str(out)) == "segmentation"
    assert _layer_kind(path) == "image"
