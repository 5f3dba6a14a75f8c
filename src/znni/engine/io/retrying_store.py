"""A zarr store that retries its wrapped store's transient failures (`retry.py`
decides what is transient, how often and how long to wait). Its own module, imported on a
store's first use, because importing zarr is heavy."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from zarr.storage import WrapperStore

from znni.engine.context import Memo
from znni.engine.io.memo import forget, wrote
from znni.engine.io.retry import METADATA_NAMES, delay, gave_up, is_transient, tries
from znni.engine.location import Location


class RetryingStore(WrapperStore[Any]):
    """Every get, set and delete of the wrapped store, retried; a write forgets what
    the setup's memo (`io/memo.py`) remembered about its key."""

    def __init__(self, store: Any, location: Location, memo: Memo | None = None) -> None:
        super().__init__(store)
        self.location = location
        self.memo = memo

    def _with_store(self, store: Any) -> Any:
        return type(self)(store, self.location, self.memo)

    def _at(self, key: str) -> Location:
        """Where `key` of this store lives (for messages and the memo)."""
        return self.location.join(key) if key else self.location

    async def _retry(self, key: str, make: Callable[[], Any]) -> Any:
        n = tries(self.location)
        for attempt in range(n):
            try:
                return await make()
            except Exception as e:
                if not is_transient(e):
                    raise
                if attempt == n - 1:
                    raise gave_up(self._at(key), n, e) from e
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
            forget(self.memo, self._at(key))

    async def set(self, key: str, value: Any) -> None:
        await self._write(key, lambda: self._store.set(key, value))
        if key.endswith(METADATA_NAMES):  # metadata is read again (chunks are not)
            wrote(self.memo, self._at(key), value.to_bytes())

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
