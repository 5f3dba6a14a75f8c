"""Retrying an object store's transient failures: connections refused or reset, timeouts,
throttling and 5xx answers are retried with backoff, ZNNI_STORE_RETRIES tries in all
(default 5, and 1 for gs://, whose client retries each request itself); then `StoreError`
names the URL. Refusals (401, 403) are never retried.

The clients say these things differently: s3fs raises PermissionError and OSErrors with an
errno, gcsfs an `HttpError` with the HTTP `code`, a plain OSError "Forbidden: ..." for 403
and a requests/aiohttp error for a lost connection. `retrying` wraps a synchronous call,
`retrying_store` a zarr store (every get, set and delete)."""

from __future__ import annotations

import asyncio
import errno
import os
import posixpath
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from znni.engine.store_memo import forget, wrote

RETRIES_ENV = "ZNNI_STORE_RETRIES"
DEFAULT_TRIES = 5
# gcsfs retries each request itself (6 tries, 1-16 s apart: about 31 s); znni's 5 tries
# around that made a dead GCS endpoint take 2.5 min to fail, so gs:// gets one by default
SELF_RETRYING_SCHEMES = ("gs://", "gcs://")
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


def tries(url: str = "") -> int:
    """ZNNI_STORE_RETRIES, else the default for `url`'s scheme."""
    default = 1 if url.startswith(SELF_RETRYING_SCHEMES) else DEFAULT_TRIES
    try:
        return max(1, int(os.environ.get(RETRIES_ENV, default)))
    except ValueError:
        return default


def delay(attempt: int) -> float:
    return min(MAX_BACKOFF_S, BACKOFF_S * 2**attempt)


def gave_up(url: str, n: int, e: BaseException) -> StoreError:
    return StoreError(f"the store at {url} did not answer after {n} "
                      f"{'try' if n == 1 else 'tries'} ({type(e).__name__}: {e})")


def retrying(fn: Callable[[], T], url: str) -> T:
    """fn(), retried with backoff while it fails transiently; then StoreError naming `url`."""
    n = tries(url)
    for attempt in range(n):
        try:
            return fn()
        except Exception as e:
            if not is_transient(e):
                raise
            if attempt == n - 1:
                raise gave_up(url, n, e) from e
            time.sleep(delay(attempt))
    raise AssertionError("unreachable")


_STORE_CLASS: list[type] = []


def retrying_store(store: Any, url: str) -> Any:
    """zarr `store` (an FsspecStore at `url`) retrying transient failures like `retrying`."""
    return _retrying_store_class()(store, url)


def _key_url(url: str, key: str) -> str:
    return posixpath.join(url.rstrip("/"), key) if key else url


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
            n = tries(self.url)
            for attempt in range(n):
                try:
                    return await make()
                except Exception as e:
                    if not is_transient(e):
                        raise
                    if attempt == n - 1:
                        raise gave_up(_key_url(self.url, key), n, e) from e
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
                forget(_key_url(self.url, key))

        async def set(self, key: str, value: Any) -> None:
            await self._write(key, lambda: self._store.set(key, value))
            if key.endswith(METADATA_NAMES):  # metadata is read again (chunks are not)
                wrote(_key_url(self.url, key), value.to_bytes())

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
