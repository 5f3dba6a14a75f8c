"""The tiled, threaded graph kernels: normalisations with a fused activation (and in
place), the k == s transposed-conv fast path and max pooling, against naive_graph.py,
float64 numpy, torch, and the engine's fusion of InstanceNorm -> LeakyReLU.

Tiles and slabs are shrunk (and the pool forced on) where a test means to cover the
multi-tile paths on small arrays. No timings are asserted.
"""

from __future__ import annotations

import numpy as np
import pytest
from support import naive_graph as ng

from znni.primitives.base import Activation
from znni.primitives.cpu.graph_ops import (
    _parallel,
    _rowwise,
    concat_channels,
    conv_transpose,
    conv_transpose3d,
    group_norm,
    instance_norm,
    max_pool3d,
)


def rel_close(out, ref, rtol):
    """max|out - ref| <= rtol * max(1, max|ref|), ref in float64."""
    out, ref = np.asarray(out), np.asarray(ref, np.float64)
    assert out.shape == ref.shape and out.dtype == np.float32, (out.shape, ref.shape, out.dtype)
    err = float(np.abs(out - ref).max())
    assert err <= rtol * max(1.0, float(np.abs(ref).max())), f"max error {err}"


def _norm64(x, groups, scale, bias, eps):
    """Group norm in float64 numpy (instance norm: groups == C)."""
    n, c = x.shape[:2]
    g = np.asarray(x, np.float64).reshape(n, groups, -1)  # (N, G, C/G*Z*Y*X)
    y = (g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + eps)
    return y.reshape(x.shape) * scale[None, :, None, None, None] + bias[None, :, None, None, None]


ACTS = {
    "relu": lambda v: np.maximum(v, 0),
    "leaky_relu": lambda v: np.where(v >= 0, v, 0.1 * v),
    "sigmoid": lambda v: 1 / (1 + np.exp(-v)),
}


@pytest.fixture(params=["default", "small_tiles"])
def tiling(request, monkeypatch):
    """As shipped, or tiny tiles (parts of rows, several rows) on the pool."""
    if request.param == "small_tiles":
        monkeypatch.setattr(_rowwise, "MOMENTS_TILE", 50)
        monkeypatch.setattr(_rowwise, "AFFINE_TILE", 64)
        monkeypatch.setattr(_parallel, "PARALLEL_BYTES", 0)
        monkeypatch.setattr(_parallel, "PIN_BLAS_BYTES", 0)
    return request.param


@pytest.mark.parametrize("offset", [0.0, 1e3, -5e4])
@pytest.mark.parametrize("shape", [(2, 3, 7, 9, 11), (1, 6, 1, 1, 5), (1, 4, 3, 1, 2)])
def test_norms_on_odd_sizes_and_offsets(tiling, shape, offset):
    rng = np.random.default_rng(abs(hash((shape, offset))) % 2**32)
    c = shape[1]
    x = (rng.standard_normal(shape) * 3 + offset).astype(np.float32)
    scale, bias = (
        rng.standard_normal(c).astype(np.float32),
        rng.standard_normal(c).astype(np.float32),
    )
    rel_close(instance_norm(x, scale, bias, 1e-5), _norm64(x, c, scale, bias, 1e-5), 1e-5)
    for g in (1, 3) if c % 3 == 0 else (1, 2):
        rel_close(group_norm(x, g, scale, bias, 1e-3), _norm64(x, g, scale, bias, 1e-3), 1e-5)
    ref = ng.naive_instance_norm(x[:1], scale, bias, 1e-5)
    rel_close(instance_norm(x[:1], scale, bias, 1e-5), ref, 1e-5)


def test_large_channel_far_from_zero_within_1e_5():
    """One 64^3 channel around 1e3 (and a ramp across it) against float64."""
    rng = np.random.default_rng(3)
    ramp = np.linspace(0, 40, 64**3, dtype=np.float64).reshape(64, 64, 64)
    x = (1e3 + rng.standard_normal((1, 2, 64, 64, 64)) + ramp).astype(np.float32)
    one = np.ones(2, np.float32)
    rel_close(instance_norm(x, one, -one, 1e-5), _norm64(x, 2, one, -one, 1e-5), 1e-5)
    rel_close(group_norm(x, 1, one, one, 1e-5), _norm64(x, 1, one, one, 1e-5), 1e-5)


