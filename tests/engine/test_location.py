"""`Location` (engine/location.py): a volume's location parsed once, at the boundary, into a
frozen value: local paths, s3/gs/http(s) URLs, precomputed:// and n5:// volumes; related
locations (join, parent, beside, resolved, with_level); one sentence for malformed text;
passwords masked in what is printed; pickled whole (Dask workers receive it)."""

from __future__ import annotations

import os
import pickle
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest

from znni.engine.location import Location

# text -> (scheme, bucket, key, driver, level, url, root)
PARSED = {
    "data/em.zarr/raw": ("file", "", "data/em.zarr/raw", "zarr", None, "data/em.zarr/raw", ""),
    "/abs/em.zarr": ("file", "", "/abs/em.zarr", "zarr", None, "/abs/em.zarr", ""),
    "s3://bucket/em.zarr": ("s3", "bucket", "em.zarr", "zarr", None, "s3://bucket/em.zarr",
                            "s3://bucket"),
    "s3://bucket/a/b.zarr/": ("s3", "bucket", "a/b.zarr", "zarr", None,
                              "s3://bucket/a/b.zarr/", "s3://bucket"),
    "s3://bucket": ("s3", "bucket", "", "zarr", None, "s3://bucket", "s3://bucket"),
    "s3://bucket/": ("s3", "bucket", "", "zarr", None, "s3://bucket/", "s3://bucket"),
    "gs://b/k": ("gs", "b", "k", "zarr", None, "gs://b/k", "gs://b"),
    "gcs://b/k": ("gs", "b", "k", "zarr", None, "gcs://b/k", "gcs://b"),  # gcs as written
    "GS://b/k": ("gs", "b", "k", "zarr", None, "GS://b/k", "gs://b"),  # scheme lower case
    "http://127.0.0.1:8000/x.zarr": ("http", "127.0.0.1:8000", "x.zarr", "zarr", None,
                                     "http://127.0.0.1:8000/x.zarr", "http://127.0.0.1:8000"),
    "https://host/data/x.zarr/": ("https", "host", "data/x.zarr", "zarr", None,
                                  "https://host/data/x.zarr/", "https://host"),
    "precomputed://gs://b/em#mip=2": ("gs", "b", "em", "precomputed", 2, "gs://b/em", "gs://b"),
    "precomputed://s3://b/em/": ("s3", "b", "em", "precomputed", None, "s3://b/em/", "s3://b"),
    "precomputed:///data/em.pc#mip=0": ("file", "", "/data/em.pc", "precomputed", 0,
                                        "/data/em.pc", ""),
    "n5:///data/x.n5": ("file", "", "/data/x.n5", "n5", None, "/data/x.n5", ""),
    "n5://s3://b/x.n5": ("s3", "b", "x.n5", "n5", None, "s3://b/x.n5", "s3://b"),
}


@pytest.mark.parametrize("text", PARSED)
def test_parse_splits_scheme_bucket_key_driver_and_level(text: str) -> None:
    loc = Location.parse(text)
    got = (loc.scheme, loc.bucket, loc.key, loc.driver, loc.level, loc.url, loc.root)
    assert got == PARSED[text]
    assert str(loc) == text  # the text as given
    assert loc.is_local == (loc.scheme == "file") and loc.is_remote == (not loc.is_local)
    assert loc.is_tensorstore == (loc.driver in ("precomputed", "n5"))
    assert loc.scale == (loc.level or 0)


def test_a_path_object_parses_as_its_text(tmp_path: Path) -> None:
    loc = Location.parse(tmp_path / "in.zarr")
    assert loc.is_local and loc.url == str(tmp_path / "in.zarr") == str(loc)
    assert os.fspath(loc) == str(tmp_path / "in.zarr")  # a local location is a path
    assert os.fspath(Location.parse(f"precomputed://{tmp_path}/v#mip=1")) == f"{tmp_path}/v"
    with pytest.raises(TypeError, match="is a URL, not a local path"):
        os.fspath(Location.parse("s3://b/k"))


def test_kinds_of_store() -> None:
    assert Location.parse("https://h/x").is_http and Location.parse("http://h/x").is_http
    assert not Location.parse("s3://b/x").is_http
    assert [Location.parse(t).writable_scheme for t in ("/x", "s3://b/x", "gs://b/x",
                                                        "https://h/x")] == [True] * 3 + [False]


def test_bare_drops_the_driver_and_the_scale() -> None:
    pc = Location.parse("precomputed://gs://b/em#mip=2")
    bare = pc.bare()
    assert (bare.driver, bare.level, str(bare), bare.url) == ("zarr", None, "gs://b/em",
                                                              "gs://b/em")
    assert bare == Location.parse("gs://b/em") and bare != pc
    n5 = Location.parse("n5://s3://b/x.n5").bare()
    assert (n5.driver, str(n5)) == ("zarr", "s3://b/x.n5")
    plain = Location.parse("data/x.zarr")
    assert plain.bare() is plain


