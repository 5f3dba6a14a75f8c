"""Shared by the primitive tests: a two-thread pool, and naive_graph.py importable."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:  # naive_graph.py, the graph ops' references
    sys.path.insert(0, HERE)


@pytest.fixture(scope="module")
def pool():
    with ThreadPoolExecutor(2) as p:
        yield p
