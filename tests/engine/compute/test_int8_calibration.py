"""int8's calibration sample (engine/compute/int8_calibration.py) and its error measure
(engine/compute/precision_error.relative_error): windows spread over the region, the same
for the same seed, constant and masked-out windows skipped, preprocessed as the engine
feeds windows, held-out windows disjoint, fewer where the region holds fewer, an empty
volume refused in one sentence; the error against an independent numpy computation."""

from __future__ import annotations

import numpy as np
import pytest

from znni.engine.compute.int8_calibration import (
    CALIBRATION_WINDOWS,
    HELDOUT_WINDOWS,
    axis_origins,
    candidate_origins,
    sample_windows,
)
from znni.engine.compute.precision_error import relative_error
from znni.engine.geometry import Box
from znni.engine.output.labels import parse_labels


class Model:
    """What the sample reads of a model: its input transform (x / 255 - 0.5)."""

    def network_input(self, raw: np.ndarray) -> np.ndarray:
        return raw.astype(np.float32) * np.float32(1 / 255) - np.float32(0.5)


def _reader(vol: np.ndarray, reads: list[Box] | None = None):
    def read(box: Box) -> np.ndarray:
        if reads is not None:
            reads.append(box)
        return vol[None, box.lo[0]:box.hi[0], box.lo[1]:box.hi[1], box.lo[2]:box.hi[2]]
    return read


def test_axis_origins_spread_from_end_to_end() -> None:
    assert axis_origins(0, 100, 20, 5) == [0, 20, 40, 60, 80]
    assert axis_origins(10, 40, 20, 50) == list(range(10, 21))  # as many as there are
    assert axis_origins(0, 12, 16, 4) == [-2]  # a window larger than the axis: centred


def test_candidates_are_spread_and_fixed_by_the_seed() -> None:
    region, window = Box((0, 0, 0), (64, 128, 128)), (16, 32, 32)
    first = candidate_origins(region, window, 20)
    assert first == candidate_origins(region, window, 20)  # the same seed, the same order
    assert first != candidate_origins(region, window, 20, seed=1)
    assert len(set(first)) == len(first)
    assert all(0 <= o[a] <= region.hi[a] - window[a] for o in first for a in range(3))
    head = first[:20]  # the windows a full sample takes: every octant of the region seen
    octants = {tuple(int(o[a] + window[a] / 2 >= region.shape[a] / 2) for a in range(3))
               for o in head}
    assert len(octants) == 8


def test_constant_windows_are_skipped_and_the_rest_preprocessed() -> None:
    rng = np.random.default_rng(0)
    vol = rng.integers(1, 255, (64, 96, 96)).astype(np.uint8)
    vol[:, :48] = 0  # half the volume is empty
    vol[:, 48:, :20] = 7  # and a constant slab
    region, window = Box.from_shape(vol.shape), (16, 32, 32)
    s = sample_windows(_reader(vol), region, window, Model())  # type: ignore[arg-type]
    assert s.calibration.shape == (CALIBRATION_WINDOWS, 1, *window)
    assert s.held_out.shape == (HELDOUT_WINDOWS, 1, *window)
    assert s.disjoint and len(set(s.origins)) == len(s.origins)  # held out: none calibrated
    assert s.probed > len(s.origins)  # empty windows were read and passed over
    for o, w in zip(s.origins, [*s.calibration, *s.held_out], strict=True):
        raw = vol[o[0]:o[0] + 16, o[1]:o[1] + 32, o[2]:o[2] + 32]
        assert raw.min() != raw.max()
        np.testing.assert_allclose(w[0], raw / 255 - 0.5, rtol=0, atol=1e-6)
    again = sample_windows(_reader(vol), region, window, Model())  # type: ignore[arg-type]
    assert again.origins == s.origins and np.array_equal(again.calibration, s.calibration)


def test_the_mask_and_the_roi_bound_the_sample() -> None:
    vol = np.random.default_rng(1).integers(0, 255, (48, 96, 96)).astype(np.uint8)
    region, window = Box((8, 0, 16), (48, 96, 96)), (16, 32, 32)
    reads: list[Box] = []

    def inside(box: Box) -> bool:  # the mask covers x >= 48 only
        return box.hi[2] > 48

    s = sample_windows(_reader(vol, reads), region, window, Model(),  # type: ignore[arg-type]
                       inside=inside)
    assert all(o[2] + 32 > 48 for o in s.origins)
    assert all(region.contains(b) for b in reads)


