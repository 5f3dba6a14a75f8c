"""URLs in job submissions: only under the operator's --allow-url prefixes, whole segments."""

from __future__ import annotations

import pytest

from znni.jobs.paths import check_url_prefix, confine_url

ALLOWED = ("s3://bkt/data", "https://example.org/pub")


@pytest.mark.parametrize("url", ["s3://bkt/data/em.zarr", "s3://bkt/data/a/b/raw/",
                                 "https://example.org/pub/em.zarr/s0"])
def test_urls_under_an_allowed_prefix_pass(url: str) -> None:
    assert confine_url(ALLOWED, url, "input") == url.rstrip("/")


@pytest.mark.parametrize(("url", "words"), [
    ("s3://bkt/database/em.zarr", "outside the URL prefixes"),  # a prefix of the name only
    ("s3://bkt/data", "outside the URL prefixes"),  # the prefix itself
    ("s3://other/data/em.zarr", "outside the URL prefixes"),
    ("s3://bkt/data/../secret", "'..'"),
    ("s3://bkt/data//x", "empty"),
    ("s3://bkt/data/x?versionId=1", "not a path under the data root"),
    ("file:///etc/passwd", "not a path under the data root"),
])
def test_other_urls_are_refused(url: str, words: str) -> None:
    with pytest.raises(ValueError, match="input") as e:
        confine_url(ALLOWED, url, "input")
    assert words in str(e.value)


def test_no_prefixes_allow_no_urls_and_prefixes_are_checked() -> None:
    with pytest.raises(ValueError, match="allows none"):
        confine_url((), "s3://bkt/data/em.zarr", "output")
    assert check_url_prefix("gs://bkt/p/") == "gs://bkt/p"
    with pytest.raises(ValueError, match="'..'"):
        check_url_prefix("s3://bkt/../p")
