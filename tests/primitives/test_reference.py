"""The reference primitives against scipy and brute force."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage
from support.naive import naive_activation, naive_conv, naive_pool

from znni.primitives import Activation, ReferenceBackend
from znni.primitives.base import ACTIVATION_KINDS
from znni.primitives.fragments import fragment_size, fragments_reference, recombine

RNG = np.random.default_rng(1234)


@pytest.mark.parametrize(
    ("cin", "cout", "size", "kernel", "batch"),
    [
        ((1), 3, (9, 7, 11), (3, 3, 3), 1),
        ((2), 4, (7, 8, 5), (1, 3, 5), 2),
        ((5), 2, (6, 9, 4), (4, 2, 1), 3),
        ((3), 6, (5, 5, 5), (5, 5, 5), 1),
        ((4), 1, (13, 3, 7), (2, 1, 4), 2),
    ],
)
def test_conv3d_matches_scipy_correlate(cin, cout, size, kernel, batch):
    x = RNG.standard_normal((batch, cin, *size)).astype(np.float32)
    w = RNG.standard_normal((cout, cin, *kernel)).astype(np.float32)
    b = RNG.standard_normal(cout).astype(np.float32)
    out = ReferenceBackend().conv3d(x, w, b)
    for s in range(batch):
        ref = naive_conv(x[s], w, b)
        np.testing.assert_allclose(out[s], ref, rtol=1e-4, atol=1e-4)


def test_conv3d_refuses_channel_mismatch():
    x = np.zeros((1, 2, 5, 5, 5), np.float32)
    w = np.zeros((1, 3, 2, 2, 2), np.float32)
    with pytest.raises(ValueError, match="2 channels but the kernel expects 3"):
        ReferenceBackend().conv3d(x, w, np.zeros(1, np.float32))


@pytest.mark.parametrize("kind", ACTIVATION_KINDS)
def test_activations_match_naive(kind):
    x = (RNG.standard_normal((2, 3, 4, 5, 6)) * 5).astype(np.float32)
    act = Activation(kind, slope=0.2)
    out = ReferenceBackend().activation(x.copy(), act)
    np.testing.assert_allclose(out, naive_activation(x, kind, 0.2), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ACTIVATION_KINDS)
def test_activations_on_strided_views(kind):
    """numpy 2.4 float32 in-place unary ufuncs are wrong on some strided views."""
    base = (RNG.standard_normal((2, 3, 4, 5, 16)) * 3).astype(np.float32)
    view = base[:, :, :, :, 1::4]  # a 16-byte stride triggers it
    expected = naive_activation(view.copy(), kind, 0.2)
    out = ReferenceBackend().activation(view, Activation(kind, slope=0.2))
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-6)


def test_fused_activation_equals_separate():
    x = RNG.standard_normal((2, 3, 6, 7, 8)).astype(np.float32)
    w = RNG.standard_normal((4, 3, 2, 3, 1)).astype(np.float32)
    b = RNG.standard_normal(4).astype(np.float32)
    be = ReferenceBackend()
    fused = be.conv3d(x, w, b, Activation("elu"))
    ref = naive_activation(be.conv3d(x, w, b), "elu")
    np.testing.assert_allclose(fused, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("window", [(2, 2, 2), (1, 3, 2), (3, 1, 1), (2, 3, 3)])
def test_maxpool_matches_naive(window):
    x = RNG.standard_normal((2, 3, 9, 10, 7)).astype(np.float32)
    out = ReferenceBackend().maxpool(x, window)
    for s in range(2):
        np.testing.assert_array_equal(out[s], naive_pool(x[s], window))


@pytest.mark.parametrize("window", [(2, 2, 2), (1, 3, 2), (3, 2, 1)])
def test_fragments_are_subsampled_maximum_filter(window):
    """Fragment at offset o = the stride-1 max filter sampled at o + p*i (scipy)."""
    size = tuple(p * 3 + p - 1 for p in window)  # (n + 1) divisible by p
    x = RNG.standard_normal((2, 2, *size)).astype(np.float32)
    frags = fragments_reference(x, window)
    pz, py, px = window
    m = tuple(fragment_size(n, p) for n, p in zip(size, window))
    frags = frags.reshape(2, pz, py, px, 2, *m)
    for s in range(2):
        for c in range(2):
            filt = ndimage.maximum_filter(x[s, c], size=window, origin=[-(p // 2) for p in window])
            for oz in range(pz):
                for oy in range(py):
                    for ox in range(px):
                        ref = filt[oz::pz, oy::py, ox::px][: m[0], : m[1], : m[2]]
                        np.testing.assert_array_equal(frags[s, oz, oy, ox, c], ref)


def test_fragment_size_refuses_unequal_fragments():
    assert fragment_size(9, 2) == 4
    with pytest.raises(ValueError, match="divisible by 2"):
        fragment_size(8, 2)


def test_recombine_interleaves_nested_offsets():
    """Dense position = o1 + p1*(o2 + p2*j) per axis, for two nested pools."""
    w1, w2 = (2, 1, 3), (3, 2, 1)
    j = (2, 3, 2)
    frags = np.zeros((1, *w1, *w2, 1, *j), np.float32)  # (B, p1..., p2..., C, j...)
    for idx in np.ndindex(*w1, *w2, *j):
        o1, o2, jj = idx[:3], idx[3:6], idx[6:]
        pos = [o1[d] + w1[d] * (o2[d] + w2[d] * jj[d]) for d in range(3)]
        frags[(0, *o1, *o2, 0, *jj)] = pos[0] * 10000 + pos[1] * 100 + pos[2]
    y = frags.reshape(int(np.prod(w1) * np.prod(w2)), 1, *j)
    dense = recombine(y, 1, [w1, w2])
    shape = dense.shape[2:]
    assert shape == tuple(j[d] * w1[d] * w2[d] for d in range(3))
    zz, yy, xx = np.meshgrid(*[np.arange(n) for n in shape], indexing="ij")
    np.testing.assert_array_equal(dense[0, 0], zz * 10000 + yy * 100 + xx)
