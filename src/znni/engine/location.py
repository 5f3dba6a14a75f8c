"""Where a volume (or any object of a store) lives, parsed once: the `Location` value.

As TensorStore's `Spec` (driver, kvstore, path) and zarr-python's `StorePath`: the text a
user gives (`data/em.zarr/raw`, `s3://bucket/em.zarr`, `precomputed://gs://b/em#mip=2`,
`n5://path`) is parsed once at the CLI or HTTP boundary, with one sentence for anything
malformed, into a frozen, picklable value. Everything below takes a `Location`; only the
third-party calls at the very bottom (fsspec, zarr, TensorStore) get its `url` string.

- `scheme`: "file" (a local path), "s3", "gs" (`gcs://` too), "http" or "https".
- `bucket` and `key`: the kvstore (the bucket or host; "" for a local path) and the path
  within it (the local path as given; for a URL the key, no slashes at either end).
- `driver`: "zarr" (a Zarr array or group: plain, or an OME-Zarr image, which the format
  registry tells apart by looking, `formats.format_of`), "precomputed" or "n5" (read and
  written through TensorStore).
- `level`: the scale or level a precomputed path names (`#mip=N`), None when it names none.

`str(location)` is the text as given (secrets in a URL's user part masked), so messages,
ledger fingerprints and provenance read as before.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

SCHEMES = ("s3", "gs", "http", "https")  # and "file", a local path
WRITABLE_SCHEMES = ("file", "s3", "gs")
DRIVERS = ("zarr", "precomputed", "n5")
TENSORSTORE_DRIVERS = ("precomputed", "n5")
SCALE_MARK = "#mip="
URL_RE = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*)://(.*)", re.DOTALL)
USERINFO_RE = re.compile(r"(://[^/@:]*:)[^/@]*@")


@dataclass(frozen=True)
class Location:
    """A parsed volume or object location (module docstring). Build with `Location.parse`."""

    scheme: str
    bucket: str
    key: str
    driver: str = "zarr"
    level: int | None = None
    # the storage address as written (scheme case, gcs://, trailing slash kept): what fsspec,
    # zarr and TensorStore are given; and the whole text as given, for messages
    url: str = field(default="", compare=False)
    text: str = field(default="", compare=False)

    # -- parsing --------------------------------------------------------------------------

    @classmethod
    def parse(cls, text: str | Path, what: str = "volume") -> Location:
        """`text` as a Location; ValueError of one sentence naming `what` when malformed."""
        raw = str(text)
        if not raw.strip():
            raise ValueError(f"{what} location is empty; give a path or a URL")
        m = URL_RE.fullmatch(raw)
        if m is not None and m.group(1).lower() in TENSORSTORE_DRIVERS:
            return cls._parse_tensorstore(raw, m.group(1).lower(), m.group(2), what)
        return cls._parse_store(raw, raw, what)

    @classmethod
    def _parse_tensorstore(cls, raw: str, driver: str, rest: str, what: str) -> Location:
        shown = mask_userinfo(raw)
        inner, mark, scale = rest.partition(SCALE_MARK)
        level = None
        if mark:
            if driver != "precomputed":
                raise ValueError(f"{what} {shown}: {SCALE_MARK}N names a scale of a precomputed "
                                 "volume; an N5 dataset has one scale")
            if not scale.isdigit():
                raise ValueError(f"{what} {shown}: the scale after {SCALE_MARK} must be a whole "
                                 "number")
            level = int(scale)
        if not inner.strip():
            raise ValueError(f"{what} {shown} names no location after {driver}://")
        bare = cls._parse_store(inner, inner, what)
        return replace(bare, driver=driver, level=level, text=raw)

    @classmethod
    def _parse_store(cls, raw: str, url: str, what: str) -> Location:
        m = URL_RE.fullmatch(raw)
        if m is None:
            return cls("file", "", raw, url=url, text=raw)
        scheme = m.group(1).lower()
        scheme = "gs" if scheme == "gcs" else scheme
        if scheme not in SCHEMES:
            raise ValueError(
                f"{what} {mask_userinfo(raw)} has scheme {scheme}://; znni opens local paths and "
                "s3://, gs:// and http(s):// URLs"
            )
        bucket, _, key = m.group(2).partition("/")
        if not bucket:
            raise ValueError(f"{what} {mask_userinfo(raw)} names no bucket or host")
        return cls(scheme, bucket, key.strip("/"), url=url, text=raw)

    # -- what it is -----------------------------------------------------------------------

    @property
    def is_local(self) -> bool:
        return self.scheme == "file"

    @property
    def is_remote(self) -> bool:
        """Whether it is a URL (an object store or an http(s) server)."""
        return self.scheme != "file"

    @property
    def is_http(self) -> bool:
        return self.scheme in ("http", "https")

    @property
    def is_tensorstore(self) -> bool:
        """Whether TensorStore reads and writes it (a precomputed volume or an N5 dataset)."""
        return self.driver in TENSORSTORE_DRIVERS

    @property
    def writable_scheme(self) -> bool:
        return self.scheme in WRITABLE_SCHEMES

    @property
    def root(self) -> str:
        """'scheme://bucket' of a URL (its scheme lower case, gcs as written); '' locally."""
        if self.is_local:
            return ""
        m = URL_RE.fullmatch(self.url)
        written = m.group(1).lower() if m is not None else self.scheme
        return f"{written}://{self.bucket}"

    @property
    def scale(self) -> int:
        """The scale a precomputed location names (0 when it names none)."""
        return self.level or 0

    @property
    def name(self) -> str:
        """The last part of the path (a directory's or an object's name)."""
        if self.is_remote:
            return posixpath.basename(self.url.rstrip("/"))
        return Path(self.url).name

    # -- related locations ----------------------------------------------------------------

    def bare(self) -> Location:
        """Where its objects live: the same place with no driver and no scale (a
        TensorStore volume's directory), itself for a Zarr location."""
        if not self.is_tensorstore and self.level is None:
            return self
        return replace(self, driver="zarr", level=None, text=self.url)

    def join(self, *names: str) -> Location:
        """An object or directory under this location (no driver, no scale)."""
        base = self.bare()
        if base.is_remote:
            url = posixpath.join(base.url.rstrip("/"), *names)
            key = posixpath.join(base.key, *names).strip("/") if base.key else \
                posixpath.join(*names).strip("/")
            return replace(base, key=key, url=url, text=url)
        url = str(Path(base.url).joinpath(*names))
        return replace(base, key=url, url=url, text=url)

    def beside(self, suffix: str) -> Location:
        """The object or directory named as this one's name plus `suffix`, beside it (no
        driver, no scale): an output's lock file or lease."""
        return Location.parse(self.bare().url.rstrip("/") + suffix)

    def parent(self) -> Location:
        """The directory or prefix that holds it (a bucket's root is its own parent)."""
        base = self.bare()
        if base.is_remote:
            stripped = base.url.rstrip("/")
            if not base.key:
                return replace(base, url=stripped, text=stripped)
            url = posixpath.dirname(stripped)
            key = posixpath.dirname(base.key)
            return replace(base, key=key, url=url, text=url)
        url = str(Path(base.url).parent)
        return replace(base, key=url, url=url, text=url)

    def resolved(self) -> Location:
        """An absolute local path (symlinks resolved), or the URL without a trailing slash;
        the driver and scale kept. Two locations of one volume resolve equal."""
        if self.is_remote:
            url = self.url.rstrip("/")
        else:
            url = str(Path(self.url).resolve())
        key = url if self.is_local else self.key
        text = url if not self.is_tensorstore else self._with_driver_text(url)
        return replace(self, key=key, url=url, text=text)

    def with_level(self, level: int) -> Location:
        """Scale `level` of a precomputed volume (what --level / --mip give)."""
        if self.driver != "precomputed":
            kind = "an N5 dataset of one scale" if self.driver == "n5" else \
                "not a precomputed:// volume (an OME-Zarr image's levels are its arrays)"
            raise ValueError(f"--level applies to OME-Zarr images and precomputed volumes; "
                             f"{self} is {kind}")
        if level < 0:
            raise ValueError(f"--level {level} is negative; scales count from 0")
        return replace(self, level=level,
                       text=f"precomputed://{self.url}{SCALE_MARK}{level}")

    def with_url(self, url: str) -> Location:
        """This location moved to `url` (a local path or URL of the same kind of store),
        driver and scale kept: for an output written somewhere else first (a temporary
        directory beside it)."""
        moved = Location.parse(url)
        return replace(moved, driver=self.driver, level=self.level,
                       text=self._with_driver_text(moved.url))

    def _with_driver_text(self, url: str) -> str:
        if not self.is_tensorstore:
            return url
        mark = f"{SCALE_MARK}{self.level}" if self.level is not None else ""
        return f"{self.driver}://{url}{mark}"

    # -- printing -------------------------------------------------------------------------

    def __str__(self) -> str:
        return mask_userinfo(self.text or self.url)

    def __fspath__(self) -> str:
        """A local location is a path for `open`, `Path` and friends; a URL is not."""
        if not self.is_local:
            raise TypeError(f"{self} is a URL, not a local path")
        return self.url


def mask_userinfo(text: str) -> str:
    """`text` with a URL's password (scheme://user:PASSWORD@host) replaced by ***."""
    return USERINFO_RE.sub(r"\1***@", text)
