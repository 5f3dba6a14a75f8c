"""MONAI-equivalent sliding-window geometry and blending, checked against MONAI itself."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from znni.engine.compute.windows import (
    WindowGrid,
    blend_box,
    importance_map,
    read_window_input,
    window_group,
    windows_touching,
)

torch = pytest.importorskip("torch")

C_IN, C_OUT = 2, 3
CASES = [  # (volume, window): odd, anisotropic, and smaller than W on some axes
    ((23, 40, 37), (8, 16, 12)),
    ((9, 50, 31), (12, 16, 10)),
    ((20, 70, 70), (32, 32, 32)),
    ((19, 40, 33), (24, 16, 40)),
    ((16, 30, 21), (16, 8, 21)),
]
OVERLAPS = [0.0, 0.25, 0.5, 0.6]
MODES = ["constant", "gaussian"]


def _make_predictor(window: tuple[int, int, int]):
    """A fixed random conv plus a ramp in the window's local index: not translation
    invariant, so wrong scan positions or weights change the blended output."""
    gen = torch.Generator().manual_seed(7)
    conv = torch.nn.Conv3d(C_IN, C_OUT, 3, padding=1)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=gen) * 0.3)
        conv.bias.copy_(torch.randn(conv.bias.shape, generator=gen))
    z, y, x = (torch.arange(w, dtype=torch.float32) for w in window)
    ramp = torch.sin(0.7 * z)[:, None, None] + 0.05 * y[None, :, None] ** 2 / window[1]
    ramp = ramp + 0.3 * x[None, None, :]
    scale = torch.arange(1, C_OUT + 1, dtype=torch.float32)[:, None, None, None]
    ramp = ramp[None] * scale  # (C_OUT, *W)

    def predict(batch):
        with torch.no_grad():
            return conv(batch) + ramp[None]

    return predict


def _volume(shape: tuple[int, int, int], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((C_IN, *shape)).astype(np.float32)


def _ours(vol: np.ndarray, grid: WindowGrid, predict, mode: str, lo, hi) -> np.ndarray:
    def run_window(start):
        win = torch.from_numpy(read_window_input(vol, grid, start))[None]
        return predict(win)[0].numpy()

    return blend_box(grid, lo, hi, run_window, mode, C_OUT)


@pytest.fixture(scope="module")
def monai():
    return pytest.importorskip("monai")


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("overlap", OVERLAPS)
@pytest.mark.parametrize("mode", MODES)
def test_blend_matches_monai(monai, case, overlap: float, mode: str) -> None:
    from monai.inferers import sliding_window_inference

    shape, window = case
    vol = _volume(shape)
    predict = _make_predictor(window)
    ref = sliding_window_inference(
        torch.from_numpy(vol)[None],
        window,
        3,
        predict,
        overlap=overlap,
        mode=mode,
        sigma_scale=0.125,
        padding_mode="constant",
        cval=0.0,
    )[0].numpy()
    grid = WindowGrid.for_volume(shape, window, overlap)
    ours = _ours(vol, grid, predict, mode, (0, 0, 0), shape)
    assert ours.shape == ref.shape == (C_OUT, *shape)
    assert np.abs(ours - ref).max() <= 1e-4 * max(1.0, float(np.abs(ref).max()))


def _layouts(shape, rng) -> list[list[tuple[tuple[int, ...], tuple[int, ...]]]]:
    """Several tilings of the volume into 2-5 boxes at random (odd where possible) cuts."""
    plans = [{0: 1}, {1: 2}, {0: 1, 2: 1}, {2: 4}, {1: 1, 0: 1}]
    layouts = []
    for plan in plans:
        edges = []
        for d in range(3):
            n = min(plan.get(d, 0), shape[d] - 1)
            odd = [c for c in range(1, shape[d]) if c % 2] or list(range(1, shape[d]))
            pool = odd if len(odd) >= n else list(range(1, shape[d]))
            cuts = sorted(rng.choice(pool, size=n, replace=False).tolist())
            edges.append([0, *cuts, shape[d]])
        boxes = [
            tuple(zip(*((e[i], e[i + 1]) for e, i in zip(edges, idx))))
            for idx in itertools.product(*(range(len(e) - 1) for e in edges))
        ]
        layouts.append(boxes)
    return layouts


@pytest.mark.parametrize("case", CASES[:4], ids=str)
@pytest.mark.parametrize("mode", MODES)
def test_blocks_independent_of_layout(case, mode: str) -> None:
    shape, window = case
    vol = _volume(shape, seed=1)
    predict = _make_predictor(window)
    overlap = 0.6 if mode == "gaussian" else 0.25
    grid = WindowGrid.for_volume(shape, window, overlap)
    whole = _ours(vol, grid, predict, mode, (0, 0, 0), shape)
    rng = np.random.default_rng(sum(shape) + sum(window))
    for boxes in _layouts(shape, rng):
        assert 2 <= len(boxes) <= 5
        out = np.full_like(whole, np.nan)
        for lo, hi in boxes:
            sl = (slice(None), *(slice(a, b) for a, b in zip(lo, hi)))
            out[sl] = _ours(vol, grid, predict, mode, lo, hi)
        np.testing.assert_array_equal(out, whole)


def test_grid_starts_match_monai(monai) -> None:
    from monai.data.utils import dense_patch_slices
    from monai.inferers.utils import _get_scan_interval

    rng = np.random.default_rng(3)
    for _ in range(300):
        shape = tuple(int(v) for v in rng.integers(1, 60, 3))
        window = tuple(int(v) for v in rng.integers(1, 40, 3))
        overlap = float(rng.choice([0.0, 0.1, 0.25, 1 / 3, 0.5, 0.6, 0.7, 0.9, 0.99]))
        grid = WindowGrid.for_volume(shape, window, overlap)
        padded = tuple(max(s, w) for s, w in zip(shape, window))
        interval = _get_scan_interval(padded, window, 3, (overlap,) * 3)
        ref = [tuple(s.start for s in sl) for sl in dense_patch_slices(padded, window, interval)]
        assert grid.padded_shape == padded
        assert grid.all_windows() == ref


def test_windows_touching_matches_brute_force() -> None:
    rng = np.random.default_rng(5)
    for _ in range(200):
        shape = tuple(int(v) for v in rng.integers(1, 50, 3))
        window = tuple(int(v) for v in rng.integers(1, 30, 3))
        grid = WindowGrid.for_volume(shape, window, float(rng.uniform(0, 0.95)))
        for _ in range(5):
            lo = tuple(int(rng.integers(0, s + 1)) for s in shape)
            hi = tuple(int(rng.integers(a, s + 1)) for a, s in zip(lo, shape))
            plo = [a + p for a, p in zip(lo, grid.pad_before)]
            phi = [b + p for b, p in zip(hi, grid.pad_before)]
            brute = [
                s
                for s in grid.all_windows()
                if all(
                    plo[d] < phi[d] and s[d] < phi[d] and s[d] + window[d] > plo[d]
                    for d in range(3)
                )
            ]
            assert windows_touching(grid, lo, hi) == brute
    full = WindowGrid.for_volume((23, 40, 37), (8, 16, 12), 0.5)
    assert windows_touching(full, (0, 0, 0), (23, 40, 37)) == full.all_windows()


@pytest.mark.parametrize("window", [(8, 16, 12), (32, 32, 32), (5, 7, 1), (24, 16, 40)], ids=str)
@pytest.mark.parametrize("sigma_scale", [0.125, 0.3])
@pytest.mark.parametrize("mode", MODES)
def test_importance_map_matches_monai(monai, window, sigma_scale: float, mode: str) -> None:
    from monai.data.utils import compute_importance_map

    ref = compute_importance_map(window, mode=mode, sigma_scale=sigma_scale).numpy()
    ours = importance_map(window, mode, sigma_scale)
    assert ours.dtype == np.float32 and ours.shape == window
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=0)
    assert importance_map(window, mode, sigma_scale) is ours  # cached
    assert not ours.flags.writeable


def test_read_window_input_is_zero_padded() -> None:
    shape, window = (9, 50, 31), (12, 16, 40)
    vol = _volume(shape)
    grid = WindowGrid.for_volume(shape, window, 0.5)
    assert grid.pad_before == (1, 0, 4) and grid.padded_shape == (12, 50, 40)
    padded = np.pad(
        vol,
        [(0, 0)] + [(b, p - s - b) for b, p, s in zip(grid.pad_before, grid.padded_shape, shape)],
    )
    for start in grid.all_windows():
        sl = (slice(None), *(slice(s, s + w) for s, w in zip(start, window)))
        np.testing.assert_array_equal(read_window_input(vol, grid, start), padded[sl])


def test_bad_arguments() -> None:
    for overlap in (-0.1, 1.0, 1.5, math.nan):
        with pytest.raises(ValueError, match="overlap"):
            WindowGrid.for_volume((10, 10, 10), (4, 4, 4), overlap)
    for window in ((0, 4, 4), (4, 4), (4, -1, 4), (4, 4, 4, 4)):
        with pytest.raises(ValueError, match="window"):
            WindowGrid.for_volume((10, 10, 10), window, 0.5)
    for shape in ((10, 10), (10, 0, 10)):
        with pytest.raises(ValueError, match="volume_shape"):
            WindowGrid.for_volume(shape, (4, 4, 4), 0.5)
    with pytest.raises(ValueError, match="mode"):
        importance_map((4, 4, 4), "triangle")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sigma_scale"):
        importance_map((4, 4, 4), "gaussian", 0.0)
    grid = WindowGrid.for_volume((10, 10, 10), (4, 4, 4), 0.5)
    with pytest.raises(ValueError, match="inside volume"):
        windows_touching(grid, (0, 0, 0), (11, 10, 10))
    with pytest.raises(ValueError, match="inside volume"):
        windows_touching(grid, (5, 0, 0), (4, 10, 10))
    with pytest.raises(ValueError, match="volume must be"):
        read_window_input(np.zeros((1, 9, 10, 10), np.float32), grid, (0, 0, 0))
    with pytest.raises(ValueError, match="expected"):
        blend_box(grid, (0, 0, 0), (2, 2, 2), lambda s: np.zeros((1, 3, 4, 4)), "constant", 1)
    assert windows_touching(grid, (3, 3, 3), (3, 5, 5)) == []


def test_window_groups_partition_the_scan_order() -> None:
    """Groups are runs of up to `batch` consecutive windows in MONAI's scan order (across
    rows), counted from the first window: every window is in exactly one group, found
    from any of its members."""
    grid = WindowGrid.for_volume((9, 20, 31), (4, 6, 5), 0.3)
    order = grid.all_windows()
    assert len(order) == 4 * 5 * 10
    for batch in (1, 2, 3, 7, 200, 201):
        groups = []
        for start in order:
            group = window_group(grid, start, batch)
            i = order.index(group[0])
            assert i % batch == 0 and list(group) == order[i : i + batch] and start in group
            assert all(window_group(grid, g, batch) == group for g in group)
            if group[0] == start:
                groups.append(group)
        assert [w for g in groups for w in g] == order
    with pytest.raises(ValueError, match="at least 1"):
        window_group(grid, order[0], 0)
    with pytest.raises(ValueError, match="not a window start"):
        window_group(grid, (0, 0, 1), 2)
