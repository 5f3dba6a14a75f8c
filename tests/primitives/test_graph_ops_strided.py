"""The phase-split strided conv (graph_ops.conv_strided) and the dense one-input-channel
conv against naive_graph.py: odd sizes, anisotropic strides, strides above the kernel,
asymmetric pads, several channels and groups, blocks shrunk to a few voxels. No timings."""

from __future__ import annotations

import numpy as np
import pytest
from support import naive_graph as ng

from znni.primitives.cpu.graph_ops import conv3d, conv_strided, prelu


def close(out, ref):
    out, ref = np.asarray(out), np.asarray(ref, np.float64)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert out.dtype == np.float32
    err = float(np.abs(out.astype(np.float64) - ref).max())
    assert err <= 1e-4 * max(1.0, float(np.abs(ref).max())), err


# (size, cin, cout, kernel, strides, pads, groups)
STRIDED_CASES = [
    ((9, 7, 11), 1, 4, (3, 3, 3), (2, 2, 2), (1, 1, 1, 1, 1, 1), 1),  # MONAI's first conv
    ((8, 8, 8), 3, 5, (3, 3, 3), (2, 2, 2), (1, 1, 1, 1, 1, 1), 1),
    ((7, 9, 10), 4, 6, (3, 3, 3), (2, 1, 3), (1, 0, 2, 0, 1, 1), 2),  # anisotropic, grouped
    ((11, 6, 7), 2, 3, (2, 3, 1), (3, 2, 2), (0, 1, 0, 2, 0, 1), 1),  # stride above kernel
    ((6, 9, 5), 5, 2, (1, 1, 1), (2, 2, 2), (0,) * 6, 1),  # 1x1 stride-2 residual
    ((5, 6, 7), 2, 4, (3, 1, 3), (1, 1, 2), (2, 0, 1, 0, 0, 2), 1),  # strided on x only
    ((13, 5, 6), 6, 6, (5, 3, 3), (4, 2, 2), (2, 1, 1, 2, 1, 1), 3),
]


@pytest.mark.parametrize("case", STRIDED_CASES)
def test_strided_conv_matches_naive(case):
    size, cin, cout, k, s, p, g = case
    rng = np.random.default_rng(sum(size) + cin * 7 + cout)
    x = rng.standard_normal((2, cin, *size)).astype(np.float32)
    w = rng.standard_normal((cout, cin // g, *k)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    close(conv3d(x, w, b, strides=s, pads=p, groups=g), ng.naive_conv3d(x, w, b, s, p, (1, 1, 1), g))


@pytest.mark.parametrize("column_bytes", [4, 100, 4096])
def test_strided_conv_in_small_blocks(monkeypatch, column_bytes):
    """Blocks of one, a few and many flat voxels, on the shared pool (forced on)."""
    from znni.primitives.cpu.graph_ops import _parallel

    monkeypatch.setattr(conv_strided, "COLUMN_BYTES", column_bytes)
    monkeypatch.setattr(_parallel, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(_parallel, "PIN_BLAS_BYTES", 0)
    rng = np.random.default_rng(column_bytes)
    x = rng.standard_normal((1, 3, 7, 8, 9)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3, 3)).astype(np.float32)
    p = (1, 1, 1, 1, 0, 1)
    close(conv3d(x, w, None, strides=(2, 2, 2), pads=p),
          ng.naive_conv3d(x, w, None, (2, 2, 2), p, (1, 1, 1), 1))


def test_split_phases_places_every_voxel():
    """Phase r, position j holds padded voxel s*j + r (zeros in the pads and past the end)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 2, 7, 6, 5)).astype(np.float32)
    s, p, k, out = (2, 3, 2), (1, 2, 0, 1, 0, 1), (3, 3, 2), (4, 2, 3)
    ph = conv_strided.split_phases(x, k, s, p, out)
    padded = np.pad(x, [(0, 0), (0, 0)] + [(p[a], p[a + 3] + 8) for a in range(3)])
    assert ph.shape == (1, 2, 2, 3, 2, 5 + 1, 2, 3)
    for r in np.ndindex(2, 3, 2):
        for j in np.ndindex(*ph.shape[5:]):
            src = tuple(s[a] * j[a] + r[a] for a in range(3))
            assert np.array_equal(ph[(0, slice(None), *r, *j)], padded[(0, slice(None), *src)])


def test_one_input_channel_dense_conv_is_not_depthwise():
    """groups=1 with Cin=1 (a U-Net's first conv) runs as a dense GEMM, also at stride 1."""
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 1, 6, 7, 5)).astype(np.float32)
    w = rng.standard_normal((3, 1, 3, 2, 3)).astype(np.float32)
    for s, d in (((1, 1, 1), (1, 2, 1)), ((2, 1, 2), (1, 1, 1)), ((1, 2, 1), (2, 1, 1))):
        close(conv3d(x, w, None, strides=s, pads=(1,) * 6, dilations=d),
              ng.naive_conv3d(x, w, None, s, (1,) * 6, d, 1))


def test_prelu_with_slopes_above_and_below_one():
    """The max(x, slope x) form for slopes <= 1 and the select for larger ones agree."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, 4, 3, 4, 5)).astype(np.float32)
    for slope in (np.array([0.25, -0.5, 1.0, 0.0], np.float32),
                  np.array([0.25, 2.0, -3.0, 1.5], np.float32)):
        ref = np.where(x >= 0, x, slope[None, :, None, None, None] * x)
        assert np.array_equal(prelu(x, slope), ref)

