"""Where volumes live: local paths, or URLs of object stores (`s3://`, `gs://`) and read-only
`http(s)://` locations, opened through zarr's own `FsspecStore` (docs/design.md, "Volumes").

- Every function that asks a store takes the run's `StoreContext` (`engine/context.py`):
  its storage options (`--storage-option KEY=VALUE`) by bucket (`context_for`) go to every
  store opened under that bucket, on top of the standard environment and config files
  (AWS_*, AWS_ENDPOINT_URL, ~/.aws, GCS defaults, STORAGE_EMULATOR_HOST; gs:// at an
  emulator: `gcs.py`). http(s) locations are read anonymously, without options. Dask
  workers receive the context inside the block spec.
- Transient errors (connections refused or reset, timeouts, 5xx) are retried with backoff,
  ZNNI_STORE_RETRIES tries in all (default 5; 1 for gs://, whose client retries each
  request itself); then `StoreError` names the URL.
- Refusals (bad credentials, missing bucket, missing object, an http(s) or unwritable OUT)
  are ValueErrors of one sentence naming the URL.
"""

from __future__ import annotations

import json
import posixpath
import re
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from znni.engine.context import StoreContext
from znni.engine.io.gcs import (
    check_token,
    filesystem_class,
    gcs_options,
    refresh_credentials,
)
from znni.engine.io.memo import forget, remembered_list, remembered_read, wrote
from znni.engine.io.retry import StoreError as StoreError
from znni.engine.io.retry import is_refused, retrying
from znni.engine.io.retry import is_transient as is_transient

SCHEMES = ("s3", "gs", "gcs", "http", "https")
# volumes read (and precomputed ones written) through TensorStore: DRIVER://LOCATION[#mip=N],
# LOCATION a local path or one of SCHEMES' URLs (`precomputed.py`)
DRIVERS = ("precomputed", "n5")
WRITABLE_SCHEMES = ("s3", "gs", "gcs")
URL_RE = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*)://(.*)")
SECRET_KEY_RE = re.compile(r"token|secret|key|password|credential", re.IGNORECASE)

CREDENTIALS_HINT = {
    "s3": "AWS_* variables, ~/.aws, --storage-option",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS, gcloud's application default credentials, "
          "--storage-option token=...",
}
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


def driver_of(path: str) -> str | None:
    """'precomputed' or 'n5' for a TensorStore volume's path, None for any other."""
    m = URL_RE.fullmatch(path)
    return m.group(1).lower() if m is not None and m.group(1).lower() in DRIVERS else None


def storage_path(path: str) -> str:
    """Where a volume's objects live: a TensorStore volume's location (no driver prefix, no
    scale), any other path itself."""
    d = driver_of(path)
    return path if d is None else path[len(d) + 3:].partition("#")[0]


def check_location(path: str, what: str) -> None:
    """Refuse a URL whose scheme znni does not open."""
    path = storage_path(path)
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


def context_for(paths: Iterable[str], options: Mapping[str, Any],
                base: StoreContext | None = None) -> StoreContext:
    """A context (`base`, or a new one) that gives `options` to every s3/gs location under
    the buckets of `paths`."""
    roots = [root(p) for p in paths if scheme(p) in WRITABLE_SCHEMES]
    ctx = base if base is not None else StoreContext()
    return ctx.with_bucket_options(roots, options) if roots and options else ctx


def options_for(url: str, ctx: StoreContext) -> dict[str, Any]:
    """The fsspec options for a URL: DEFAULT_OPTIONS under the context's."""
    s = scheme(url)
    if s not in WRITABLE_SCHEMES:
        return {}
    options = {**DEFAULT_OPTIONS.get(s or "", {}), **ctx.options.get(root(url), {})}
    return gcs_options(options) if s == "gs" else options


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
    if (d := driver_of(path)) is not None:  # the driver and scale kept around the location
        _, mark, scale = path.partition("#")
        return f"{d}://{resolved(storage_path(path))}{mark}{scale}"
    return path.rstrip("/") if is_url(path) else str(Path(path).resolve())


# -- retries and refusals -------------------------------------------------------------------


def is_refusal(e: BaseException) -> bool:
    """Whether `refusal` words this error: refused credentials or something missing."""
    return isinstance(e, FileNotFoundError | IsADirectoryError) or is_refused(e)