def test_join_names_an_object_under_it() -> None:
    assert str(Location.parse("s3://b/k/").join("a", "b")) == "s3://b/k/a/b"
    joined = Location.parse("s3://b/k").join("zarr.json")
    assert (joined.bucket, joined.key, joined.url) == ("b", "k/zarr.json", "s3://b/k/zarr.json")
    assert Location.parse("s3://b").join("a").key == "a"
    assert Location.parse("s3://b/").join("a").url == "s3://b/a"
    local = Location.parse("/x/y").join("a", "b")
    assert local.is_local and str(local) == local.url == local.key == "/x/y/a/b"
    info = Location.parse("precomputed://gs://b/em#mip=2").join("info")  # where it lives
    assert (str(info), info.driver, info.level) == ("gs://b/em/info", "zarr", None)


def test_parent_and_name() -> None:
    assert str(Location.parse("s3://b/k/a").parent()) == "s3://b/k"
    assert str(Location.parse("s3://b/k").parent()) == "s3://b"
    top = Location.parse("s3://b/").parent()  # a bucket's root is its own parent
    assert (str(top), top.key) == ("s3://b", "") and top == Location.parse("s3://b")
    assert str(Location.parse("/x/y/").parent()) == "/x"
    assert str(Location.parse("precomputed://s3://b/d/em#mip=1").parent()) == "s3://b/d"
    assert Location.parse("s3://b/k/x.zarr/").name == "x.zarr"
    assert Location.parse("/data/em.zarr/0").name == "0"
    assert Location.parse("precomputed://gs://b/em/#mip=1").name == "em"


def test_beside_names_an_object_next_to_it() -> None:
    lock = Location.parse("s3://b/out.zarr/").beside(".znni-lock")
    assert (str(lock), lock.key) == ("s3://b/out.zarr.znni-lock", "out.zarr.znni-lock")
    assert str(Location.parse("precomputed://gs://b/em#mip=2").beside(".znni-lock")) == \
        "gs://b/em.znni-lock"
    assert str(Location.parse("/x/out.zarr").beside(".lock")) == "/x/out.zarr.lock"


def test_two_spellings_of_one_volume_resolve_equal(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "d")
    monkeypatch.chdir(tmp_path)
    spellings = ["d/x.zarr", "./d/x.zarr/", str(tmp_path / "link" / "x.zarr"),
                 f"{tmp_path}/d/../d/x.zarr"]
    resolved = {Location.parse(t).resolved() for t in spellings}
    assert len(resolved) == 1
    (one,) = resolved
    assert one.url == str((tmp_path / "d" / "x.zarr").resolve()) == str(one)
    assert Location.parse("d/x.zarr") != Location.parse("./d/x.zarr")  # unresolved: as given
    url = Location.parse("s3://b/k/").resolved()
    assert (url.url, str(url)) == ("s3://b/k", "s3://b/k")
    assert url == Location.parse("s3://b/k").resolved()
    pc = Location.parse("precomputed://s3://b/em/#mip=1").resolved()  # driver and scale kept
    assert (str(pc), pc.driver, pc.level) == ("precomputed://s3://b/em#mip=1", "precomputed", 1)
    local_pc = Location.parse(f"precomputed://{tmp_path}/d/../d/v#mip=2").resolved()
    assert str(local_pc) == f"precomputed://{(tmp_path / 'd' / 'v').resolve()}#mip=2"


def test_with_level_names_a_scale_of_a_precomputed_volume() -> None:
    pc = Location.parse("precomputed://gs://b/em")
    three = pc.with_level(3)
    assert (three.level, three.scale, str(three)) == (3, 3, "precomputed://gs://b/em#mip=3")
    assert three.bare() == pc.bare() and three != pc
    assert Location.parse("precomputed://gs://b/em#mip=1").with_level(0).level == 0
    assert Location.parse("precomputed://gs://b/em#mip=3") == three


def test_with_level_refusals() -> None:
    with pytest.raises(ValueError, match=r"n5://x\.n5 is an N5 dataset of one scale"):
        Location.parse("n5://x.n5").with_level(1)
    with pytest.raises(ValueError, match="--level -1 is negative; scales count from 0"):
        Location.parse("precomputed://x").with_level(-1)


def test_with_level_of_a_zarr_location_does_not_call_it_n5() -> None:
    with pytest.raises(ValueError) as e:
        Location.parse("x.zarr").with_level(1)
    assert "N5" not in str(e.value)


