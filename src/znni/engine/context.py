"""The store context: what every call that opens or asks a store is given, explicitly.

As tensorstore's `Context`: the store options and credentials of a job (fsspec options
by bucket, from `--storage-option`, on top of the environment's) are a picklable value
carried in the job and in every block spec, so a Dask worker receives them with the spec
and nothing is copied into module globals by hand. The context also holds what a process
learns about its stores (opened arrays, buckets seen to exist) and, during one run's
setup only, the answers it remembers (`Memo`, `io/memo.py`). Those are never pickled: a
context that crosses to another process arrives with its options and empty caches.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

OPEN_CACHE_ENTRIES = 64  # opened arrays kept per context


class Memo:
    """Store answers remembered during one run's setup: reads (URL -> bytes or None) and
    listings (URL -> names). Closed when the setup ends, so writes from the compute that
    follows (other threads) neither read from it nor pay to update it."""

    def __init__(self) -> None:
        self.reads: dict[str, bytes | None] = {}
        self.lists: dict[str, list[str]] = {}
        self.lock = threading.Lock()
        self.open = True

    def close(self) -> None:
        with self.lock:
            self.open = False
            self.reads.clear()
            self.lists.clear()

    def forget(self, url: str) -> None:
        """Drop what a write or delete of `url` (an object or a whole prefix) may change."""
        url = url.rstrip("/")
        with self.lock:
            for k in [k for k in self.reads if k == url or k.startswith(url + "/")]:
                del self.reads[k]
            for k in [k for k in self.lists
                      if k == url or url.startswith(k + "/") or k.startswith(url + "/")]:
                del self.lists[k]


class StoreCaches:
    """What one process has learnt about its stores; shared by the copies of a context
    made in this process, never pickled."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # (resolved path, metadata bytes) -> opened zarr array (`io/volume.py`), LRU
        self.opened: OrderedDict[tuple[str, tuple[bytes | None, ...]], Any] = OrderedDict()
        self.buckets_found: set[str] = set()  # gs buckets seen to exist (`io/stores.py`)


@dataclass(frozen=True)
class StoreContext:
    """Store options by bucket, and this process's store caches (see the module docstring).

    Equal contexts have equal options; the caches and the memo are not compared.
    """

    # "scheme://bucket" -> fsspec options (endpoint, keys, token, ...) for s3:// and gs://
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    caches: StoreCaches = field(default_factory=StoreCaches, compare=False, repr=False)
    memo: Memo | None = field(default=None, compare=False, repr=False)

    def with_bucket_options(self, roots: list[str], options: Mapping[str, Any]) -> StoreContext:
        """This context with `options` for every bucket in `roots` ("scheme://bucket")."""
        added = {r: dict(options) for r in roots}
        return replace(self, options={**self.options, **added})

    @contextmanager
    def remembering(self) -> Iterator[StoreContext]:
        """This context with a `Memo` for the scope (nested: the outer scope's), closed at
        its end: for one run's setup, which asks the stores the same questions several
        times, while the compute that follows asks again."""
        if self.memo is not None and self.memo.open:
            yield self
            return
        memo = Memo()
        try:
            yield replace(self, memo=memo)
        finally:
            memo.close()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Only the options travel; the receiving process starts with empty caches."""
        return (StoreContext, ({k: dict(v) for k, v in self.options.items()},))
