"""The volume formats behind one interface (engine/io/formats): the registry says which
format a location is, and every writable format creates an output, finds it again, refuses
one that does not fit, opens it for block writes and reads back what was written, on real
stores on disk (TensorStore for precomputed, zarr-python for the rest). N5 is read only."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest
import zarr

from znni.engine.context import StoreContext
from znni.engine.geometry import Box
from znni.engine.io import formats
from znni.engine.io.formats import FORMATS, OutputRequest, VolumeFormat, format_of
from znni.engine.io.formats.base import plain_input
from znni.engine.io.volume import open_input, write_box
from znni.engine.location import Location

ts = pytest.importorskip("tensorstore")

CTX = StoreContext()
SHAPE = (1, 10, 12, 14)  # (c, z, y, x) of the outputs written here


def _input(tmp_path: Path) -> Location:
    arr = zarr.create_array(store=str(tmp_path / "in.zarr"), shape=SHAPE[1:], chunks=(5, 6, 7),
                            dtype="uint8", zarr_format=3)
    arr[...] = np.arange(np.prod(SHAPE[1:]), dtype=np.uint64).reshape(SHAPE[1:]) % 251
    return Location.parse(tmp_path / "in.zarr")


def _request(source: Location, steps: list, labels: str | None = None) -> OutputRequest:
    volume = open_input(source, 1, ctx=CTX)
    return OutputRequest(SHAPE, "uint8", (5, 6, 7), steps, volume, {"run": 1}, labels=labels)


def test_every_format_implements_the_whole_interface() -> None:
    abstract = {n for n, f in inspect.getmembers(VolumeFormat) if
                getattr(f, "__isabstractmethod__", False)}
    assert {"open_input", "open_level0", "check_existing", "pyramid", "create_or_open",
            "open_for_writing"} <= abstract
    assert set(FORMATS) == {"zarr", "ome-zarr", "precomputed", "n5"}
    for name, fmt in FORMATS.items():
        assert fmt.name == name
        assert not getattr(type(fmt), "__abstractmethods__", None), name
        assert type(fmt).__module__.startswith("znni.engine.io.formats."), name
    modules = {type(f).__module__ for f in FORMATS.values()}
    assert len(modules) == len(FORMATS)  # one module per format


def test_the_registry_names_the_format_of_a_location(tmp_path: Path) -> None:
    source = _input(tmp_path)
    assert format_of(source, ctx=CTX).name == "zarr"
    zarr.create_group(str(tmp_path / "g.zarr"), zarr_format=3)
    assert format_of(Location.parse(tmp_path / "g.zarr"), ctx=CTX).name == "ome-zarr"
    assert format_of(Location.parse(f"precomputed://{tmp_path}/p"), ctx=CTX).name == \
        "precomputed"
    assert format_of(Location.parse(f"n5://{tmp_path}/n"), ctx=CTX).name == "n5"
    assert format_of(Location.parse(tmp_path / "nothing.zarr"), ctx=CTX).name == "zarr"
    assert formats.existing_format(Location.parse(tmp_path / "nothing.zarr"), ctx=CTX) is None


@pytest.mark.parametrize("name, where", [("zarr", "out.zarr"), ("ome-zarr", "out.ome.zarr"),
                                         ("precomputed", "precomputed://{}/out")])
def test_create_find_write_and_read_back(tmp_path: Path, name: str, where: str) -> None:
    source = _input(tmp_path)
    loc = Location.parse(where.format(tmp_path) if "{}" in where else tmp_path / where)
    fmt = FORMATS[name]
    assert fmt.check_existing(loc, SHAPE, "uint8", None, ctx=CTX) is None
    steps = [(1, 2, 2)] if name != "zarr" else []
    made = fmt.create_or_open(loc, _request(source, steps), ctx=CTX)
    assert len(made.levels) == len(steps)
    assert fmt.check_existing(loc, SHAPE, "uint8", None, ctx=CTX) == (5, 6, 7)
    assert format_of(loc, ctx=CTX).name == name  # what was created reads as its format
    box = Box((0, 6, 7), (5, 12, 14))
    values = np.full((1, *box.shape), 7, np.uint8)
    write_box(fmt.open_for_writing(made.level0_location, ctx=CTX), box, values)
    back = np.asarray(fmt.open_level0(loc, "output", ctx=CTX)[...])
    assert back.shape == SHAPE
    assert (back[(slice(None), *box.slices())] == 7).all() and back.sum() == 7 * values.size
    again = fmt.create_or_open(loc, _request(source, steps), ctx=CTX)  # opened, not recreated
    assert np.asarray(again.level0[...]).sum() == 7 * values.size


@pytest.mark.parametrize("name, where", [("zarr", "out.zarr"), ("ome-zarr", "out.ome.zarr"),
                                         ("precomputed", "precomputed://{}/out")])
def test_an_existing_output_of_another_shape_or_dtype_is_one_sentence(
        tmp_path: Path, name: str, where: str) -> None:
    source = _input(tmp_path)
    loc = Location.parse(where.format(tmp_path) if "{}" in where else tmp_path / where)
    FORMATS[name].create_or_open(loc, _request(source, []), ctx=CTX)
    with pytest.raises(ValueError, match="out") as e:
        FORMATS[name].check_existing(loc, (2, *SHAPE[1:]), "uint8", None, ctx=CTX)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="float32"):
        FORMATS[name].check_existing(loc, SHAPE, "float32", None, ctx=CTX)


def test_zarr_arrays_take_no_pyramid_and_n5_is_read_only(tmp_path: Path) -> None:
    source = _input(tmp_path)
    volume = open_input(source, 1, ctx=CTX)
    with pytest.raises(ValueError, match="--pyramid applies to OME-Zarr"):
        FORMATS["zarr"].pyramid(Location.parse(tmp_path / "o.zarr"), volume, SHAPE, "uint8", 2,
                                exists=False, check=True, ctx=CTX)
    n5 = Location.parse(f"n5://{tmp_path}/o.n5")
    for call in (lambda: FORMATS["n5"].check_existing(n5, SHAPE, "uint8", None, ctx=CTX),
                 lambda: FORMATS["n5"].create_or_open(n5, _request(source, []), ctx=CTX)):
        with pytest.raises(ValueError, match="znni reads N5"):
            call()
    assert not (tmp_path / "o.n5").exists()


def test_labels_make_an_ngff_label_image_and_a_segmentation_volume(tmp_path: Path) -> None:
    source = _input(tmp_path)
    ome = Location.parse(tmp_path / "labels.ome.zarr")
    made = FORMATS["ome-zarr"].create_or_open(ome, _request(source, [], "argmax"), ctx=CTX)
    assert str(made.level0_location).endswith("labels/argmax/0")
    pre = Location.parse(f"precomputed://{tmp_path}/seg")
    FORMATS["precomputed"].create_or_open(pre, _request(source, [], "argmax"), ctx=CTX)
    info = (tmp_path / "seg" / "info").read_text()
    assert '"segmentation"' in info


def test_plain_input_checks_dimensions_and_channels(tmp_path: Path) -> None:
    loc = Location.parse(tmp_path / "x")
    with pytest.raises(ValueError, match="expects 2 input channels"):
        plain_input(loc, np.zeros((3, 4, 5), np.uint8), 2)
    with pytest.raises(ValueError, match="has 3 channels"):
        plain_input(loc, np.zeros((3, 3, 4, 5), np.uint8), 2)
    with pytest.raises(ValueError, match="5 dimensions"):
        plain_input(loc, np.zeros((1, 1, 3, 4, 5), np.uint8), 1)
    v = plain_input(loc, np.zeros((2, 3, 4, 5), np.float32), 2)
    assert (v.channels, v.shape, v.has_channel_axis) == (2, (3, 4, 5), True)
