"""The store memo of a run's setup (`io/memo.py`), against the real S3-API server (moto):
answers are asked once inside `StoreContext.remembering()`, writes through znni's stores
replace or forget them, and nothing is remembered by a context without a memo or after
the scope."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import zarr

from znni.engine.context import StoreContext
from znni.engine.io.stores import (
    context_for,
    list_names,
    read_bytes,
    remove_tree,
    write_bytes,
    zarr_store,
)
from znni.engine.io.volume import open_output_array
from znni.engine.io.zarr_arrays import open_zarr_array
from znni.engine.location import Location

pytestmark = pytest.mark.usefixtures("s3_env")


def test_reads_and_listings_are_asked_once_while_the_memo_is_open(s3) -> None:  # noqa: ANN001
    plain = StoreContext()
    url = Location.parse(s3.prefix()).join("memo")
    write_bytes(url.join("a"), b"1", ctx=plain)
    with plain.remembering() as setup:
        with setup.remembering() as inner:
            assert inner is setup and setup.memo is not None  # nested: one memo
        assert read_bytes(url.join("a"), ctx=setup) == b"1"
        assert list_names(url, ctx=setup) == ["a"]
        s3.client("s3").delete_object(Bucket=url.bucket, Key=url.key + "/a")  # behind znni's back
        assert read_bytes(url.join("a"), ctx=setup) == b"1"  # remembered
        assert list_names(url, ctx=setup) == ["a"]
        assert read_bytes(url.join("a"), ctx=plain) is None  # no memo: asked
        assert list_names(url, ctx=plain) == []
    assert read_bytes(url.join("a"), ctx=setup) is None  # the scope ended: asked
    assert list_names(url, ctx=setup) == []


def test_writes_with_the_memo_replace_or_forget_what_they_change(s3) -> None:  # noqa: ANN001
    with StoreContext().remembering() as ctx:
        _writes_replace_or_forget(s3, ctx)


def _writes_replace_or_forget(s3, ctx: StoreContext) -> None:  # noqa: ANN001
    url = Location.parse(s3.prefix()).join("memo")
    assert read_bytes(url.join("a"), ctx=ctx) is None and list_names(url, ctx=ctx) == []
    write_bytes(url.join("a"), b"2", ctx=ctx)
    assert read_bytes(url.join("a"), ctx=ctx) == b"2" and list_names(url, ctx=ctx) == ["a"]
    write_bytes(url.join("sub", "b"), b"3", ctx=ctx)
    assert sorted(list_names(url, ctx=ctx)) == ["a", "sub"]
    remove_tree(url.join("sub"), ctx=ctx)
    assert list_names(url, ctx=ctx) == ["a"]
    assert read_bytes(url.join("sub", "b"), ctx=ctx) is None


def test_zarr_writes_with_the_memo_are_seen_by_later_opens(s3) -> None:  # noqa: ANN001
    with StoreContext().remembering() as ctx:
        url = _zarr_writes(s3, ctx)
    assert open_zarr_array(url, "input", ctx=StoreContext())[0].tolist() == [9] * 5
    bad = Location.parse(s3.prefix()).join("bad.zarr")
    write_bytes(bad.join("zarr.json"), b'{"zarr_format": 3, "node_type": "array"}',
                ctx=StoreContext())
    with StoreContext().remembering() as remembering:
        assert read_bytes(bad.join("zarr.json"), ctx=remembering) is not None
        with pytest.raises(ValueError, match="is not a Zarr array"):
            open_zarr_array(bad, "input", ctx=remembering)  # zarr's own open says what is wrong


def _zarr_writes(s3, ctx: StoreContext) -> Location:  # noqa: ANN001
    """Create, write and reopen an array with `ctx`; returns its URL."""
    url = Location.parse(s3.prefix()).join("arr.zarr")
    assert read_bytes(url.join("zarr.json"), ctx=ctx) is None
    arr = zarr.create_array(store=zarr_store(url, read_only=False, ctx=ctx), shape=(4, 5),
                            chunks=(2, 5), dtype="uint8", fill_value=0)
    arr[...] = np.arange(20, dtype=np.uint8).reshape(4, 5)
    arr.attrs.update({"k": 1})
    again = open_zarr_array(url, "input", ctx=ctx)
    assert again.attrs["k"] == 1 and again.shape == (4, 5)
    np.testing.assert_array_equal(again[...], arr[...])
    out = open_output_array(url, ctx=ctx)
    out[0] = 9
    return url


def test_a_context_pickles_to_its_options_alone() -> None:
    """What a Dask worker receives in a block spec: the options, no caches, no memo."""
    ctx = context_for([Location.parse(t) for t in ("s3://b/in.zarr", "gs://c/out.zarr", "/local/x")],
                      {"anon": True})
    assert dict(ctx.options) == {"s3://b": {"anon": True}, "gs://c": {"anon": True}}
    ctx.caches.buckets_found.add("gs://c")
    with ctx.remembering() as setup:
        copy = pickle.loads(pickle.dumps(setup))
    assert copy == ctx and copy.memo is None and not copy.caches.buckets_found
    assert context_for([Location.parse("/local/x")], {"anon": True}).options == {}
