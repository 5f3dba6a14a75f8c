"""Winograd F(6,3) / F(4,3) / F(2,3) conv against float64 references (scipy and a plain
einsum), and the tile-error check the planner gates F(6,3) with."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view
from support.naive import naive_activation, naive_conv_batch

from znni.primitives.base import Activation
from znni.primitives.cpu.winograd import chunks, transforms, winograd_conv3d
from znni.primitives.cpu.winograd_error import layer_tile_error, tile_error


def _einsum_ref(x, w, b):
    """float64 valid correlation via windows: (S, Cin, n) x (Cout, Cin, 3^3) -> (S, Cout, n-2)."""
    win = sliding_window_view(x.astype(np.float64), (3, 3, 3), axis=(2, 3, 4))
    out = np.einsum("sczyxijk,ocijk->sozyx", win, w.astype(np.float64), optimize=True)
    return out + b.astype(np.float64)[None, :, None, None, None]


def _rel_err(out, ref):
    return float(np.abs(out - ref).max() / max(1.0, np.abs(ref).max()))


def _layer(rng, s, cin, cout, size, dist="normal"):
    x = rng.random((s, cin, *size)) if dist == "uniform" else rng.standard_normal((s, cin, *size))
    w = rng.standard_normal((cout, cin, 3, 3, 3)) / np.sqrt(cin * 27)
    b = rng.standard_normal(cout)
    return x.astype(np.float32), w.astype(np.float32), b.astype(np.float32)


@pytest.mark.parametrize("m", [2, 4, 6])
@pytest.mark.parametrize(
    ("s", "cin", "cout", "out_size", "act"),
    [
        (2, 1, 3, (5, 7, 9), Activation("relu")),
        (2, 16, 16, (13, 6, 11), Activation("leaky_relu", 0.1)),
        (1, 32, 8, (9, 9, 9), Activation("tanh")),
        (1, 3, 4, (1, 2, 3), None),  # smaller than one tile on every axis
        (1, 2, 3, (6, 5, 66), Activation("elu")),  # long x rows: per-window B^T GEMMs
    ],
)
def test_matches_scipy_with_bias_and_activation(pool, m, s, cin, cout, out_size, act):
    rng = np.random.default_rng(cin * 100 + cout + m)
    x, w, b = _layer(rng, s, cin, cout, tuple(o + 2 for o in out_size))
    ref = naive_conv_batch(x, w, b)
    if act is not None:
        ref = naive_activation(ref, act.kind, act.slope)
    out = winograd_conv3d(x, w, b, act, pool=pool, m=m)
    assert out.shape == (s, cout, *out_size) and out.dtype == np.float32
    assert out.flags.c_contiguous
    assert _rel_err(out, ref) <= 1e-4


@pytest.mark.parametrize("dist", ["uniform", "normal"])
@pytest.mark.parametrize(("cin", "cout"), [(128, 128), (64, 32)])
def test_f43_accuracy_bound_on_unet_statistics(pool, dist, cin, cout):
    rng = np.random.default_rng(cin + cout + len(dist))
    x, w, b = _layer(rng, 1, cin, cout, (15, 14, 13), dist)
    err = _rel_err(winograd_conv3d(x, w, b, pool=pool), _einsum_ref(x, w, b))
    assert err <= 1e-4
    assert err <= 2e-5  # the chosen points (0, +-1, 1/2, -2) keep a 5x margin


def test_f63_accuracy_and_its_tile_check_on_unet_statistics(pool):
    """F(6,3) stays within the 1e-4 bound with half of it to spare, ten times F(4,3)'s
    error; the planner's check on 2 tiles per axis reads the same order as a whole layer."""
    rng = np.random.default_rng(63)
    x, w, b = _layer(rng, 1, 32, 16, (20, 15, 26))
    ref = _einsum_ref(x, w, b)
    err6 = _rel_err(winograd_conv3d(x, w, b, pool=pool, m=6), ref)
    err4 = _rel_err(winograd_conv3d(x, w, b, pool=pool, m=4), ref)
    assert err6 <= 5e-5 and err4 <= err6 / 3
    tile6, tile4 = tile_error(w, 6), tile_error(w, 4)
    assert err6 / 4 <= tile6 <= 4 * err6 and tile4 <= tile6 / 3
    assert layer_tile_error(w.copy(), 6) == tile6  # remembered by the weight's bytes
    w[0, 0, 1, 1, 1] += 1.0
    assert layer_tile_error(w, 6) != tile6


