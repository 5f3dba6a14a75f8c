"""Retrying an object store's transient failures: connections refused or reset, timeouts,
throttling and 5xx answers are retried with backoff, ZNNI_STORE_RETRIES tries in all
(default 5, and 1 for gs://, whose client retries each request itself); then `StoreError`
names the URL. Refusals (401, 403) are never retried.

The clients say these things differently: s3fs raises PermissionError and OSErrors with an
errno, gcsfs an `HttpError` with the HTTP `code`, a plain OSError "Forbidden: ..." for 403
and a requests/aiohttp error for a lost connection. `retrying` wraps a synchronous call,
and `retrying_store.py`'s `RetryingStore` a zarr store (every get, set and delete)."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from typing import TypeVar

from znni.engine.location import Location

RETRIES_ENV = "ZNNI_STORE_RETRIES"
DEFAULT_TRIES = 5
# gcsfs retries each request itself (6 tries, 1-16 s apart: about 31 s); znni's 5 tries
# around that made a dead GCS endpoint take 2.5 min to fail, so gs:// gets one by default
SELF_RETRYING_SCHEMES = ("gs",)  # gcs:// parses as gs
BACKOFF_S, MAX_BACKOFF_S = 0.5, 8.0
TRANSIENT_NAMES = frozenset({
    "ConnectionError", "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
    "ConnectionClosedError", "HTTPClientError", "ClientConnectionError", "ClientOSError",
    "ServerDisconnectedError", "ClientPayloadError", "FSTimeoutError", "TimeoutError",
    "IncompleteRead", "ResponseStreamingError", "ProxyConnectionError",
})
TRANSIENT_STATUS = frozenset({408, 429})  # request timeout, too many requests; and 5xx
REFUSED_STATUS = frozenset({401, 403})
TRANSIENT_ERRNO = frozenset({errno.EBUSY, errno.EREMOTEIO, errno.ETIMEDOUT, errno.ECONNRESET,
                             errno.ECONNREFUSED, errno.ECONNABORTED, errno.EAGAIN, errno.EPIPE})
METADATA_NAMES = ("zarr.json", ".zarray", ".zattrs", ".zgroup")  # read again after a write
T = TypeVar("T")


class StoreError(RuntimeError):
    """An object store stayed unreachable through every retry (one sentence naming the URL)."""


def http_status(e: BaseException) -> int | None:
    """The HTTP status an error carries (aiohttp: `status`, gcsfs's HttpError: `code`)."""
    for name in ("status", "code"):
        value = getattr(e, name, None)
        if isinstance(value, int):
            return value
        if isinstance(value, str) and value.isdigit():
            return int(value)
    return None


def is_refused(e: BaseException) -> bool:
    """Whether the store said no to these credentials (bad keys, no permission)."""
    if isinstance(e, PermissionError) or http_status(e) in REFUSED_STATUS:
        return True
    return isinstance(e, OSError) and e.errno is None and str(e).startswith("Forbidden")


def is_transient(e: BaseException) -> bool:
    """Whether retrying may help: connection failures, timeouts, throttling and 5xx answers."""
    if isinstance(e, FileNotFoundError | NotADirectoryError) or is_refused(e):
        return False
    if any(c.__name__ in TRANSIENT_NAMES for c in type(e).__mro__):
        return True
    if isinstance(e, OSError) and e.errno in TRANSIENT_ERRNO:
        return True
    status = http_status(e)
    return status is not None and (status >= 500 or status in TRANSIENT_STATUS)


def tries(loc: Location | None = None) -> int:
    """ZNNI_STORE_RETRIES, else the default for the location's scheme."""
    default = 1 if loc is not None and loc.scheme in SELF_RETRYING_SCHEMES else DEFAULT_TRIES
    try:
        return max(1, int(os.environ.get(RETRIES_ENV, default)))
    except ValueError:
        return default


def delay(attempt: int) -> float:
    return min(MAX_BACKOFF_S, BACKOFF_S * 2**attempt)


def gave_up(where: Location, n: int, e: BaseException) -> StoreError:
    return StoreError(f"the store at {where} did not answer after {n} "
                      f"{'try' if n == 1 else 'tries'} ({type(e).__name__}: {e})")


def retrying(fn: Callable[[], T], where: Location) -> T:
    """fn(), retried with backoff while it fails transiently; then StoreError naming `where`."""
    n = tries(where)
    for attempt in range(n):
        try:
            return fn()
        except Exception as e:
            if not is_transient(e):
                raise
            if attempt == n - 1:
                raise gave_up(where, n, e) from e
            time.sleep(delay(attempt))
    raise AssertionError("unreachable")