def refusal(e: BaseException, url: str, what: str, *, ctx: StoreContext) -> ValueError:
    """A store's refusal as one sentence naming the URL."""
    text = " ".join(str(e).split()) or type(e).__name__
    if is_refused(e):
        hint = CREDENTIALS_HINT.get(scheme(url) or "", "--storage-option")
        return ValueError(
            f"{what} {url}: the store refused access ({text}); check the credentials ({hint})"
        )
    if isinstance(e, FileNotFoundError) and bucket_missing(url, e, ctx=ctx):
        return ValueError(f"{what} {url}: the bucket {root(url)} does not exist ({text})")
    if isinstance(e, FileNotFoundError):
        return ValueError(f"{what} {url} does not exist")
    return ValueError(f"{what} {url}: {type(e).__name__}: {text}")


def bucket_missing(url: str, e: FileNotFoundError, *, ctx: StoreContext) -> bool:
    """Whether `e` (about `url`) means the bucket is missing. s3fs says so; gcsfs answers
    a bare 404 for a missing bucket and a missing object alike, so the bucket is listed
    (one object at most; a bucket seen once is taken to stay)."""
    if "bucket" in str(e).lower():
        return True
    bucket = root(url)
    if scheme(url) != "gs" or bucket in ctx.caches.buckets_found:
        return False
    fs, p = filesystem(bucket, ctx=ctx)
    try:
        retrying(lambda: fs.ls(p, detail=False, refresh=True, max_results=1), bucket)
    except FileNotFoundError:
        return True
    except Exception as err:  # refused: not known to be missing; the caller reports `e`
        if not is_refused(err):
            raise
        return False
    ctx.caches.buckets_found.add(bucket)
    return False


# -- synchronous object access (metadata, ledger, checks) -----------------------------------


def filesystem(url: str, *, ctx: StoreContext, **extra: Any) -> tuple[Any, str]:
    """(fsspec filesystem, path in it) for a URL, with the context's options (and `extra`:
    `asynchronous=True` for zarr). gs:// at an emulator: gcsfs's JSON-API class."""
    from fsspec.core import url_to_fs

    options = {**options_for(url, ctx), **extra}
    try:
        cls = filesystem_class(options) if scheme(url) == "gs" else None
        if cls is None:
            fs, p = url_to_fs(url, **options)
        else:
            fs, p = cls(**options), cls._strip_protocol(url)
        if scheme(url) in ("gs", "gcs"):
            refresh_credentials(fs)
            check_token(fs, url)
        elif scheme(url) == "s3" and not options.get("asynchronous") \
                and getattr(fs, "_s3", None) is None:
            fs.connect()  # its client made now: an option the client does not take fails here
        return fs, p
    except ImportError as e:
        raise _missing_package(url, e) from e
    except Exception as e:  # credentials the client cannot load or check, unknown options
        text = masked(" ".join(str(e).split()) or type(e).__name__, options)
        hint = CREDENTIALS_HINT.get(scheme(url) or "", "--storage-option")
        if is_refused(e):
            raise ValueError(f"{url}: the store refused these credentials ({text}); check "
                             f"the credentials ({hint})") from e
        raise ValueError(f"{url}: the store's client could not be set up with these options "
                         f"and credentials ({type(e).__name__}: {text}); check them ({hint})"
                         ) from e


def masked(text: str, options: Mapping[str, Any]) -> str:
    """`text` with the values of secret-like options (tokens, keys, passwords) replaced by
    ***, also where a client wrote them into a URL: an error sentence may be logged or
    sent over HTTP."""
    from urllib.parse import quote

    for key, value in options.items():
        if isinstance(value, Mapping):  # e.g. client_kwargs={"aws_secret_access_key": ...}
            text = masked(text, value)
        elif isinstance(value, str) and len(value) >= 3 and SECRET_KEY_RE.search(key):
            for form in {value, quote(value, safe=""), quote(value)}:
                text = text.replace(form, "***")
    return text


def _missing_package(url: str, e: ImportError) -> ValueError:
    extra = " (pip install 'znni[gcs]')" if scheme(url) == "gs" else ""
    return ValueError(f"{url} needs a package that is not installed{extra}: {e}")


def read_bytes(path: str, what: str = "volume", owner: str | None = None, *,
               ctx: StoreContext) -> bytes | None:
    """The bytes of a file or object; None when it does not exist. A missing bucket or
    refused credentials: ValueError naming `owner` (the volume; default `path`)."""
    if not is_url(path):
        try:
            return Path(path).read_bytes()
        except OSError:
            return None
    fs, p = filesystem(path, ctx=ctx)
    try:
        return remembered_read(ctx.memo, path, lambda: _cat_or_none(fs, p, path, ctx))
    except Exception as e:  # no bucket, refused
        if not is_refusal(e):
            raise
        raise refusal(e, owner or path, what, ctx=ctx) from e