@pytest.mark.parametrize("chunk_bytes", [1, 2**15, 2**30])  # tile rows, planes, everything
def test_chunk_sizes_and_serial_run_agree(pool, chunk_bytes):
    rng = np.random.default_rng(7)
    x, w, b = _layer(rng, 2, 4, 5, (11, 14, 10))
    ref = naive_conv_batch(x, w, b)
    for p in (pool, None):
        out = winograd_conv3d(x, w, b, pool=p, chunk_bytes=chunk_bytes)
        assert _rel_err(out, ref) <= 1e-5


@pytest.mark.parametrize("per_chunk", [1, 5, 30, 10**6])
def test_chunks_cover_every_tile_once(per_chunk):
    s, tiles = 2, (3, 5, 4)
    seen = np.zeros((s, *tiles[:2]), np.int32)
    for si, z0, z1, y0, y1 in chunks(s, tiles, per_chunk, 2):
        seen[si, z0:z1, y0:y1] += 1
    assert (seen == 1).all()


@pytest.mark.parametrize(("tiles", "per_chunk", "runs"), [
    ((1, 17, 17), 8 * 17, [6, 5, 6]),  # not 8, 8 and a last chunk of one row
    ((5, 16, 16), 9 * 16, [8, 8]),  # not 9, 7
    ((7, 2, 4), 3 * 2 * 4, [2, 3, 2]),  # whole planes per chunk: z runs, not 3, 3, 1
])
def test_chunk_rows_split_into_near_equal_runs(tiles, per_chunk, runs):
    got = chunks(1, tiles, per_chunk, 1)
    planes = tiles[1] * tiles[2] <= per_chunk
    lengths = sorted({(z0, z1 - z0) if planes else (y0, y1 - y0)
                      for _, z0, z1, y0, y1 in got})
    assert [n for _, n in lengths] == runs


def test_small_layers_are_not_split_below_min_chunk_tiles():
    """Halving for the workers stops where a half would hold fewer than MIN_CHUNK_TILES
    tiles; large layers still get two chunks per worker."""
    from znni.primitives.cpu.winograd import MIN_CHUNK_TILES

    assert len(chunks(1, (2, 2, 2), 10**6, 2)) == 1  # 8 tiles
    small = chunks(1, (4, 4, 4), 10**6, 2)  # 64 tiles: two halves of 32
    assert len(small) == 64 // MIN_CHUNK_TILES
    assert len(chunks(1, (8, 8, 8), 10**6, 2)) == 4


def test_kernel_transform_cache_sees_in_place_changes(pool):
    rng = np.random.default_rng(3)
    x, w, b = _layer(rng, 1, 3, 2, (8, 8, 8))
    first = winograd_conv3d(x, w, b, pool=pool)
    assert np.array_equal(first, winograd_conv3d(x, w, b, pool=pool))
    w *= 2.0  # same array object, new values: the cached transform must not be reused
    assert _rel_err(winograd_conv3d(x, w, b, pool=pool), naive_conv_batch(x, w, b)) <= 1e-5


def test_transforms_reproduce_1d_correlation():
    rng = np.random.default_rng(0)
    for m in (2, 4):
        at, g, bt = transforms(m)
        d, k = rng.standard_normal(m + 2), rng.standard_normal(3)
        assert np.allclose(at @ ((g @ k) * (bt @ d)), np.correlate(d, k, "valid"), atol=1e-12)


