"""`predict`: an agglomeration's time and memory from one sample block, scaled to the
region. Consistency only: no assertion on this machine's absolute speed."""

from __future__ import annotations

import numpy as np
import pytest

from znni.engine.agglomerate.merge import MEMORY_PER_EDGE_BYTES
from znni.engine.agglomerate.predict import BLOCK_BYTES_PER_VOXEL, predict
from znni.engine.agglomerate.synthetic import synthetic_cells


def test_fields_are_positive_and_add_up() -> None:
    p = predict((256, 256, 256), (128, 128, 128), threads=2)
    stages = (p.fragments_s, p.faces_s, p.agglomerate_s, p.relabel_s)
    assert all(s > 0 for s in stages)
    assert p.total_s == pytest.approx(sum(stages))
    assert p.voxels == 256**3 and p.voxels_per_s == pytest.approx(p.voxels / p.total_s)
    assert p.edges > 0 and p.edges_per_voxel == pytest.approx(p.edges / p.voxels)
    assert p.peak_bytes >= BLOCK_BYTES_PER_VOXEL * 128**3 * 2
    assert p.peak_bytes >= p.edges * MEMORY_PER_EDGE_BYTES
    assert set(p.to_dict()) >= {"fragments_s", "faces_s", "agglomerate_s", "relabel_s",
                                "total_s", "voxels_per_s", "peak_bytes", "edges", "basis"}
    line = p.line()
    assert line.startswith("predicted: fragments ") and "total " in line and "GiB" in line


def test_a_larger_region_takes_proportionally_longer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scaling alone, from one fixed measurement (no clock in the assertion)."""
    from znni.engine.agglomerate import predict as module

    sample = module._Sample(fragments_s=1e-7, faces_s=2e-7, relabel_s=3e-8, global_s=1e-6,
                            inner_edges=0.1, face_edges=0.0)
    monkeypatch.setattr(module, "_measure", lambda *args: sample)
    monkeypatch.setattr(module, "_codec_seconds", lambda affs: (1e-8, 2e-8, 1e-8))
    small = predict((128, 256, 256), (64, 64, 64), threads=1)
    large = predict((256, 256, 256), (64, 64, 64), threads=1)
    assert large.edges == pytest.approx(2 * small.edges, rel=0.01)
    for stage in ("fragments_s", "agglomerate_s", "relabel_s"):
        assert getattr(large, stage) == pytest.approx(2 * getattr(small, stage), rel=0.01)
    assert large.faces_s > small.faces_s
    assert large.peak_bytes >= small.peak_bytes


def test_the_memory_is_at_least_the_blocks_working_set() -> None:
    p = predict((32, 32, 32), (32, 32, 32), threads=4)
    assert p.peak_bytes >= BLOCK_BYTES_PER_VOXEL * 32**3 * 4


def test_the_basis_names_the_sample_or_synthetic_cells() -> None:
    _, affs = synthetic_cells((40, 40, 40), seed=2)
    given = predict((200, 200, 200), (128, 128, 128), affs, (0.3, 0.5), threads=2,
                    sample_name="affs.zarr")
    assert "sample of affs.zarr" in given.basis and "40³" in given.basis
    assert "synthetic" not in given.basis
    assumed = predict((200, 200, 200), (128, 128, 128), threads=2)
    assert "synthetic cells" in assumed.basis and "sample of" not in assumed.basis
    assert "lower bound" in assumed.basis


def test_a_sample_larger_than_the_block_is_cropped_to_it() -> None:
    _, affs = synthetic_cells((48, 48, 48), seed=3)
    p = predict((64, 64, 64), (16, 16, 16), affs, threads=1)
    assert "16³ sample" in p.basis


@pytest.mark.parametrize("bad", [np.zeros((2, 8, 8, 8), np.float32),
                                 np.zeros((8, 8, 8), np.float32)])
def test_a_bad_sample_is_one_sentence(bad: np.ndarray) -> None:
    with pytest.raises(ValueError, match="must be \\(3, z, y, x\\) affinities"):
        predict((64, 64, 64), (32, 32, 32), bad)


def test_a_bad_shape_is_one_sentence() -> None:
    with pytest.raises(ValueError, match="three positive sizes"):
        predict((0, 64, 64), (32, 32, 32))
