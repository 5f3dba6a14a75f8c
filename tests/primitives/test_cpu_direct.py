"""Direct conv over shifted flat views: every block layout against scipy (tests/support/naive.py)."""

from __future__ import annotations

import numpy as np
import pytest
from support.naive import close, naive_activation, naive_conv_batch

from znni.primitives.base import Activation
from znni.primitives.cpu.direct_conv import _blocks, direct_bytes, direct_conv3d


@pytest.mark.parametrize("slab_bytes", [1, 2**10, 2**14, 2**23])  # rows, planes, whole patch
@pytest.mark.parametrize(
    ("s", "cin", "cout", "size", "kernel"),
    [
        (1, 40, 40, (9, 10, 11), (3, 3, 3)),
        (3, 5, 7, (7, 6, 9), (3, 1, 2)),  # anisotropic, S > 1
        (2, 80, 3, (5, 8, 6), (2, 3, 3)),  # many input channels
        (1, 1, 80, (13, 11, 12), (5, 4, 3)),  # single-channel first layer
        (2, 6, 4, (4, 5, 7), (1, 1, 1)),  # 1x1x1: the view is used without a copy
        (1, 3, 2, (3, 4, 5), (3, 4, 5)),  # one output voxel
    ],
)
def test_direct_blocks_match_scipy(pool, slab_bytes, s, cin, cout, size, kernel):
    rng = np.random.default_rng(sum(size) * cin + cout)
    x = rng.standard_normal((s, cin, *size)).astype(np.float32)
    w = rng.standard_normal((cout, cin, *kernel)).astype(np.float32) / np.sqrt(cin * 8)
    b = rng.standard_normal(cout).astype(np.float32)
    act = Activation("leaky_relu", 0.1)
    out = direct_conv3d(pool, x, w, b, act, slab_bytes=slab_bytes)
    assert out.shape == (s, cout, *(n - k + 1 for n, k in zip(size, kernel, strict=True)))
    assert close(out, naive_activation(naive_conv_batch(x, w, b), "leaky_relu", 0.1))


@pytest.mark.parametrize("slab_bytes", [1, 2**12, 2**23])
def test_blocks_cover_the_output_exactly_once(slab_bytes):
    s, out, n = 2, (5, 7, 4), (7, 9, 6)
    seen = np.zeros((s, *out), np.int32)
    for si, z0, z1, y0, y1 in _blocks(s, out, n, 54, slab_bytes, 2):
        assert z1 - z0 == 1 or (y0, y1) == (0, out[1])  # partial rows only within one plane
        seen[si, z0:z1, y0:y1] += 1
    assert (seen == 1).all()


def test_direct_bytes_counts_output_and_worker_buffers():
    # 1x1x1: no column buffer; output 2*4*5^3 floats + 2 workers * Cout * L floats
    got = direct_bytes(2, 3, 4, (5, 5, 5), (1, 1, 1), 2, slab_bytes=2**30)
    blocks = _blocks(2, (5, 5, 5), (5, 5, 5), 3, 2**30, 2)
    zb = blocks[0][2] - blocks[0][1]
    cols = (zb - 1) * 25 + 4 * 5 + 5
    assert got == 4 * (2 * 4 * 125 + 2 * 4 * cols)
