"""Where volumes live: local paths, or URLs of object stores (`s3://`, `gs://`) and read-only
`http(s)://` locations, opened through zarr's own `FsspecStore` (docs/design.md, "Volumes").

- Storage options (`--storage-option KEY=VALUE`) are registered per bucket for this process
  (`register`); every store this process opens under that bucket gets them, on top of the
  standard environment and config files (AWS_*, AWS_ENDPOINT_URL, ~/.aws, GCS defaults).
  http(s) locations are read anonymously, without options. Dask tasks register the job's
  options on their worker before opening anything.
- Transient errors (connections refused or reset, timeouts, 5xx) are retried with backoff,
  ZNNI_STORE_RETRIES tries in all (default 5); then `StoreError` names the URL.
- Refusals (bad credentials, missing bucket, missing object, an http(s) or unwritable OUT)
  are ValueErrors of one sentence naming the URL.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from znni.engine.store_memo import forget, remembered_list, remembered_read, wrote
from znni.engine.store_retry import StoreError as StoreError
from znni.engine.store_retry import delay, gave_up, retrying, tries
from znni.engine.store_retry import is_transient as is_transient

SCHEMES = ("s3", "gs", "gcs", "http", "https")
WRITABLE_SCHEMES = ("s3", "gs", "gcs")
METADATA_NAMES = ("zarr.json", ".zarray", ".zattrs", ".zgroup")
URL_RE = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*)://(.*)")

_OPTIONS: dict[str, dict[str, Any]] = {}  # "scheme://bucket" -> storage options
# s3fs sends a HEAD before each whole-object GET (to split large objects into concurrent
# ranged GETs); for chunks that doubles the requests, and zarr already reads chunks
# concurrently. `--storage-option max_concurrency=N` still sets it.
DEFAULT_OPTIONS: dict[str, dict[str, Any]] = {"s3": {"max_concurrency": 1}}


def is_url(path: str) -> bool:
    """Whether `path` is a URL (any scheme://); only SCHEMES are usable."""
    return URL_RE.fullmatch(path) is not None


def scheme(path: str) -> str | None:
    """The URL's scheme in lower case (gcs is gs), None for a local path."""
    m = URL_RE.fullmatch(path)
    if m is None:
        return None
    s = m.group(1).lower()
    return "gs" if s == "gcs" else s


def check_location(path: str, what: str) -> None:
    """Refuse a URL whose scheme znni does not open."""
    s = scheme(path)
    if s is not None and s not in SCHEMES:
        raise ValueError(
            f"{what} {path} has scheme {s}://; znni opens local paths and s3://, gs:// and "
            "http(s):// URLs"
        )


def root(url: str) -> str:
    """'scheme://bucket' (or 'scheme://host') of a URL."""
    m = URL_RE.fullmatch(url)
    assert m is not None, url
    return f"{m.group(1).lower()}://{m.group(2).split('/', 1)[0]}"


def parse_storage_options(items: Iterable[str]) -> dict[str, Any]:
    """KEY=VALUE strings -> options; a VALUE that parses as JSON is that value, else text."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--storage-option {item!r} is not of the form KEY=VALUE")
        try:
            out[key.strip()] = json.loads(text)
        except ValueError:
            out[key.strip()] = text
    return out


def register(paths: Iterable[str], options: Mapping[str, Any]) -> None:
    """Use `options` for every s3/gs location under the buckets of `paths` in this process."""
    for p in paths:
        if scheme(p) in WRITABLE_SCHEMES:
            _OPTIONS[root(p)] = dict(options)


def registered() -> dict[str, dict[str, Any]]:
    """This process's options by bucket (sent to Dask workers, who `restore` them)."""
    return {k: dict(v) for k, v in _OPTIONS.items()}


def restore(options: Mapping[str, Mapping[str, Any]]) -> None:
    _OPTIONS.update({k: dict(v) for k, v in options.items()})


def options_for(url: str) -> dict[str, Any]:
    """The fsspec options for a URL: DEFAULT_OPTIONS under the registered ones."""
    s = scheme(url)
    if s not in WRITABLE_SCHEMES:
        return {}
    return {**DEFAULT_OPTIONS.get(s or "", {}), **_OPTIONS.get(root(url), {})}


# -- paths and URLs alike -------------------------------------------------------------------


def join(path: str, *names: str) -> str:
    if is_url(path):
        return posixpath.join(path.rstrip("/"), *names)
    return str(Path(path).joinpath(*names))


def parent(path: str) -> str:
    if is_url(path):
        bare = path.rstrip("/")
        return bare if bare == root(bare) else posixpath.dirname(bare)
    return str(Path(path).parent)


def basename(path: str) -> str:
    return posixpath.basename(path.rstrip("/")) if is_url(path) else Path(path).name


def resolved(path: str) -> str:
    """An absolute local path (symlinks resolved), or the URL without a trailing slash."""
    return path.rstrip("/") if is_url(path) else str(Path(path).resolve())


# -- retries and refusals -------------------------------------------------------------------


def refusal(e: BaseException, url: str, what: str) -> ValueError:
    """A store's refusal as one sentence naming the URL."""
    text = str(e).strip() or type(e).__name__
    if isinstance(e, PermissionError):
        return ValueError(
            f"{what} {url}: the store refused access ({text}); check the credentials "
            "(AWS_* variables, ~/.aws, --storage-option)"
        )
    if isinstance(e, FileNotFoundError) and "bucket" in text.lower():
        return ValueError(f"{what} {url}: the bucket {root(url)} does not exist ({text})")
    if isinstance(e, FileNotFoundError):
        return ValueError(f"{what} {url} does not exist")
    return ValueError(f"{what} {url}: {type(e).__name__}: {text}")


# -- synchronous object access (metadata, ledger, checks) -----------------------------------


def filesystem(url: str) -> tuple[Any, str]:
    """(synchronous fsspec filesystem, path in it) for a URL, with its registered options."""
    from fsspec.core import url_to_fs

    try:
        return url_to_fs(url, **options_for(url))
    except ImportError as e:
        raise _missing_package(url, e) from e


def _missing_package(url: str, e: ImportError) -> ValueError:
    extra = " (pip install 'znni[gcs]')" if scheme(url) == "gs" else ""
    return ValueError(f"{url} needs a package that is not installed{extra}: {e}")


def read_bytes(path: str, what: str = "volume", owner: str | None = None) -> bytes | None:
    """The bytes of a file or object; None when it does not exist. A missing bucket or
    refused credentials: ValueError naming `owner` (the volume; default `path`)."""
    if not is_url(path):
        try:
            return Path(path).read_bytes()
        except OSError:
            return None
    fs, p = filesystem(path)
    try:
        return remembered_read(path, lambda: _cat_or_none(fs, p, path))
    except (FileNotFoundError, PermissionError, IsADirectoryError) as e:  # no bucket, refused
        raise refusal(e, owner or path, what) from e


def _cat_or_none(fs: Any, p: str, url: str) -> bytes | None:
    """The object's bytes, None when missing; a missing bucket raises FileNotFoundError."""
    try:
        return retrying(lambda: fs.cat_file(p), url)
    except FileNotFoundError as e:
        if "bucket" in str(e).lower():
            raise
        return None


def check_readable(path: str, what: str) -> None:
    """For a URL: refuse bad credentials or a missing bucket in one sentence naming it."""
    if is_url(path):
        read_bytes(join(path, "zarr.json"), what, owner=path)


def write_bytes(url: str, data: bytes) -> None:
    fs, p = filesystem(url)
    try:
        retrying(lambda: fs.pipe_file(p, data), url)
    except BaseException:
        forget(url)
        raise
    wrote(url, data)


def list_names(url: str) -> list[str]:
    """Names of the objects and prefixes directly under a URL ([] when there are none)."""
    fs, p = filesystem(url)

    def fetch() -> list[str]:
        try:
            entries = retrying(lambda: fs.ls(p, detail=False, refresh=True), url)
        except FileNotFoundError:
            return []
        return [posixpath.basename(e.rstrip("/")) for e in entries
                if e.rstrip("/") != p.rstrip("/")]

    return remembered_list(url, fetch)


def remove_tree(url: str) -> None:
    fs, p = filesystem(url)
    try:
        retrying(lambda: fs.rm(p, recursive=True), url)
    except FileNotFoundError:
        pass
    finally:
        forget(url)


def holds_anything(path: str, what: str = "output") -> bool:
    """Whether a directory / URL prefix holds anything (an http(s) URL: its zarr metadata)."""
    if not is_url(path):
        p = Path(path)
        return p.is_dir() and any(p.iterdir()) or p.exists() and not p.is_dir()
    if scheme(path) in ("http", "https"):
        return any(read_bytes(join(path, n), what) is not None
                   for n in ("zarr.json", ".zarray", ".zgroup"))
    try:
        return bool(list_names(path))
    except PermissionError as e:
        raise refusal(e, path, what) from e


def exists(path: str) -> bool:
    return holds_anything(path, "volume") if is_url(path) else Path(path).exists()


def check_output_location(url: str) -> None:
    """Refuse an OUT that cannot be written, before any compute: http(s) URLs, and buckets
    that are missing or that these credentials may not write (a probe object is written and
    deleted at once)."""
    check_location(url, "output")
    s = scheme(url)
    if s is None:
        return
    if s not in WRITABLE_SCHEMES:
        raise ValueError(
            f"output {url} is an {s}:// URL, which znni only reads; write to s3://, gs:// or "
            "a local path"
        )
    probe = join(url, f".znni-write-check-{uuid.uuid4().hex}")
    fs, p = filesystem(probe)
    try:
        retrying(lambda: fs.pipe_file(p, b""), url)
        retrying(lambda: fs.rm_file(p), url)
        forget(probe)
    except PermissionError as e:
        raise ValueError(
            f"output {url} is not writable: the store refused a test write ({e}); check the "
            "credentials (AWS_* variables, ~/.aws, --storage-option)"
        ) from e
    except FileNotFoundError as e:
        raise refusal(e, url, "output") from e


# -- zarr stores ----------------------------------------------------------------------------


def zarr_store(path: str, *, read_only: bool) -> Any:
    """What zarr opens `path` through: the local path itself, or a retrying FsspecStore."""
    if not is_url(path):
        return path
    from zarr.storage import FsspecStore

    check_location(path, "volume")
    try:
        inner = FsspecStore.from_url(path, storage_options=options_for(path),
                                     read_only=read_only)
    except ImportError as e:
        raise _missing_package(path, e) from e
    return _retrying_store_class()(inner, path)


_STORE_CLASS: list[type] = []


def _retrying_store_class() -> type:
    """`WrapperStore` subclass retrying transient failures (built lazily: zarr is heavy)."""
    if _STORE_CLASS:
        return _STORE_CLASS[0]
    from zarr.storage import WrapperStore

    class RetryingStore(WrapperStore):  # type: ignore[type-arg]
        def __init__(self, store: Any, url: str) -> None:
            super().__init__(store)
            self.url = url

        def _with_store(self, store: Any) -> Any:
            return type(self)(store, self.url)

        async def _retry(self, key: str, make: Callable[[], Any]) -> Any:
            n = tries()
            for attempt in range(n):
                try:
                    return await make()
                except Exception as e:
                    if not is_transient(e):
                        raise
                    if attempt == n - 1:
                        raise gave_up(join(self.url, key), n, e) from e
                    await asyncio.sleep(delay(attempt))
            raise AssertionError("unreachable")

        async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
            return await self._retry(key, lambda: self._store.get(key, prototype, byte_range))

        async def get_partial_values(self, prototype: Any, key_ranges: Any) -> Any:
            key_ranges = list(key_ranges)
            first = key_ranges[0][0] if key_ranges else ""
            return await self._retry(
                first, lambda: self._store.get_partial_values(prototype, key_ranges))

        async def exists(self, key: str) -> bool:
            return bool(await self._retry(key, lambda: self._store.exists(key)))

        async def _write(self, key: str, make: Callable[[], Any]) -> None:
            """A write or delete under `key`, retried; remembered answers about it dropped."""
            try:
                await self._retry(key, make)
            finally:
                forget(join(self.url, key) if key else self.url)

        async def set(self, key: str, value: Any) -> None:
            await self._write(key, lambda: self._store.set(key, value))
            if key.endswith(METADATA_NAMES):  # metadata is read again (chunks are not)
                wrote(join(self.url, key), value.to_bytes())

        async def set_if_not_exists(self, key: str, value: Any) -> None:
            await self._write(key, lambda: self._store.set_if_not_exists(key, value))

        async def _set_many(self, values: Iterable[tuple[str, Any]]) -> None:
            await asyncio.gather(*(self.set(k, v) for k, v in values))

        async def delete(self, key: str) -> None:
            await self._write(key, lambda: self._store.delete(key))

        async def delete_dir(self, prefix: str) -> None:
            await self._write(prefix, lambda: self._store.delete_dir(prefix))

        async def clear(self) -> None:
            await self._write("", lambda: self._store.clear())

    _STORE_CLASS.append(RetryingStore)
    return RetryingStore
