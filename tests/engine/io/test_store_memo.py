"""The store memo of a run's setup (`store_memo.py`), against the real S3-API server (moto):
answers are asked once inside `memo()`, writes through znni's stores replace or forget them,
and nothing is remembered outside the scope."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from znni.engine.io.memo import memo
from znni.engine.io.stores import join, list_names, read_bytes, remove_tree, write_bytes, zarr_store
from znni.engine.io.volume import open_output_array, open_zarr_array

pytestmark = pytest.mark.usefixtures("s3_env")


def test_reads_and_listings_are_asked_once_inside_the_scope_only(s3) -> None:  # noqa: ANN001
    url = join(s3.prefix(), "memo")
    write_bytes(join(url, "a"), b"1")
    with memo():
        assert read_bytes(join(url, "a")) == b"1" and list_names(url) == ["a"]
        s3.client("s3").delete_object(Bucket=url.split("/")[2],
                                      Key=url.split("/", 3)[3] + "/a")  # behind znni's back
        assert read_bytes(join(url, "a")) == b"1" and list_names(url) == ["a"]  # remembered
    assert read_bytes(join(url, "a")) is None and list_names(url) == []  # outside: asked


def test_writes_inside_the_scope_replace_or_forget_what_they_change(s3) -> None:  # noqa: ANN001
    url = join(s3.prefix(), "memo")
    with memo():
        assert read_bytes(join(url, "a")) is None and list_names(url) == []
        write_bytes(join(url, "a"), b"2")
        assert read_bytes(join(url, "a")) == b"2" and list_names(url) == ["a"]
        write_bytes(join(url, "sub", "b"), b"3")
        assert sorted(list_names(url)) == ["a", "sub"]
        remove_tree(join(url, "sub"))
        assert list_names(url) == ["a"] and read_bytes(join(url, "sub", "b")) is None


def test_zarr_writes_in_the_scope_are_seen_by_later_opens(s3) -> None:  # noqa: ANN001
    url = join(s3.prefix(), "arr.zarr")
    with memo():
        assert read_bytes(join(url, "zarr.json")) is None
        arr = zarr.create_array(store=zarr_store(url, read_only=False), shape=(4, 5),
                                chunks=(2, 5), dtype="uint8", fill_value=0)
        arr[...] = np.arange(20, dtype=np.uint8).reshape(4, 5)
        arr.attrs.update({"k": 1})
        again = open_zarr_array(url, "input")
        assert again.attrs["k"] == 1 and again.shape == (4, 5)
        np.testing.assert_array_equal(again[...], arr[...])
        out = open_output_array(url)
        out[0] = 9
    assert open_zarr_array(url, "input")[0].tolist() == [9] * 5
    bad = join(s3.prefix(), "bad.zarr")
    write_bytes(join(bad, "zarr.json"), b'{"zarr_format": 3, "node_type": "array"}')
    assert read_bytes(join(bad, "zarr.json")) is not None
    with memo(), pytest.raises(ValueError, match="is not a Zarr array"):
        open_zarr_array(bad, "input")  # zarr's own open says what is wrong