def _cat_or_none(fs: Any, p: str, url: str, ctx: StoreContext) -> bytes | None:
    """The object's bytes, None when missing; a missing bucket raises FileNotFoundError."""
    try:
        return retrying(lambda: fs.cat_file(p), url)
    except FileNotFoundError as e:
        if bucket_missing(url, e, ctx=ctx):
            raise
        return None


def check_readable(path: str, what: str, *, ctx: StoreContext) -> None:
    """For a URL: refuse bad credentials or a missing bucket in one sentence naming it."""
    if is_url(path):
        read_bytes(join(path, "zarr.json"), what, owner=path, ctx=ctx)


def write_bytes(url: str, data: bytes, *, ctx: StoreContext) -> None:
    fs, p = filesystem(url, ctx=ctx)
    try:
        retrying(lambda: fs.pipe_file(p, data), url)
    except BaseException:
        forget(ctx.memo, url)
        raise
    wrote(ctx.memo, url, data)


def list_names(url: str, *, ctx: StoreContext) -> list[str]:
    """Names of the objects and prefixes directly under a URL ([] when there are none)."""
    fs, p = filesystem(url, ctx=ctx)

    def fetch() -> list[str]:
        try:
            entries = retrying(lambda: fs.ls(p, detail=False, refresh=True), url)
        except FileNotFoundError:
            return []
        return [posixpath.basename(e.rstrip("/")) for e in entries
                if e.rstrip("/") != p.rstrip("/")]

    return remembered_list(ctx.memo, url, fetch)


def remove_tree(url: str, *, ctx: StoreContext) -> None:
    fs, p = filesystem(url, ctx=ctx)
    try:
        retrying(lambda: fs.rm(p, recursive=True), url)
    except FileNotFoundError:
        pass
    finally:
        forget(ctx.memo, url)


def holds_anything(path: str, what: str = "output", *, ctx: StoreContext) -> bool:
    """Whether a directory / URL prefix holds anything (an http(s) URL: its zarr metadata)."""
    if not is_url(path):
        p = Path(path)
        return p.is_dir() and any(p.iterdir()) or p.exists() and not p.is_dir()
    if scheme(path) in ("http", "https"):
        return any(read_bytes(join(path, n), what, ctx=ctx) is not None
                   for n in ("zarr.json", ".zarray", ".zgroup"))
    try:
        return bool(list_names(path, ctx=ctx))
    except Exception as e:
        if not is_refused(e):
            raise
        raise refusal(e, path, what, ctx=ctx) from e


def exists(path: str, *, ctx: StoreContext) -> bool:
    path = storage_path(path)  # a precomputed:// or n5:// volume: where it lives
    return holds_anything(path, "volume", ctx=ctx) if is_url(path) else Path(path).exists()


def check_output_location(url: str, *, ctx: StoreContext) -> None:
    """Refuse an OUT that cannot be written, before any compute: http(s) URLs, and buckets
    that are missing or that these credentials may not write (a probe object is written and
    deleted at once)."""
    url = storage_path(url)
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
    fs, p = filesystem(probe, ctx=ctx)
    try:
        retrying(lambda: fs.pipe_file(p, b""), url)
        retrying(lambda: fs.rm_file(p), url)
        forget(ctx.memo, probe)
    except Exception as e:
        if is_refused(e):
            raise ValueError(
                f"output {url} is not writable: the store refused a test write "
                f"({' '.join(str(e).split())}); check the credentials ({CREDENTIALS_HINT[s]})"
            ) from e
        if isinstance(e, FileNotFoundError):
            raise refusal(e, url, "output", ctx=ctx) from e
        raise


# -- zarr stores ----------------------------------------------------------------------------


def zarr_store(path: str, *, read_only: bool, ctx: StoreContext) -> Any:
    """What zarr opens `path` through: the local path itself, or a retrying FsspecStore
    (whose writes update the context's setup memo while it is open)."""
    if not is_url(path):
        return path
    from zarr.storage import FsspecStore

    from znni.engine.io.retrying_store import RetryingStore  # zarr's WrapperStore: heavy

    check_location(path, "volume")
    fs, p = filesystem(path, ctx=ctx, asynchronous=True)
    return RetryingStore(FsspecStore(fs=fs, path=p, read_only=read_only), path, ctx.memo)