@pytest.mark.parametrize("kernel", [(1, 1, 1), (5, 5, 5), (3, 3, 1)])
def test_other_kernels_are_refused(kernel):
    x = np.zeros((1, 2, 8, 8, 8), np.float32)
    w = np.zeros((2, 2, *kernel), np.float32)
    with pytest.raises(ValueError, match="3x3x3"):
        winograd_conv3d(x, w, np.zeros(2, np.float32))


def test_bad_tile_size_and_shapes_are_refused():
    x, w, b = np.zeros((1, 2, 8, 8, 8), np.float32), np.zeros((2, 2, 3, 3, 3)), np.zeros(2)
    with pytest.raises(ValueError, match="tile size"):
        winograd_conv3d(x, w, b, m=3)
    with pytest.raises(ValueError, match="does not fit"):
        winograd_conv3d(x[:, :1], w, b)


@pytest.mark.parametrize(
    ("channels", "pads", "size"),
    [
        ((16, 16), (1, 1, 1, 1, 1, 1), (13, 9, 11)),  # a U-Net decoder: skip + upsampled
        ((3, 1, 2), (2, 0, 1, 0, 3, 2), (5, 7, 6)),  # uneven pads, three parts
        ((4,), (0, 1, 5, 2, 0, 0), (3, 4, 9)),  # one part, pads wider than a tile
    ],
)
@pytest.mark.parametrize("m", [4, 6])
def test_channel_parts_and_pads_read_as_their_padded_concatenation(pool, channels, pads, size, m):
    rng = np.random.default_rng(sum(channels) + sum(pads))
    parts = [rng.standard_normal((2, c, *size)).astype(np.float32) for c in channels]
    x = np.concatenate(parts, axis=1)
    x = np.pad(x, [(0, 0), (0, 0)] + [(pads[a], pads[a + 3]) for a in range(3)])
    _, w, b = _layer(rng, 1, x.shape[1], 5, (3, 3, 3))
    act = Activation("leaky_relu", 0.01)
    ref = naive_activation(naive_conv_batch(x, w, b), act.kind, act.slope)
    for p in (pool, None):
        out = winograd_conv3d(parts, w, b, act, pool=p, pads=pads, chunk_bytes=2**14, m=m)
        assert out.shape == ref.shape
        assert _rel_err(out, ref) <= (1e-5 if m == 4 else 1e-4)


def test_parts_and_pads_are_checked():
    w, b = np.zeros((2, 5, 3, 3, 3), np.float32), np.zeros(2, np.float32)
    a, c = np.zeros((1, 2, 6, 6, 6), np.float32), np.zeros((1, 3, 6, 6, 5), np.float32)
    with pytest.raises(ValueError, match="agree on every axis"):
        winograd_conv3d([a, c], w, b)
    with pytest.raises(ValueError, match="six pads"):
        winograd_conv3d([a, a[:, :1], a[:, :2]], w, b, pads=(1, 1, 1))
    with pytest.raises(ValueError, match="does not fit"):
        winograd_conv3d([a, a], w, b, pads=(1,) * 6)


def test_kernel_transform_in_channel_blocks_is_the_whole_transform(monkeypatch):
    """U by blocks of output channels (one each here) equals U in one go, bit for bit."""
    from znni.primitives.cpu import winograd

    w = np.random.default_rng(4).standard_normal((5, 3, 3, 3, 3)).astype(np.float32)
    whole = winograd.kernel_transform(w)
    monkeypatch.setattr(winograd, "KERNEL_BLOCK_BYTES", 1)
    assert np.array_equal(winograd.kernel_transform(w), whole)
    _, g, _ = transforms(4)
    ref = np.einsum("zk,yl,xm,oiklm->zyxoi", g, g, g, w.astype(np.float64))  # G w G^T per axis
    assert np.allclose(whole, ref.reshape(216, 5, 3), rtol=1e-6, atol=1e-6)
