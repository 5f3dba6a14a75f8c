"""Retrying an object store's transient failures: connections refused or reset, timeouts,
throttling and 5xx answers are retried with backoff, ZNNI_STORE_RETRIES tries in all
(default 5); then `StoreError` names the URL."""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from typing import TypeVar

RETRIES_ENV = "ZNNI_STORE_RETRIES"
DEFAULT_TRIES = 5
BACKOFF_S, MAX_BACKOFF_S = 0.5, 8.0
TRANSIENT_NAMES = frozenset({
    "ConnectionError", "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",
    "ConnectionClosedError", "HTTPClientError", "ClientConnectionError", "ClientOSError",
    "ServerDisconnectedError", "ClientPayloadError", "FSTimeoutError", "TimeoutError",
    "IncompleteRead", "ResponseStreamingError", "ProxyConnectionError",
})
TRANSIENT_ERRNO = frozenset({errno.EBUSY, errno.EREMOTEIO, errno.ETIMEDOUT, errno.ECONNRESET,
                             errno.ECONNREFUSED, errno.ECONNABORTED, errno.EAGAIN, errno.EPIPE})
T = TypeVar("T")


class StoreError(RuntimeError):
    """An object store stayed unreachable through every retry (one sentence naming the URL)."""


def is_transient(e: BaseException) -> bool:
    """Whether retrying may help: connection failures, timeouts, throttling and 5xx answers."""
    if isinstance(e, PermissionError | FileNotFoundError | NotADirectoryError):
        return False
    if any(c.__name__ in TRANSIENT_NAMES for c in type(e).__mro__):
        return True
    if isinstance(e, OSError) and e.errno in TRANSIENT_ERRNO:
        return True
    status = getattr(e, "status", None)
    return isinstance(status, int) and status >= 500


def tries() -> int:
    try:
        return max(1, int(os.environ.get(RETRIES_ENV, DEFAULT_TRIES)))
    except ValueError:
        return DEFAULT_TRIES


def delay(attempt: int) -> float:
    return min(MAX_BACKOFF_S, BACKOFF_S * 2**attempt)


def gave_up(url: str, n: int, e: BaseException) -> StoreError:
    return StoreError(f"the store at {url} did not answer after {n} tries "
                      f"({type(e).__name__}: {e})")


def retrying(fn: Callable[[], T], url: str) -> T:
    """fn(), retried with backoff while it fails transiently; then StoreError naming `url`."""
    n = tries()
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
