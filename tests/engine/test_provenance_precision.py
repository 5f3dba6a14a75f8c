"""The output's provenance records the run's arithmetic precision."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from support.engine_ref import write_volume

from znni.engine.context import StoreContext
from znni.engine.geometry import Box
from znni.engine.io.volume import open_input
from znni.engine.job import SegmentJob
from znni.engine.location import Location
from znni.engine.output.provenance import provenance


def test_provenance_records_the_precision(tmp_path) -> None:
    inp = write_volume(tmp_path / "in.zarr", np.zeros((4, 4, 4), np.uint8), 3, (4, 4, 4))
    volume = open_input(Location.parse(inp), 1, ctx=StoreContext())
    net = SimpleNamespace(name="n", digest="d")
    for precision in ("fp32", "bf16"):
        job = SegmentJob(net, volume.path, str(tmp_path / "o"), device="gpu",  # type: ignore[arg-type]
                         precision=precision)
        record = provenance(job, volume, Box.from_shape((4, 4, 4)), {"mode": "windowed"})
        assert record["precision"] == precision