def test_with_url_moves_it_keeping_driver_and_scale() -> None:
    moved = Location.parse("precomputed://s3://b/k#mip=1").with_url("/tmp/x")
    assert (moved.is_local, moved.driver, moved.level, str(moved)) == (
        True, "precomputed", 1, "precomputed:///tmp/x#mip=1")
    assert str(Location.parse("s3://b/k").with_url("/tmp/x")) == "/tmp/x"


# text -> the start of its one-sentence ValueError
MALFORMED = {
    "": "volume location is empty; give a path or a URL",
    "   ": "volume location is empty",
    "ftp://h/x.zarr": "volume ftp://h/x.zarr has scheme ftp://; znni opens local paths and "
                      "s3://, gs:// and http(s):// URLs",
    "file:///tmp/x": "volume file:///tmp/x has scheme file://",
    "s3://": "volume s3:// names no bucket or host",
    "s3:///key": "volume s3:///key names no bucket or host",
    "precomputed://x#mip=x": "volume precomputed://x#mip=x: the scale after #mip= must be a whole number",
    "precomputed://x#mip=-1": "volume precomputed://x#mip=-1: the scale after #mip= must be a whole",
    "n5://x#mip=1": "volume n5://x#mip=1: #mip=N names a scale of a precomputed volume; an N5 "
                    "dataset has one scale",
    "precomputed://": "volume precomputed:// names no location after precomputed://",
    "precomputed://#mip=1": "volume precomputed://#mip=1 names no location after precomputed://",
}


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_text_is_one_sentence(text: str) -> None:
    with pytest.raises(ValueError) as e:
        Location.parse(text)
    message = str(e.value)
    assert message.startswith(MALFORMED[text]) and "\n" not in message


def test_the_sentence_names_what_the_location_is() -> None:
    with pytest.raises(ValueError, match="^mask location is empty"):
        Location.parse("", what="mask")
    with pytest.raises(ValueError, match="^output ftp://h/o has scheme ftp://"):
        Location.parse("ftp://h/o", what="output")


def test_a_password_in_a_url_is_masked_where_printed() -> None:
    loc = Location.parse("https://user:pw@host/x.zarr")
    assert str(loc) == "https://user:***@host/x.zarr" and "pw" not in str(loc)
    assert loc.url == "https://user:pw@host/x.zarr"  # what the store client is given
    assert "pw" not in str(loc.join("zarr.json")) and "pw" not in str(loc.parent())
    pc = Location.parse("precomputed://https://user:pw@host/x#mip=1")
    assert str(pc) == "precomputed://https://user:***@host/x#mip=1"
    assert str(Location.parse("https://user@host/x")) == "https://user@host/x"  # no password
    with pytest.raises(ValueError) as e:
        Location.parse("ftp://user:pw@host/x")
    assert "pw" not in str(e.value) and "user:***@host" in str(e.value)


@pytest.mark.parametrize("text", ["precomputed://https://user:pw@host/x#mip=x",
                                  "n5://https://user:pw@host/x#mip=1"])
def test_a_password_is_masked_in_a_scale_error(text: str) -> None:
    with pytest.raises(ValueError) as e:
        Location.parse(text)
    assert "pw" not in str(e.value)


@pytest.mark.parametrize("text", [*PARSED, "https://user:pw@host/x.zarr",
                                  "precomputed://https://user:pw@host/x#mip=1"])
def test_a_location_pickles_whole_and_is_frozen(text: str) -> None:
    loc = Location.parse(text)
    back = pickle.loads(pickle.dumps(loc))
    assert back == loc and hash(back) == hash(loc)
    assert (back.url, back.text, str(back)) == (loc.url, loc.text, str(loc))
    with pytest.raises(FrozenInstanceError):
        loc.key = "other"  # type: ignore[misc]


def test_equality_and_hash_ignore_the_text_as_written() -> None:
    gcs, gs = Location.parse("gcs://b/k"), Location.parse("gs://b/k")
    assert gcs == gs and hash(gcs) == hash(gs) and str(gcs) != str(gs)
    assert Location.parse("s3://b/k/") == Location.parse("s3://b/k")
    assert Location.parse("S3://b/k") == Location.parse("s3://b/k")
    assert len({gcs, gs, Location.parse("gs://b/k/")}) == 1
    assert Location.parse("s3://b/k") != Location.parse("gs://b/k")  # another store
    assert Location.parse("s3://b/k") != Location.parse("s3://c/k")
    assert Location.parse("precomputed://gs://b/em") != Location.parse("gs://b/em")
    assert Location.parse("precomputed://gs://b/em#mip=1") != \
        Location.parse("precomputed://gs://b/em#mip=2")
    assert Location.parse("n5://s3://b/x") != Location.parse("precomputed://s3://b/x")
