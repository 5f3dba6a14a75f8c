"""make_worker knows the three worker kinds, and says so for anything else."""

from __future__ import annotations

import pytest

from znni.engine.workers.base import VolumeWorker
from znni.engine.workers.exact_graph import ExactGraphWorker
from znni.engine.workers.make import make_worker
from znni.engine.workers.mpf import BlockWorker
from znni.engine.workers.windowed import WindowedWorker


def test_every_worker_kind_shares_the_volume_set_up() -> None:
    for kind in (BlockWorker, ExactGraphWorker, WindowedWorker):
        assert issubclass(kind, VolumeWorker)
        for method in ("read", "compute"):  # each kind's own; write and run are shared
            assert getattr(kind, method) is not getattr(VolumeWorker, method)


def test_an_unknown_spec_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="no worker computes blocks of a dict"):
        make_worker({"input_path": "x"})  # type: ignore[arg-type]
