"""The statistics pass against numpy on the whole array: mean, population std and numpy's
linear percentiles, per channel and over all channels, for integer and float inputs, read in
small slabs; a histogram bin too full to gather stays within one bin width."""

from __future__ import annotations

import numpy as np
import pytest

from znni.engine.compute import statistics as S
from znni.engine.geometry import Box
from znni.model.processing import Stat

QS = (0.0, 1.3, 50.0, 99.7, 100.0)


def _volume(dtype: str) -> np.ndarray:
    rng = np.random.default_rng(11)
    if dtype == "bool":
        return rng.random((2, 9, 14, 11)) > 0.3
    vol = rng.normal(100, 40, (2, 9, 14, 11)) * np.array([1, 5]).reshape(2, 1, 1, 1)
    return vol.astype(dtype)


@pytest.mark.parametrize("dtype", ["uint8", "int16", "uint16", "float32", "float64", "bool"])
@pytest.mark.parametrize("joint", [True, False])
def test_equal_to_numpy_over_the_region(monkeypatch, dtype: str, joint: bool) -> None:
    monkeypatch.setattr(S, "SLAB_VOXELS", 500)  # many slabs of a few planes
    vol = _volume(dtype)
    region = Box((1, 2, 0), (8, 13, 11))
    stats = tuple(Stat("percentile", q, joint) for q in QS) + (
        Stat("mean", joint=joint), Stat("std", joint=joint))
    got = S.compute_statistics(lambda b: vol[(slice(None), *b.slices())], region, 2,
                               vol.dtype, stats)
    sub = vol[(slice(None), *region.slices())].astype(np.float64)
    groups = [sub] if joint else [sub[0], sub[1]]
    for s in stats:
        if s.kind == "percentile":
            want = [np.percentile(g, s.q) for g in groups]
        else:
            want = [getattr(g, s.kind)() for g in groups]
        assert got[s.key()] == pytest.approx(want, rel=1e-12, abs=1e-9), s.key()


def test_slabs_cover_the_region_in_bounded_pieces(monkeypatch) -> None:
    monkeypatch.setattr(S, "SLAB_VOXELS", 1000)
    region = Box((3, 1, 2), (40, 11, 12))
    slabs = list(S.slabs(region, 2))
    assert all(b.size * 2 <= 1000 for b in slabs)
    assert [b.lo[0] for b in slabs][0] == 3 and slabs[-1].hi[0] == 40
    assert sum(b.size for b in slabs) == region.size


def test_a_too_full_bin_stays_within_one_bin_width(monkeypatch) -> None:
    monkeypatch.setattr(S, "EXACT_CAP", 0)  # no bin is gathered: every value is a bin edge
    vol = _volume("float32")
    region = Box((0, 0, 0), vol.shape[1:])
    stats = tuple(Stat("percentile", q, False) for q in QS)
    got = S.compute_statistics(lambda b: vol[(slice(None), *b.slices())], region, 2,
                               vol.dtype, stats)
    errors = []
    for c in range(2):
        width = (float(vol[c].max()) - float(vol[c].min())) / S.HIST_BINS
        for s in stats:
            errors.append(abs(got[s.key()][c] - np.percentile(vol[c].astype(np.float64), s.q)))
            assert errors[-1] <= width * (1 + 1e-9)
    assert max(errors) > 0  # the edges, not the exact values
