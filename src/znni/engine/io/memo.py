"""Answers of an object store remembered while one run sets itself up.

A run's checks, its output creation and its ledger setup each ask the store the same
questions: the input's and the output's `zarr.json`, the output's listing, the ledger's
header. Each request costs milliseconds of client CPU that the compute needs, so a setup
runs with `StoreContext.remembering()`: the first answer to a read or a listing of a URL
is kept in the context's `Memo` and later ones reuse it. Every write or delete made
through `stores` (and through its zarr stores) with that context forgets what it may
change: the object itself, anything under it, and the listings of the prefixes above it
(an object put whole is remembered as written). Only this process's own writes are seen,
so the memo covers one run's setup (a single writer per output) and is closed when it
ends: block writes, other processes and Dask workers ask the store again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from znni.engine.context import Memo
from znni.engine.location import Location

T = TypeVar("T")


def remembered_read(memo: Memo | None, loc: Location, fetch: Callable[[], bytes | None]
                    ) -> bytes | None:
    """fetch()'s answer for `loc`, asked once while `memo` is open (else every time)."""
    if memo is None or not memo.open:
        return fetch()
    return _remembered(memo, memo.reads, loc.url, fetch)


def remembered_list(memo: Memo | None, loc: Location,
                    fetch: Callable[[], list[str]]) -> list[str]:
    """fetch()'s listing of `loc`, asked once while `memo` is open (else every time)."""
    if memo is None or not memo.open:
        return fetch()
    names: list[str] = _remembered(memo, memo.lists, loc.url, fetch)
    return list(names)


def _remembered(m: Memo, answers: dict[str, T], url: str, fetch: Callable[[], T]) -> T:
    """The answer kept for `url` in `answers`, or fetch()'s, kept from now on."""
    key = url.rstrip("/")
    with m.lock:
        if key in answers:
            return answers[key]
    value = fetch()
    with m.lock:
        if m.open:
            answers[key] = value
    return value


def forget(memo: Memo | None, loc: Location) -> None:
    """Called after every write or delete of `loc` (an object or a prefix)."""
    if memo is not None and memo.open:
        memo.forget(loc.url)


def wrote(memo: Memo | None, loc: Location, data: bytes) -> None:
    """Called after `data` was put at `loc`: later reads in the setup get it unasked."""
    if memo is not None and memo.open:
        memo.forget(loc.url)
        with memo.lock:
            if memo.open:
                memo.reads[loc.url.rstrip("/")] = data