@pytest.mark.parametrize("kind", sorted(ACTS))
def test_fused_activation_and_in_place(tiling, kind):
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((2, 4, 5, 6, 7)) * 2 + 7).astype(np.float32)
    scale, bias = (
        rng.standard_normal(4).astype(np.float32),
        rng.standard_normal(4).astype(np.float32),
    )
    act = Activation(kind, 0.1)
    ref = ACTS[kind](_norm64(x, 4, scale, bias, 1e-5))
    before = x.copy()
    rel_close(instance_norm(x, scale, bias, 1e-5, activation=act), ref, 1e-5)
    assert np.array_equal(x, before)  # no out: x untouched
    y = instance_norm(x, scale, bias, 1e-5, activation=act, out=x)
    assert y is x
    rel_close(y, ref, 1e-5)
    gref = ACTS[kind](_norm64(before, 2, scale, bias, 1e-5))
    z = before.copy()
    assert group_norm(z, 2, scale, bias, 1e-5, activation=act, out=z) is z
    rel_close(z, gref, 1e-5)


def test_leaky_slope_above_one_and_torch():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 3, 4, 5, 6)).astype(np.float32)
    y = instance_norm(x, None, None, 1e-5, activation=Activation("leaky_relu", 1.5))
    ref = _norm64(x, 3, np.ones(3), np.zeros(3), 1e-5)
    rel_close(y, np.where(ref >= 0, ref, 1.5 * ref), 1e-5)
    torch = pytest.importorskip("torch")
    t = torch.nn.functional.instance_norm(torch.from_numpy(x), eps=1e-5)
    rel_close(y, torch.nn.functional.leaky_relu(t, 1.5).numpy(), 1e-5)


@pytest.mark.parametrize(
    "out, match",
    [
        (np.zeros((1, 2, 3, 4, 4), np.float32), "shape"),
        (np.zeros((1, 2, 3, 4, 5), np.float64), "float32"),
        (np.zeros((1, 2, 3, 4, 10), np.float32)[..., ::2], "C-contiguous"),
    ],
)
def test_bad_out_raises(out, match):
    x = np.zeros((1, 2, 3, 4, 5), np.float32)
    with pytest.raises(ValueError, match=match):
        instance_norm(x, None, None, out=out)


def test_out_overlapping_x_raises():
    buf = np.zeros(2 * 3 * 4 * 5 + 1, np.float32)
    x, out = buf[:-1].reshape(1, 2, 3, 4, 5), buf[1:].reshape(1, 2, 3, 4, 5)
    with pytest.raises(ValueError, match="overlaps"):
        group_norm(x, 1, None, None, out=out)


# (size, cin, cout, kernel == strides, groups)
FAST_CONVT = [
    ((3, 5, 7), 3, 4, (2, 2, 2), 1),
    ((4, 3, 5), 4, 6, (1, 2, 3), 2),
    ((2, 3, 3), 2, 2, (3, 1, 2), 1),
    ((5, 4, 3), 6, 3, (1, 1, 1), 3),
]