def test_a_small_region_gives_fewer_windows_and_a_disjoint_held_out_one() -> None:
    vol = np.random.default_rng(2).integers(0, 255, (16, 40, 32)).astype(np.uint8)
    s = sample_windows(_reader(vol), Box.from_shape(vol.shape), (16, 32, 32),
                       Model())  # type: ignore[arg-type]
    n = len(s.origins)  # z and x one origin, y 5 spread over 0..8: 5 windows
    assert n == 5 and s.held_out.shape[0] == 1 and s.calibration.shape[0] == 4
    assert s.disjoint and s.origins[-1] not in s.origins[:-1]


def test_a_region_smaller_than_the_window_is_zero_padded_as_the_engine_pads() -> None:
    vol = np.random.default_rng(3).integers(1, 255, (10, 20, 30)).astype(np.uint8)
    s = sample_windows(_reader(vol), Box.from_shape(vol.shape), (16, 32, 32),
                       Model())  # type: ignore[arg-type]
    assert not s.disjoint and s.calibration.shape == (1, 1, 16, 32, 32)
    w = s.calibration[0, 0]
    inner = w[3:13, 6:26, 1:31]  # centred, as MONAI pads a volume smaller than the window
    np.testing.assert_allclose(inner, vol / 255 - 0.5, rtol=0, atol=1e-6)
    assert np.count_nonzero(w) == np.count_nonzero(inner)


def test_only_empty_windows_are_refused_in_one_sentence() -> None:
    vol = np.zeros((32, 64, 64), np.uint8)
    with pytest.raises(ValueError) as e:
        sample_windows(_reader(vol), Box.from_shape(vol.shape), (16, 32, 32),
                       Model(), where="em.zarr/raw")  # type: ignore[arg-type]
    text = str(e.value)
    assert text.startswith("int8 calibration found only empty windows in em.zarr/raw")
    assert "\n" not in text and text.count(". ") == 0


def test_the_error_is_max_and_mean_over_the_fp32_range() -> None:
    rng = np.random.default_rng(4)
    ref = rng.random((3, 2, 4, 5, 6)).astype(np.float32) * 3 - 1
    got = ref + rng.normal(0, 0.01, ref.shape).astype(np.float32)
    error = relative_error(ref, got)
    span = ref.max() - ref.min()  # independent: numpy over the flattened outputs
    flat = [abs(float(g) - float(r)) for g, r in zip(got.ravel(), ref.ravel(), strict=True)]
    assert error["max_error"] == pytest.approx(max(flat) / span, rel=1e-6)
    assert error["mean_error"] == pytest.approx(sum(flat) / len(flat) / span, rel=1e-6)
    assert error["labels_changed"] is None


def test_labels_changed_counts_voxels_whose_label_differs() -> None:
    ref = np.zeros((2, 1, 2, 2, 2), np.float32)
    ref[0, 0, 0, 0, 0] = 0.6
    got = ref.copy()
    got[0, 0, 0, 0, 0] = 0.4  # crosses the threshold: one voxel of 16
    got[1, 0, 1, 1, 1] = 0.3  # moves but stays below
    spec = parse_labels("threshold:0.5")
    error = relative_error(ref, got, spec.apply)
    assert error["labels_changed"] == pytest.approx(1 / 16)
    assert error["max_error"] == pytest.approx(0.3 / 0.6)
    argmax = relative_error(np.stack([ref[:, 0], 1 - ref[:, 0]], 1),
                            np.stack([got[:, 0], 1 - got[:, 0]], 1),
                            parse_labels("argmax").apply)
    assert argmax["labels_changed"] == pytest.approx(1 / 16)


class GridModel:
    """What calibration_window reads of a model: its window grid."""

    def __init__(self, least: tuple[int, int, int], step: tuple[int, int, int],
                 fixed: tuple[int, int, int] | None = None) -> None:
        self.min_window, self.size_factor, self.fixed_window = least, step, fixed


def test_calibration_windows_are_capped_on_the_models_grid() -> None:
    from znni.engine.compute.int8_calibration import CALIBRATION_SIDE, calibration_window

    assert CALIBRATION_SIDE == 64
    u = GridModel((16, 16, 16), (16, 16, 16))
    assert calibration_window(u, (256, 48, 128)) == (64, 48, 64)  # a short axis kept
    assert calibration_window(u, (32, 32, 32)) == (32, 32, 32)  # under the cap: the window
    odd = GridModel((20, 20, 100), (8, 8, 8))  # 20 + 5 * 8 = 60 <= 64; 100 is the least
    assert calibration_window(odd, (100, 36, 300)) == (60, 36, 100)
    fixed = GridModel((16, 16, 16), (16, 16, 16), fixed=(128, 128, 128))
    assert calibration_window(fixed, (128, 128, 128)) == (128, 128, 128)
