"""Shared by the primitive tests: a two-thread pool."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest


@pytest.fixture(scope="module")
def pool():
    with ThreadPoolExecutor(2) as p:
        yield p