@pytest.mark.parametrize("slab_bytes", [1, 1 << 20])
@pytest.mark.parametrize("case", FAST_CONVT)
def test_conv_transpose_fast_path(monkeypatch, case, slab_bytes):
    """k == s, no pads: one z plane per slab on the pool, or whole volumes, with bias."""
    monkeypatch.setattr(conv_transpose, "SLAB_BYTES", slab_bytes)
    monkeypatch.setattr(_parallel, "PARALLEL_BYTES", 0 if slab_bytes == 1 else 1 << 60)
    size, cin, cout, k, g = case
    rng = np.random.default_rng(abs(hash(case)) % 2**32)
    x = rng.standard_normal((2, cin, *size)).astype(np.float32)
    w = rng.standard_normal((cin, cout // g, *k)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    kw = {"strides": k, "pads": (0,) * 6, "groups": g}
    for bias in (b, None):
        out = conv_transpose3d(x, w, bias, **kw)
        ref = ng.naive_conv_transpose3d(x, w, bias, k, (0,) * 6, (0, 0, 0), (1, 1, 1), g)
        rel_close(out, ref, 1e-5)
        assert out.flags.c_contiguous
    torch = pytest.importorskip("torch")
    t = torch.from_numpy
    ref = torch.nn.functional.conv_transpose3d(t(x), t(w), t(b), stride=k, groups=g)
    rel_close(conv_transpose3d(x, w, b, **kw), ref.numpy(), 1e-5)


def test_max_pool_reads_its_input_only():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((1, 3, 6, 5, 7)).astype(np.float32)
    before = x.copy()
    y = max_pool3d(x, (2, 2, 2), (2, 2, 2))
    rel_close(y, ng.naive_max_pool3d(before, (2,) * 3, (2,) * 3, (0,) * 6, (1,) * 3, False), 0)
    same = max_pool3d(x, (1, 1, 1), (1, 1, 1))
    assert not np.shares_memory(same, x) and np.array_equal(same, x)
    same[:] = 0
    assert np.array_equal(x, before)


@pytest.mark.parametrize("pool", [False, True])
def test_concat_channels(monkeypatch, pool):
    monkeypatch.setattr(_parallel, "PARALLEL_BYTES", 0 if pool else 1 << 60)
    rng = np.random.default_rng(11)
    xs = [rng.standard_normal((2, c, 3, 4, 5)).astype(np.float32) for c in (1, 4, 3)]
    assert np.array_equal(concat_channels(xs), np.concatenate(xs, axis=1))
    assert np.array_equal(concat_channels(xs[:1]), xs[0])
    with pytest.raises(ValueError, match=r"\(2, 4, 3, 4, 6\)"):
        concat_channels([xs[0], np.zeros((2, 4, 3, 4, 6), np.float32)])
    with pytest.raises(ValueError, match="at least one"):
        concat_channels([])


def _norm_graph(skip: bool):
    """x -relu-> a -InstanceNorm-> b -LeakyReLU-> c -Pad(0)-> d [-concat(a, d)-> y]."""
    from znni.model.graph import Graph, Node

    rng = np.random.default_rng(9)
    scale, bias = (
        rng.standard_normal(3).astype(np.float32),
        rng.standard_normal(3).astype(np.float32),
    )
    norm = {"scale": scale, "bias": bias, "epsilon": 1e-5}
    pad = {"pads": (0,) * 6, "mode": "edge", "value": 0.0}
    nodes = [
        Node("r", "relu", ("x",), ("a",)),
        Node("n", "instance_norm", ("a",), ("b",), norm),
        Node("l", "leaky_relu", ("b",), ("c",), {"alpha": 0.1}),
        Node("p", "pad", ("c",), ("d",), pad),
    ]
    s = (1, 3, 4, 5, 6)
    shapes = {"x": s, "a": s, "b": s, "c": s, "d": s, "y": (1, 6, 4, 5, 6)}
    if skip:
        nodes.append(Node("cat", "concat", ("a", "d"), ("y",)))
    out, cout = ("y", 6) if skip else ("d", 3)
    graph = Graph("norm", "x", 3, s[2:], tuple(nodes), out, cout, s[2:], "d", shapes)
    return graph, scale, bias


@pytest.mark.parametrize("skip", [False, True])
def test_engine_fuses_norm_and_activation_without_touching_live_arrays(skip):
    """The norm runs in place (with the LeakyReLU) only where its input dies there."""
    from znni.engine.compute.graph_forward import run_graph
    from znni.primitives.backends import make_backend

    graph, scale, bias = _norm_graph(skip)
    x = np.random.default_rng(1).standard_normal((1, 3, 4, 5, 6)).astype(np.float32)
    before = x.copy()
    y = run_graph(graph, x, make_backend("reference"))
    assert np.array_equal(x, before)
    a = np.maximum(before, 0)
    ref = _norm64(a, 3, scale, bias, 1e-5)
    ref = np.where(ref >= 0, ref, 0.1 * ref)
    rel_close(y, np.concatenate([a, ref], axis=1) if skip else ref, 1e-5)


@pytest.mark.parametrize("pads", [(1, 1, 1, 1, 1, 1), (0, 2, 1, 3, 0, 1)])
def test_concat_into_a_zero_border(pads):
    """concat_channels with pads equals padding the concatenation (the conv's input)."""
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((2, c, 5, 6, 7)).astype(np.float32) for c in (3, 4)]
    xs[1] = xs[1][:, :, :, :, :]  # any strides
    want = np.pad(np.concatenate(xs, axis=1), [(0, 0), (0, 0)]
                  + [(pads[a], pads[a + 3]) for a in range(3)])
    assert np.array_equal(concat_channels(xs, pads), want)
    with pytest.raises(ValueError, match="pads"):
        concat_channels(xs, (1, 1, 1, 1, 1))
