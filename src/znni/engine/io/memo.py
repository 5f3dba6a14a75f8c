"""Answers of an object store remembered while one run sets itself up (`memo()`).

A run's checks, its output creation and its ledger setup each ask the store the same
questions: the input's and the output's `zarr.json`, the output's listing, the ledger's
header. Each request costs milliseconds of client CPU that the compute needs, so inside
`memo()` the first answer to a read or a listing of a URL is kept and later ones reuse it.
Every write or delete this process makes through `stores` (and through its zarr stores)
inside the scope forgets what it may change: the object itself, anything under it, and the
listings of the prefixes above it (an object put whole is remembered as written). Only
this process's own writes are seen, so the scope covers one run's setup (a single writer
per output), never its compute: block writes from worker threads, other processes and
Dask workers are outside it and ask the store again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

T = TypeVar("T")


class Memo:
    """Reads (URL -> bytes or None) and listings (URL -> names) answered so far."""

    def __init__(self) -> None:
        self.reads: dict[str, bytes | None] = {}
        self.lists: dict[str, list[str]] = {}
        self.lock = threading.Lock()

    def forget(self, url: str) -> None:
        """Drop what a write or delete of `url` (an object or a whole prefix) may change."""
        url = url.rstrip("/")
        with self.lock:
            for k in [k for k in self.reads if k == url or k.startswith(url + "/")]:
                del self.reads[k]
            for k in [k for k in self.lists
                      if k == url or url.startswith(k + "/") or k.startswith(url + "/")]:
                del self.lists[k]


_MEMO: ContextVar[Memo | None] = ContextVar("znni_store_memo", default=None)


@contextmanager
def memo() -> Iterator[None]:
    """Remember store answers in this scope (nested scopes share the outermost)."""
    if _MEMO.get() is not None:
        yield
        return
    token = _MEMO.set(Memo())
    try:
        yield
    finally:
        _MEMO.reset(token)


def remembered_read(url: str, fetch: Callable[[], bytes | None]) -> bytes | None:
    """fetch()'s answer for `url`, asked once per scope (outside one: every time)."""
    m = _MEMO.get()
    return fetch() if m is None else _remembered(m, m.reads, url, fetch)


def remembered_list(url: str, fetch: Callable[[], list[str]]) -> list[str]:
    """fetch()'s listing of `url`, asked once per scope (outside one: every time)."""
    m = _MEMO.get()
    if m is None:
        return fetch()
    return list(_remembered(m, m.lists, url, lambda: list(fetch())))


def _remembered(m: Memo, answers: dict[str, T], url: str, fetch: Callable[[], T]) -> T:
    """The answer kept for `url` in `answers`, or fetch()'s, kept from now on."""
    key = url.rstrip("/")
    with m.lock:
        if key in answers:
            return answers[key]
    value = fetch()
    with m.lock:
        answers[key] = value
    return value


def forget(url: str) -> None:
    """Called after every write or delete of `url` (an object or a prefix)."""
    m = _MEMO.get()
    if m is not None:
        m.forget(url)


def wrote(url: str, data: bytes) -> None:
    """Called after `data` was put at `url`: later reads in the scope get it unasked."""
    m = _MEMO.get()
    if m is not None:
        m.forget(url)
        with m.lock:
            m.reads[url.rstrip("/")] = data
