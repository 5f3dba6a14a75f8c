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
    set_request_tries,
)
from znni.engine.io.memo import forget, remembered_list, remembered_read, wrote
from znni.engine.io.retry import StoreError as StoreError
from znni.engine.io.retry import is_refused, retrying
from znni.engine.io.retry import is_transient as is_transient
from znni.engine.location import Location

# s3fs sends a HEAD before each whole-object GET (to split large objects into concurrent
# ranged GETs); for chunks that doubles the requests, and zarr already reads chunks
# concurrently. `--storage-option max_concurrency=N` still sets it.
DEFAULT_OPTIONS: dict[str, dict[str, Any]] = {"s3": {"max_concurrency": 1}}
SECRET_KEY_RE = re.compile(r"token|secret|key|password|credential", re.IGNORECASE)

CREDENTIALS_HINT = {
    "s3": "AWS_* variables, ~/.aws, --storage-option",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS, gcloud's application default credentials, "
          "--storage-option token=...",
}


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


def context_for(locations: Iterable[Location], options: Mapping[str, Any],
                base: StoreContext | None = None) -> StoreContext:
    """A context (`base`, or a new one) that gives `options` to every s3/gs location under
    the buckets of `locations`."""
    roots = [loc.root for loc in locations if loc.is_remote and loc.writable_scheme]
    ctx = base if base is not None else StoreContext()
    return ctx.with_bucket_options(roots, options) if roots and options else ctx


def options_for(loc: Location, ctx: StoreContext) -> dict[str, Any]:
    """The fsspec options for a location: DEFAULT_OPTIONS under the context's."""
    if not (loc.is_remote and loc.writable_scheme):
        return {}
    options = {**DEFAULT_OPTIONS.get(loc.scheme, {}), **ctx.options.get(loc.root, {})}
    return gcs_options(options) if loc.scheme == "gs" else options


# -- retries and refusals -------------------------------------------------------------------


def is_refusal(e: BaseException) -> bool:
    """Whether `refusal` words this error: refused credentials or something missing."""
    return isinstance(e, FileNotFoundError | IsADirectoryError) or is_refused(e)


def refusal(e: BaseException, loc: Location, what: str, *, ctx: StoreContext) -> ValueError:
    """A store's refusal as one sentence naming the location."""
    text = " ".join(str(e).split()) or type(e).__name__
    if is_refused(e):
        hint = CREDENTIALS_HINT.get(loc.scheme, "--storage-option")
        return ValueError(
            f"{what} {loc}: the store refused access ({text}); check the credentials ({hint})"
        )
    if isinstance(e, FileNotFoundError) and bucket_missing(loc, e, ctx=ctx):
        return ValueError(f"{what} {loc}: the bucket {loc.root} does not exist ({text})")
    if isinstance(e, FileNotFoundError):
        return ValueError(f"{what} {loc} does not exist")
    return ValueError(f"{what} {loc}: {type(e).__name__}: {text}")


def bucket_missing(loc: Location, e: FileNotFoundError, *, ctx: StoreContext) -> bool:
    """Whether `e` (about `loc`) means the bucket is missing. s3fs says so; gcsfs answers
    a bare 404 for a missing bucket and a missing object alike, so the bucket is listed
    (one object at most; a bucket seen once is taken to stay)."""
    if "bucket" in str(e).lower():
        return True
    bucket = loc.root
    if loc.scheme != "gs" or bucket in ctx.caches.buckets_found:
        return False
    where = Location.parse(bucket)
    fs, p = filesystem(where, ctx=ctx)
    try:
        retrying(lambda: fs.ls(p, detail=False, refresh=True, max_results=1), where)
    except FileNotFoundError:
        return True
    except Exception as err:  # refused: not known to be missing; the caller reports `e`
        if not is_refused(err):
            raise
        return False
    ctx.caches.buckets_found.add(bucket)
    return False


# -- synchronous object access (metadata, ledger, checks) -----------------------------------


