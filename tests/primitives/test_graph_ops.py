"""Graph-op kernels against the brute-force references of naive_graph.py and against torch.

Naive checks always run; each test then compares with torch, or is skipped after the
naive check when torch is not installed. Tolerance: max|out - ref| <= 1e-4 * max(1, max|ref|).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from support import naive_graph as ng

from znni.primitives.cpu.graph_ops import (
    avg_pool3d,
    batch_norm,
    clip,
    conv3d,
    conv_transpose3d,
    elu,
    fold_batch_norm_into_conv,
    group_norm,
    instance_norm,
    leaky_relu,
    max_pool3d,
    pad3d,
    prelu,
    resize3d,
    selu,
    softmax_channels,
)


def close(out, ref):
    out, ref = np.asarray(out), np.asarray(ref)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    tol = 1e-4 * max(1.0, float(np.abs(ref).max()))
    err = float(np.abs(out.astype(np.float64) - ref).max())
    assert err <= tol, f"max error {err} > {tol}"


def _torch():
    """torch for the comparisons after the naive ones (skips the rest of the test without it)."""
    t = pytest.importorskip("torch")
    t.set_num_threads(2)
    return t


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _torch_pads(p):
    """ONNX (z_b, y_b, x_b, z_e, y_e, x_e) -> torch F.pad order (x_b, x_e, y_b, y_e, z_b, z_e)."""
    return (p[2], p[5], p[1], p[4], p[0], p[3])


# (size, cin, cout, kernel, strides, pads, dilations, groups)
CONV_CASES = [
    ((5, 7, 9), 3, 4, (3, 3, 3), (1, 1, 1), (1, 1, 1, 1, 1, 1), (1, 1, 1), 1),
    ((5, 7, 9), 2, 3, (1, 3, 3), (1, 2, 2), (0, 1, 1, 0, 1, 1), (1, 1, 1), 1),
    ((3, 6, 5), 4, 6, (2, 3, 2), (2, 1, 2), (1, 0, 2, 0, 1, 1), (1, 2, 1), 2),
    ((5, 7, 9), 4, 4, (3, 3, 3), (1, 1, 1), (1, 1, 1, 1, 1, 1), (1, 1, 1), 4),  # depthwise
    ((5, 7, 9), 3, 6, (3, 2, 3), (2, 2, 1), (2, 0, 1, 0, 1, 2), (2, 1, 2), 3),  # multiplier 2
    ((3, 6, 5), 3, 5, (1, 1, 1), (1, 1, 1), (0, 0, 0, 0, 0, 0), (1, 1, 1), 1),
    ((3, 6, 5), 4, 6, (1, 1, 1), (1, 1, 1), (1, 0, 0, 0, 2, 1), (1, 1, 1), 2),  # pointwise
    ((5, 7, 9), 2, 3, (1, 1, 1), (2, 2, 2), (0, 0, 0, 0, 0, 0), (1, 1, 1), 1),
    ((4, 6, 6), 2, 2, (2, 2, 2), (2, 2, 2), (0, 0, 0, 0, 0, 0), (1, 1, 1), 1),
    ((5, 7, 9), 2, 4, (2, 3, 2), (2, 1, 1), (1, 2, 0, 0, 1, 1), (2, 2, 3), 1),  # flat, dilated
    ((3, 6, 5), 3, 3, (3, 3, 3), (1, 1, 1), (2, 1, 0, 2, 1, 0), (1, 2, 2), 3),  # depthwise dilated
]


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv3d(case):
    size, cin, cout, k, s, p, d, g = case
    rng = np.random.default_rng(hash(case) % 2**32)
    x, w, b = _rand(rng, 2, cin, *size), _rand(rng, cout, cin // g, *k), _rand(rng, cout)
    out = conv3d(x, w, b, strides=s, pads=p, dilations=d, groups=g)
    assert out.dtype == np.float32
    close(out, ng.naive_conv3d(x, w, b, s, p, d, g))
    torch = _torch()
    tx = torch.nn.functional.pad(torch.from_numpy(x), _torch_pads(p))
    ref = torch.nn.functional.conv3d(
        tx, torch.from_numpy(w), torch.from_numpy(b), stride=s, dilation=d, groups=g
    )
    close(out, ref.numpy())


def test_conv3d_no_bias_and_blocked(monkeypatch):
    """Tiny block budgets: GEMM blocks split z, y and x; depthwise blocks split z."""
    from znni.primitives.cpu.graph_ops import conv_general

    monkeypatch.setattr(conv_general, "COLUMN_BYTES", 64)
    monkeypatch.setattr(conv_general, "DEPTHWISE_BYTES", 64)
    rng = np.random.default_rng(3)
    x, p = _rand(rng, 1, 2, 4, 5, 6), (1, 0, 1, 0, 1, 1)
    for w, g in ((_rand(rng, 3, 2, 2, 2, 3), 1), (_rand(rng, 4, 1, 2, 2, 3), 2)):
        for s in ((1, 1, 1), (1, 2, 1)):
            out = conv3d(x, w, None, strides=s, pads=p, groups=g)
            close(out, ng.naive_conv3d(x, w, None, s, p, (1, 1, 1), g))


# (size, cin, cout, kernel, strides, pads, output_padding, dilations, groups)
CONVT_CASES = [
    ((3, 6, 5), 4, 3, (2, 2, 2), (2, 2, 2), (0,) * 6, (0, 0, 0), (1, 1, 1), 1),  # fast path
    ((3, 4, 5), 4, 6, (1, 2, 2), (1, 2, 2), (0,) * 6, (0, 0, 0), (1, 1, 1), 2),  # fast, grouped
    ((3, 6, 5), 3, 2, (3, 3, 3), (2, 2, 2), (1, 1, 1, 1, 1, 1), (1, 1, 1), (1, 1, 1), 1),
    ((3, 6, 5), 4, 6, (3, 2, 3), (1, 2, 2), (1, 0, 1, 1, 0, 1), (0, 1, 1), (1, 2, 1), 2),
    ((2, 3, 4), 4, 4, (2, 3, 2), (2, 1, 3), (0, 1, 0, 1, 0, 0), (1, 0, 2), (1, 1, 2), 4),
    ((3, 6, 5), 2, 3, (2, 2, 2), (2, 2, 2), (0,) * 6, (1, 0, 1), (1, 1, 1), 1),
    ((9, 4, 5), 3, 2, (3, 3, 3), (2, 2, 2), (1, 1, 1, 1, 1, 1), (0, 0, 0), (2, 1, 1), 1),
]


@pytest.mark.parametrize("case", CONVT_CASES[2:5] + CONVT_CASES[6:])
def test_conv_transpose3d_slabs_on_the_pool(monkeypatch, case):
    """The scatter path's z slabs, as small as their overlap allows and forced onto the
    pool (even slabs together, then odd ones), add up exactly."""
    from znni.primitives.cpu.graph_ops import _parallel, conv_transpose

    monkeypatch.setattr(conv_transpose, "SCATTER_SLAB_BYTES", 1)
    monkeypatch.setattr(_parallel, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(_parallel, "PIN_BLAS_BYTES", 0)
    size, cin, cout, k, s, p, op, d, g = case
    rng = np.random.default_rng(sum(size) + cin + cout)
    x, w, b = _rand(rng, 2, cin, *size), _rand(rng, cin, cout // g, *k), _rand(rng, cout)
    out = conv_transpose3d(x, w, b, strides=s, pads=p, output_padding=op, dilations=d, groups=g)
    close(out, ng.naive_conv_transpose3d(x, w, b, s, p, op, d, g))


@pytest.mark.parametrize("case", CONVT_CASES)
def test_conv_transpose3d(case):
    size, cin, cout, k, s, p, op, d, g = case
    rng = np.random.default_rng(hash(case) % 2**32)
    x, w, b = _rand(rng, 2, cin, *size), _rand(rng, cin, cout // g, *k), _rand(rng, cout)
    out = conv_transpose3d(x, w, b, strides=s, pads=p, output_padding=op, dilations=d, groups=g)
    close(out, ng.naive_conv_transpose3d(x, w, b, s, p, op, d, g))
    if p[:3] == p[3:]:  # torch takes symmetric pads only
        torch = _torch()
        t, kw = torch.from_numpy, dict(stride=s, padding=p[:3], output_padding=op, dilation=d)
        ref = torch.nn.functional.conv_transpose3d(t(x), t(w), t(b), groups=g, **kw)
        close(out, ref.numpy())


# (size, kernel, strides, pads, dilations)
POOL_CASES = [
    ((5, 7, 9), (2, 2, 2), (2, 2, 2), (0, 0, 0, 0, 0, 0), (1, 1, 1)),
    ((5, 7, 9), (1, 3, 3), (1, 2, 2), (0, 1, 1, 0, 1, 1), (1, 1, 1)),
    ((3, 6, 5), (3, 2, 3), (2, 2, 2), (1, 1, 1, 1, 1, 1), (1, 1, 1)),
    ((5, 7, 9), (3, 3, 2), (2, 3, 2), (1, 0, 1, 1, 0, 1), (1, 1, 1)),
    ((5, 7, 9), (2, 2, 3), (3, 2, 2), (1, 0, 1, 0, 1, 0), (1, 1, 1)),  # asymmetric
    ((5, 7, 9), (2, 3, 2), (2, 2, 3), (1, 1, 0, 1, 1, 0), (2, 1, 2)),  # dilated (max only)
]


@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("case", POOL_CASES)
def test_max_pool3d(case, ceil_mode):
    size, k, s, p, d = case
    x = _rand(np.random.default_rng(1), 2, 3, *size)
    out = max_pool3d(x, k, s, p, d, ceil_mode)
    close(out, ng.naive_max_pool3d(x, k, s, p, d, ceil_mode))
    if p[:3] == p[3:]:
        torch = _torch()
        ref = torch.nn.functional.max_pool3d(
            torch.from_numpy(x), k, s, p[:3], d, ceil_mode=ceil_mode
        )
        close(out, ref.numpy())


@pytest.mark.parametrize("case", POOL_CASES[:5:2])
def test_pools_split_into_channel_ranges_on_the_pool(monkeypatch, case):
    """Channel ranges on every core (one channel each here) give the serial result."""
    from znni.primitives.cpu.graph_ops import _parallel, pooling_general

    size, k, s, p, d = case
    x = _rand(np.random.default_rng(3), 2, 5, *size)
    monkeypatch.setattr(_parallel, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(_parallel, "PIN_BLAS_BYTES", 0)
    monkeypatch.setattr(pooling_general, "CHANNEL_TILE_BYTES", 1)
    close(max_pool3d(x, k, s, p, d, True), ng.naive_max_pool3d(x, k, s, p, d, True))
    out = avg_pool3d(x, k, s, p, False, True)
    close(out, ng.naive_avg_pool3d(x, k, s, p, False, True))
    assert out.flags.c_contiguous and out.dtype == np.float32


def _channels_last(x: np.ndarray) -> np.ndarray:
    """x's values, lying (N, Z, Y, X, C) in memory (an OpenVINO layer's output)."""
    return np.ascontiguousarray(x.transpose(0, 2, 3, 4, 1)).transpose(0, 4, 1, 2, 3)


def _lies_channels_last(a: np.ndarray) -> bool:
    return a.transpose(0, 2, 3, 4, 1).flags.c_contiguous and not a.flags.c_contiguous


@pytest.mark.parametrize("case", POOL_CASES)
def test_pools_keep_a_channels_last_input_channels_last(monkeypatch, case):
    """A channels-last input (odd sizes, anisotropic, pads, ceil overrun) pools to the
    naive result in a channels-last output, its z slabs split over the pool's workers."""
    from znni.primitives.cpu.graph_ops import _parallel, pooling_general

    monkeypatch.setattr(_parallel, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(_parallel, "PIN_BLAS_BYTES", 0)
    monkeypatch.setattr(pooling_general, "CHANNEL_TILE_BYTES", 1)  # a slab per output plane
    size, k, s, p, d = case
    x = _rand(np.random.default_rng(4), 2, 5, *size)
    out = max_pool3d(_channels_last(x), k, s, p, d, True)
    close(out, ng.naive_max_pool3d(x, k, s, p, d, True))
    assert _lies_channels_last(out)
    if d == (1, 1, 1):
        out = avg_pool3d(_channels_last(x), k, s, p, False, True)
        close(out, ng.naive_avg_pool3d(x, k, s, p, False, True))


@pytest.mark.parametrize("case", CONVT_CASES)
def test_conv_transpose3d_of_a_channels_last_input(monkeypatch, case):
    """Every case on a channels-last input equals the naive result; the one-group k == s
    upsampling keeps the layout (its own GEMM path), on the pool's workers."""
    from znni.primitives.cpu.graph_ops import _parallel, conv_transpose

    monkeypatch.setattr(_parallel, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(_parallel, "PIN_BLAS_BYTES", 0)
    monkeypatch.setattr(conv_transpose, "SLAB_BYTES", 1)  # a slab per input plane
    size, cin, cout, k, s, p, op, d, g = case
    rng = np.random.default_rng(sum(size) + 7 * cin)
    x, w, b = _rand(rng, 2, cin, *size), _rand(rng, cin, cout // g, *k), _rand(rng, cout)
    for bias in (b, None):
        out = conv_transpose3d(_channels_last(x), w, bias, strides=s, pads=p,
                               output_padding=op, dilations=d, groups=g)
        close(out, ng.naive_conv_transpose3d(x, w, bias, s, p, op, d, g))
    upsampling = k == s and not any(p) and not any(op) and d == (1, 1, 1) and g == 1
    assert _lies_channels_last(out) == upsampling


@pytest.mark.parametrize("count_include_pad", [False, True])
@pytest.mark.parametrize("ceil_mode", [False, True])
@pytest.mark.parametrize("case", [c for c in POOL_CASES if c[4] == (1, 1, 1)])
def test_avg_pool3d(case, ceil_mode, count_include_pad):
    size, k, s, p, _ = case
    x = _rand(np.random.default_rng(2), 2, 3, *size)
    out = avg_pool3d(x, k, s, p, ceil_mode, count_include_pad)
    close(out, ng.naive_avg_pool3d(x, k, s, p, ceil_mode, count_include_pad))
    if p[:3] == p[3:]:
        torch = _torch()
        kw = dict(ceil_mode=ceil_mode, count_include_pad=count_include_pad)
        ref = torch.nn.functional.avg_pool3d(torch.from_numpy(x), k, s, p[:3], **kw)
        close(out, ref.numpy())


def test_ceil_mode_changes_shapes():
    """The pool cases above exercise both a kept overrun window and a dropped one."""
    x = np.zeros((1, 1, 5, 6, 7), np.float32)
    assert max_pool3d(x, (2, 2, 2), (2, 2, 2), ceil_mode=True).shape[2:] == (3, 3, 4)
    # a window that would start in the end padding is dropped: 5 + 1 + 1, k 2, s 2 -> 3 not 4
    assert max_pool3d(x, (2, 2, 2), (2, 2, 2), (1,) * 6, ceil_mode=True).shape[2:] == (3, 4, 4)


SCALES = [(2.0, 2.0, 2.0), (1.0, 2.0, 2.0), (1.7, 1.5, 2.3), (0.6, 0.5, 3.0)]


def _size(shape, scales):
    return tuple(int(math.floor(n * s)) for n, s in zip(shape, scales, strict=True))


@pytest.mark.parametrize("scales", SCALES)
def test_resize_nearest_matches_torch(scales):
    """F.interpolate(mode='nearest') exports as nearest + asymmetric + floor."""
    x = _rand(np.random.default_rng(4), 2, 2, 3, 6, 5)
    size = _size(x.shape[2:], scales)
    kw = dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    by_scales, by_size = resize3d(x, size, scales=scales, **kw), resize3d(x, size, **kw)
    close(by_scales, ng.naive_resize3d(x, size, "nearest", "asymmetric", "floor", scales))
    close(by_size, ng.naive_resize3d(x, size, "nearest", "asymmetric", "floor"))  # out / in
    torch = _torch()
    F, tx = torch.nn.functional, torch.from_numpy(x)
    close(by_scales, F.interpolate(tx, scale_factor=scales, mode="nearest").numpy())
    close(by_size, F.interpolate(tx, size=size, mode="nearest").numpy())


@pytest.mark.parametrize("scales", SCALES)
def test_resize_trilinear_matches_torch(scales):
    """align_corners=False: half_pixel with torch's scales, pytorch_half_pixel from sizes.

    torch samples a length-1 output at the input centre (half_pixel), whereas ONNX
    pytorch_half_pixel samples index 0 there: torch is compared where the two agree.
    """
    x = _rand(np.random.default_rng(5), 2, 2, 3, 6, 5)
    size = _size(x.shape[2:], scales)
    hp, php, ac = "half_pixel", "pytorch_half_pixel", "align_corners"
    cases = {"s": (hp, scales), "hp": (hp, None), "php": (php, None), "ac": (ac, None)}
    outs = {}
    for key, (mode, sc) in cases.items():
        outs[key] = resize3d(x, size, mode="linear", coordinate_transformation_mode=mode, scales=sc)
        close(outs[key], ng.naive_resize3d(x, size, "linear", mode, scales=sc))
    torch = _torch()
    F, tx = torch.nn.functional, torch.from_numpy(x)
    close(outs["s"], F.interpolate(tx, scale_factor=scales, mode="trilinear").numpy())
    by_size = F.interpolate(tx, size=size, mode="trilinear", align_corners=False).numpy()
    close(outs["hp"], by_size)
    if min(size) > 1:
        close(outs["php"], by_size)
    close(outs["ac"], F.interpolate(tx, size=size, mode="trilinear", align_corners=True).numpy())


NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]
TRANSFORMS = ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"]


@pytest.mark.parametrize("nearest_mode", NEAREST)
@pytest.mark.parametrize("transform", TRANSFORMS)
def test_resize_nearest_modes_against_naive(transform, nearest_mode):
    """Every transform x rounding; 3 -> 6 and 6 -> 3 make exact .5 ties, 5 -> 1 a single voxel."""
    x = _rand(np.random.default_rng(6), 1, 2, 3, 6, 5)
    for size in ((6, 3, 1), (5, 4, 7)):
        kw = dict(coordinate_transformation_mode=transform, nearest_mode=nearest_mode)
        out = resize3d(x, size, mode="nearest", **kw)
        close(out, ng.naive_resize3d(x, size, "nearest", transform, nearest_mode))
        out = resize3d(x, size, mode="linear", coordinate_transformation_mode=transform)
        close(out, ng.naive_resize3d(x, size, "linear", transform))


def test_instance_and_group_norm():
    rng = np.random.default_rng(7)
    x = _rand(rng, 2, 4, 3, 6, 5) * 3 + 50  # |mean| >> std: one-pass variance would fail
    scale, bias = _rand(rng, 4), _rand(rng, 4)
    inst = instance_norm(x, scale, bias, 1e-5)
    close(inst, ng.naive_instance_norm(x, scale, bias, 1e-5))
    groups = {g: group_norm(x, g, scale, bias, 1e-3) for g in (1, 2, 4)}
    for g, out in groups.items():
        close(out, ng.naive_group_norm(x, g, scale, bias, 1e-3))
    torch = _torch()
    F, t = torch.nn.functional, torch.from_numpy
    close(inst, F.instance_norm(t(x), weight=t(scale), bias=t(bias), eps=1e-5).numpy())
    for g, out in groups.items():
        close(out, F.group_norm(t(x), g, t(scale), t(bias), eps=1e-3).numpy())


def test_batch_norm_and_folding():
    rng = np.random.default_rng(8)
    x = _rand(rng, 2, 3, 3, 6, 5)
    scale, bias, mean = _rand(rng, 3), _rand(rng, 3), _rand(rng, 3)
    var = rng.uniform(0.5, 2.0, 3).astype(np.float32)
    out = batch_norm(x, scale, bias, mean, var, 1e-5)
    close(out, ng.naive_batch_norm(x, scale, bias, mean, var, 1e-5))
    w, cb = _rand(rng, 3, 2, 3, 3, 3), _rand(rng, 3)
    xi = _rand(rng, 1, 2, 4, 5, 6)
    conv = ng.naive_conv3d(xi, w, cb, (1, 1, 1), (1,) * 6, (1, 1, 1), 1)
    for conv_bias in (cb, None):
        wf, bf = fold_batch_norm_into_conv(w, conv_bias, scale, bias, mean, var, 1e-5)
        assert wf.dtype == np.float32 and bf.dtype == np.float32
        base = conv if conv_bias is not None else conv - cb[None, :, None, None, None]
        ref = ng.naive_batch_norm(base, scale, bias, mean, var, 1e-5)
        close(conv3d(xi, wf, bf, pads=(1,) * 6), ref)
    torch = _torch()
    t = torch.from_numpy
    ref = torch.nn.functional.batch_norm(t(x), t(mean), t(var), t(scale), t(bias), eps=1e-5)
    close(out, ref.numpy())


PAD_CASES = [
    (1, 0, 2, 2, 1, 0),
    (0, 0, 0, 0, 0, 0),
    (2, -1, 1, -1, 2, 3),  # reflect wider than the cropped z axis: repeated reflection
    (-1, -2, 0, 1, 0, -2),
    (-2, 0, 0, 2, 3, 0),  # z cropped to one voxel, then padded
]


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
@pytest.mark.parametrize("pads", PAD_CASES)
def test_pad3d(pads, mode):
    x = _rand(np.random.default_rng(9), 2, 2, 3, 6, 5)
    out = pad3d(x, pads, mode, value=1.5)
    close(out, ng.naive_pad3d(x, pads, mode, 1.5))
    if min(pads) >= 0:
        torch = _torch()
        tmode = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}[mode]
        kw = {"value": 1.5} if mode == "constant" else {}
        ref = torch.nn.functional.pad(torch.from_numpy(x), _torch_pads(pads), mode=tmode, **kw)
        close(out, ref.numpy())


def test_elementwise():
    rng = np.random.default_rng(10)
    x = _rand(rng, 2, 3, 3, 4, 5) * 3
    slope = _rand(rng, 3)
    ref = ng.naive_elementwise(x[:, 1], lambda v: v if v >= 0 else slope[1] * v)
    for s in (slope, slope.reshape(3, 1, 1, 1)):
        close(prelu(x, s)[:, 1], ref)
    close(prelu(x, 0.2), ng.naive_elementwise(x, lambda v: v if v >= 0 else 0.2 * v))
    selu_ref = ng.naive_elementwise(
        x, lambda v: 1.0507009873554805 * (v if v > 0 else 1.6732632423543772 * math.expm1(v))
    )
    close(selu(x), selu_ref)
    close(elu(x, 0.7), ng.naive_elementwise(x, lambda v: v if v > 0 else 0.7 * math.expm1(v)))
    close(leaky_relu(x, 0.1), ng.naive_elementwise(x, lambda v: v if v >= 0 else 0.1 * v))
    big = x * 100  # exp would overflow without the max shift
    close(softmax_channels(big), ng.naive_softmax_channels(big))
    close(clip(x, -1.0, 2.0), ng.naive_elementwise(x, lambda v: min(max(v, -1.0), 2.0)))
    close(clip(x, None, 0.5), ng.naive_elementwise(x, lambda v: min(v, 0.5)))
    close(clip(x, -0.5, None), ng.naive_elementwise(x, lambda v: max(v, -0.5)))
    close(clip(x, 2.0, 1.0), np.full_like(x, 1.0))  # lo > hi: everything is hi
    for fn in (selu, softmax_channels, lambda v: elu(v, 1.0), lambda v: clip(v, 0, 1)):
        assert fn(x).dtype == np.float32
    torch = _torch()
    F, tx = torch.nn.functional, torch.from_numpy(x)
    for s in (slope, slope.reshape(3, 1, 1, 1), np.float32(0.2)):
        ts = torch.from_numpy(np.asarray(s, np.float32).reshape(-1))
        close(prelu(x, s), F.prelu(tx, ts).numpy())
    close(selu(x), F.selu(tx).numpy())
    close(elu(x, 0.7), F.elu(tx, 0.7).numpy())
    close(leaky_relu(x, 0.1), F.leaky_relu(tx, 0.1).numpy())
    close(softmax_channels(x), F.softmax(tx, dim=1).numpy())
    close(clip(x, 2.0, 1.0), torch.clamp(tx, 2.0, 1.0).numpy())


X = np.zeros((1, 4, 5, 6, 7), np.float32)
W = np.zeros((4, 2, 3, 3, 3), np.float32)


def _ct(w=W, **kw):
    kw = {"strides": (2, 2, 2), "pads": (0,) * 6} | kw
    return lambda: conv_transpose3d(X, w, None, **kw)


def _rs(size=(2, 2, 2), **kw):
    kw = {"mode": "linear", "coordinate_transformation_mode": "half_pixel"} | kw
    return lambda: resize3d(X, size, **kw)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: conv3d(X[0], W, None), "5-D"),
        (lambda: conv3d(X, W, None), "input channels per group"),
        (lambda: conv3d(X, W, None, groups=3), "groups=3"),
        (lambda: conv3d(X, W, None, groups=2, strides=(1, 0, 1)), "strides"),
        (lambda: conv3d(X, W, None, groups=2, dilations=(1, 1)), "dilations"),
        (lambda: conv3d(X, W, None, groups=2, pads=(1, 1, -1, 0, 0, 0)), "pads"),
        (lambda: conv3d(X, W, np.zeros(3), groups=2), "bias"),
        (lambda: conv3d(X[:, :, :2], W, None, groups=2), "empty output"),
        (_ct(groups=3), "groups=3"),
        (_ct(w=W[:3]), "Cin=4"),
        (_ct(strides=(2, -1, 2)), "strides"),
        (_ct(output_padding=(-1, 0, 0)), "output_padding"),
        (lambda: max_pool3d(X, (2, 2, 2), (0, 2, 2)), "strides"),
        (lambda: max_pool3d(X, (2, 2), (2, 2, 2)), "kernel"),
        (lambda: max_pool3d(X, (2, 2, 2), (2, 2, 2), (2, 0, 0, 0, 0, 0)), "pads"),
        (lambda: avg_pool3d(X, (9, 2, 2), (1, 1, 1)), "empty output"),
        (_rs(mode="cubic"), "cubic"),
        (_rs(coordinate_transformation_mode="tf"), "'tf'"),
        (_rs(mode="nearest", nearest_mode="round"), "'round'"),
        (_rs(size=(2, 0, 2)), "out_size"),
        (_rs(scales=(1.0, -2.0, 1.0)), "scales"),
        (lambda: instance_norm(X, np.ones(3), np.zeros(4), 1e-5), "scale"),
        (lambda: instance_norm(X, None, None, -1.0), "epsilon"),
        (lambda: group_norm(X, 3, None, None), "num_groups=3"),
        (lambda: batch_norm(X, np.ones(4), np.zeros(4), np.zeros(4), np.ones(5)), "var"),
        (lambda: fold_batch_norm_into_conv(W, np.zeros(3), *[np.ones(4)] * 4), "bias"),
        (lambda: pad3d(X, (1, 1, 1), "constant"), "6 entries"),
        (lambda: pad3d(X, (1,) * 6, "wrap"), "'wrap'"),
        (lambda: pad3d(X, (-3, 0, 0, -2, 0, 0), "constant"), "to nothing"),
        (lambda: prelu(X, np.ones(3)), "slope"),
        (lambda: softmax_channels(np.zeros(3, np.float32)), "channel"),
    ],
)
def test_bad_arguments_raise_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()
