"""Vectorised MPF and max-pool against fragments_reference, scipy and tests/support/naive.py."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage
from support.naive import naive_pool

from znni.primitives.cpu import CpuBackend
from znni.primitives.cpu.pooling import mpf, mpf_blocks
from znni.primitives.fragments import fragments_reference


@pytest.fixture(scope="module")
def backend():
    b = CpuBackend(threads=2, fft_effort="FFTW_ESTIMATE", persist_choices=False)
    yield b
    b.close()


def _valid_size(rng, p):
    return int(p * rng.integers(2, 6) - 1)  # (n + 1) divisible by p


@pytest.mark.parametrize("seed", range(10))
def test_mpf_matches_fragments_reference_and_scipy(backend, seed):
    rng = np.random.default_rng(seed)
    window = tuple(int(v) for v in rng.integers(1, 4, size=3))
    size = tuple(_valid_size(rng, p) for p in window)
    s, c = int(rng.integers(1, 3)), int(rng.integers(1, 4))
    x = rng.standard_normal((s, c, *size)).astype(np.float32)
    out = backend.mpf(x, window)
    np.testing.assert_array_equal(out, fragments_reference(x, window))
    # Independent check: fragment (oz, oy, ox) of sample si is the scipy max filter,
    # anchored at the window's first voxel, sampled at o + p*i.
    frag = out.reshape(s, *window, c, *out.shape[2:])  # (S, pz, py, px, C, mz, my, mx)
    for si in range(s):
        for ci in range(c):
            dense = ndimage.maximum_filter(
                x[si, ci], size=window, origin=[-(p // 2) for p in window]
            )
            dense = dense[
                : size[0] - window[0] + 1, : size[1] - window[1] + 1, : size[2] - window[2] + 1
            ]
            for o in np.ndindex(*window):
                m = frag.shape[5:]
                exp = dense[
                    o[0] : o[0] + window[0] * m[0] : window[0],
                    o[1] : o[1] + window[1] * m[1] : window[1],
                    o[2] : o[2] + window[2] * m[2] : window[2],
                ]
                np.testing.assert_array_equal(frag[si, o[0], o[1], o[2], ci], exp)


def test_mpf_rejects_sizes_that_do_not_fragment_evenly(backend):
    with pytest.raises(ValueError):
        backend.mpf(np.zeros((1, 1, 6, 5, 5), np.float32), (2, 2, 2))
    with pytest.raises(ValueError):
        backend.mpf(np.zeros((1, 1, 5, 5, 5), np.float32), (0, 2, 2))


@pytest.mark.parametrize("seed", range(6))
def test_maxpool_matches_naive(backend, seed):
    rng = np.random.default_rng(50 + seed)
    window = tuple(int(v) for v in rng.integers(1, 4, size=3))
    size = tuple(int(v) for v in rng.integers(3, 12, size=3))  # remainders dropped
    x = rng.standard_normal((2, 3, *size)).astype(np.float32)
    out = backend.maxpool(x, window)
    for si in range(2):
        np.testing.assert_array_equal(out[si], naive_pool(x[si], window).astype(np.float32))


@pytest.mark.parametrize(("s", "c"), [(1, 80), (3, 7), (5, 1)])
def test_threaded_mpf_slices_match_fragments_reference(backend, s, c):
    # The pool splits (sample, channel-range) slices; every split must recombine exactly.
    rng = np.random.default_rng(s * 100 + c)
    window = (2, 3, 1)
    x = rng.standard_normal((s, c, 7, 8, 4)).astype(np.float32)
    out = backend.mpf(x, window)
    np.testing.assert_array_equal(out, fragments_reference(x, window))


@pytest.mark.parametrize("block_bytes", [1, 200, 900, 5000])
@pytest.mark.parametrize("window", [(2, 2, 2), (3, 1, 2), (1, 3, 3)])
def test_blocked_mpf_matches_fragments_reference(backend, block_bytes, window):
    # Small blocks force every split: a few z-planes of one channel, channel groups, and
    # whole images; odd sizes so the last block of fragment rows is partial.
    rng = np.random.default_rng(sum(window) * 31 + block_bytes)
    size = tuple(p * m + p - 1 for p, m in zip(window, (5, 3, 4), strict=True))
    x = rng.standard_normal((2, 5, *size)).astype(np.float32)
    cc, rows = mpf_blocks(5, size[0], size[1], size[2], window[0], 4, block_bytes)
    assert 1 <= cc <= 5 and 1 <= rows <= 5
    expected = fragments_reference(x, window)
    np.testing.assert_array_equal(mpf(x, window, None, block_bytes), expected)
    np.testing.assert_array_equal(mpf(x, window, backend._pool, block_bytes), expected)


def test_mpf_blocks_split_big_images_by_rows_and_group_small_ones():
    assert mpf_blocks(80, 175, 175, 175, 2, 4) == (1, 4)  # 2*4 planes of 175^2 floats ~ 1 MB
    assert mpf_blocks(80, 15, 15, 15, 2, 4) == (77, 7)  # 13.5 kB images: 77 per MiB