def filesystem(loc: Location, *, ctx: StoreContext, **extra: Any) -> tuple[Any, str]:
    """(fsspec filesystem, path in it) for a URL location, with the context's options (and
    `extra`: `asynchronous=True` for zarr). gs:// at an emulator: gcsfs's JSON-API class."""
    from fsspec.core import url_to_fs

    url = loc.url
    options = {**options_for(loc, ctx), **extra}
    try:
        cls = filesystem_class(options) if loc.scheme == "gs" else None
        if cls is None:
            fs, p = url_to_fs(url, **options)
        else:
            fs, p = cls(**options), cls._strip_protocol(url)
        if loc.scheme == "gs":
            set_request_tries(fs)
            refresh_credentials(fs)
            check_token(fs, loc)
        elif loc.scheme == "s3" and not options.get("asynchronous") \
                and getattr(fs, "_s3", None) is None:
            fs.connect()  # its client made now: an option the client does not take fails here
        return fs, p
    except ImportError as e:
        raise _missing_package(loc, e) from e
    except Exception as e:  # credentials the client cannot load or check, unknown options
        text = masked(" ".join(str(e).split()) or type(e).__name__, options)
        hint = CREDENTIALS_HINT.get(loc.scheme, "--storage-option")
        if is_refused(e):
            raise ValueError(f"{loc}: the store refused these credentials ({text}); check "
                             f"the credentials ({hint})") from e
        raise ValueError(f"{loc}: the store's client could not be set up with these options "
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


def _missing_package(loc: Location, e: ImportError) -> ValueError:
    extra = " (pip install 'znni[gcs]')" if loc.scheme == "gs" else ""
    return ValueError(f"{loc} needs a package that is not installed{extra}: {e}")


def read_bytes(loc: Location, what: str = "volume", owner: Location | None = None, *,
               ctx: StoreContext) -> bytes | None:
    """The bytes of a file or object; None when it does not exist. A missing bucket or
    refused credentials: ValueError naming `owner` (the volume; default `loc`)."""
    if loc.is_local:
        try:
            return Path(loc.url).read_bytes()
        except OSError:
            return None
    fs, p = filesystem(loc, ctx=ctx)
    try:
        return remembered_read(ctx.memo, loc, lambda: _cat_or_none(fs, p, loc, ctx))
    except Exception as e:  # no bucket, refused
        if not is_refusal(e):
            raise
        raise refusal(e, owner or loc, what, ctx=ctx) from e


def _cat_or_none(fs: Any, p: str, loc: Location, ctx: StoreContext) -> bytes | None:
    """The object's bytes, None when missing; a missing bucket raises FileNotFoundError."""
    try:
        return retrying(lambda: fs.cat_file(p), loc)
    except FileNotFoundError as e:
        if bucket_missing(loc, e, ctx=ctx):
            raise
        return None


def check_readable(loc: Location, what: str, *, ctx: StoreContext) -> None:
    """For a URL: refuse bad credentials or a missing bucket in one sentence naming it."""
    if loc.is_remote:
        read_bytes(loc.join("zarr.json"), what, owner=loc, ctx=ctx)


def write_bytes(loc: Location, data: bytes, *, ctx: StoreContext) -> None:
    """Put `data` at a URL location (local files are written by their callers)."""
    fs, p = filesystem(loc, ctx=ctx)
    try:
        retrying(lambda: fs.pipe_file(p, data), loc)
    except BaseException:
        forget(ctx.memo, loc)
        raise
    wrote(ctx.memo, loc, data)


def list_names(loc: Location, *, ctx: StoreContext) -> list[str]:
    """Names of the objects and prefixes directly under a URL ([] when there are none)."""
    fs, p = filesystem(loc, ctx=ctx)

    def fetch() -> list[str]:
        try:
            entries = retrying(lambda: fs.ls(p, detail=False, refresh=True), loc)
        except FileNotFoundError:
            return []
        return [posixpath.basename(e.rstrip("/")) for e in entries
                if e.rstrip("/") != p.rstrip("/")]

    return remembered_list(ctx.memo, loc, fetch)


def remove_tree(loc: Location, *, ctx: StoreContext) -> None:
    fs, p = filesystem(loc, ctx=ctx)
    try:
        retrying(lambda: fs.rm(p, recursive=True), loc)
    except FileNotFoundError:
        pass
    finally:
        forget(ctx.memo, loc)


def holds_anything(loc: Location, what: str = "output", *, ctx: StoreContext) -> bool:
    """Whether a directory / URL prefix holds anything (an http(s) URL: its zarr metadata)."""
    if loc.is_local:
        p = Path(loc.url)
        return p.is_dir() and any(p.iterdir()) or p.exists() and not p.is_dir()
    if loc.is_http:
        return any(read_bytes(loc.join(n), what, ctx=ctx) is not None
                   for n in ("zarr.json", ".zarray", ".zgroup"))
    try:
        return bool(list_names(loc, ctx=ctx))
    except Exception as e:
        if not is_refused(e):
            raise
        raise refusal(e, loc, what, ctx=ctx) from e


def exists(loc: Location, *, ctx: StoreContext) -> bool:
    where = loc.bare()  # a precomputed:// or n5:// volume: where it lives
    return holds_anything(where, "volume", ctx=ctx) if where.is_remote \
        else Path(where.url).exists()


def check_output_location(loc: Location, *, ctx: StoreContext) -> None:
    """Refuse an OUT that cannot be written, before any compute: http(s) URLs, and buckets
    that are missing or that these credentials may not write (a probe object is written and
    deleted at once)."""
    where = loc.bare()
    if where.is_local:
        return
    if not where.writable_scheme:
        raise ValueError(
            f"output {where} is an {where.scheme}:// URL, which znni only reads; write to "
            "s3://, gs:// or a local path"
        )
    probe = where.join(f".znni-write-check-{uuid.uuid4().hex}")
    fs, p = filesystem(probe, ctx=ctx)
    try:
        retrying(lambda: fs.pipe_file(p, b""), where)
        retrying(lambda: fs.rm_file(p), where)
        forget(ctx.memo, probe)
    except Exception as e:
        if is_refused(e):
            raise ValueError(
                f"output {where} is not writable: the store refused a test write "
                f"({' '.join(str(e).split())}); check the credentials "
                f"({CREDENTIALS_HINT[where.scheme]})"
            ) from e
        if isinstance(e, FileNotFoundError):
            raise refusal(e, where, "output", ctx=ctx) from e
        raise


# -- zarr stores ----------------------------------------------------------------------------


def zarr_store(loc: Location, *, read_only: bool, ctx: StoreContext) -> Any:
    """What zarr opens `loc` through: the local path itself, or a retrying FsspecStore
    (whose writes update the context's setup memo while it is open)."""
    if loc.is_local:
        return loc.url
    from zarr.storage import FsspecStore

    from znni.engine.io.retrying_store import RetryingStore  # zarr's WrapperStore: heavy

    fs, p = filesystem(loc, ctx=ctx, asynchronous=True)
    return RetryingStore(FsspecStore(fs=fs, path=p, read_only=read_only), loc, ctx.memo)
