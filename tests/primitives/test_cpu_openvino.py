"""The optional OpenVINO conv primitive against the naive reference (skipped without it)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from support.naive import close, naive_activation, naive_conv
from support.naive_graph import naive_instance_norm

from znni.primitives.backends import make_backend
from znni.primitives.base import Activation, InstanceNorm

pytest.importorskip("openvino")


@pytest.mark.parametrize("cin, cout, kernel, size, act", [
    (1, 3, (3, 2, 4), (7, 9, 8), None),
    (4, 5, (3, 3, 3), (9, 6, 11), "relu"),
    (6, 2, (1, 3, 3), (5, 8, 7), "leaky_relu"),
    (3, 4, (2, 2, 2), (6, 5, 9), "sigmoid"),
    (2, 2, (1, 1, 1), (4, 3, 5), "elu"),
])
def test_openvino_conv_equals_naive(cin, cout, kernel, size, act) -> None:
    rng = np.random.default_rng(cin * 10 + cout)
    x = rng.standard_normal((2, cin, *size)).astype(np.float32)  # a batch of two
    w = (rng.standard_normal((cout, cin, *kernel)) / np.sqrt(cin * np.prod(kernel))).astype(
        np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    activation = Activation(act, 0.1) if act else None
    got = make_backend("cpu").conv3d(x, w, b, activation, "openvino")
    for s in range(2):
        ref = naive_conv(x[s], w, b)
        if act:
            ref = naive_activation(ref, act, 0.1)
        assert close(got[s], ref)


@pytest.mark.parametrize("sizes, pads, affine, act", [
    ((3,), (1, 1, 1, 1, 1, 1), True, "leaky_relu"),  # a padded U-Net conv
    ((2, 3), (1, 0, 2, 1, 1, 0), False, "relu"),  # a decoder's concat, uneven pads
    ((4, 1, 2), (0,) * 6, True, None),  # three parts, valid
])
def test_a_layer_reads_parts_and_pads_and_applies_the_norm(sizes, pads, affine, act) -> None:
    """conv(concat(parts) zero-padded) -> instance norm -> activation, against the naive
    conv and a float64 norm by explicit sums; odd, anisotropic sizes, a batch of two; the
    norm's statistics are over the whole output (the pads included), as ONNX's."""
    rng = np.random.default_rng(sum(sizes) + sum(pads))
    size, cin, cout = (7, 6, 9), sum(sizes), 4
    parts = [(3 * rng.standard_normal((2, c, *size)) + 2).astype(np.float32) for c in sizes]
    w = (rng.standard_normal((cout, cin, 3, 3, 3)) / np.sqrt(27 * cin)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    scale, shift = (rng.standard_normal(cout).astype(np.float32) if affine else None
                    for _ in range(2))
    activation = Activation(act, 0.1) if act else None
    norm = InstanceNorm(scale, shift, 1e-5)
    got = make_backend("cpu").conv3d_parts(parts, pads, w, b, activation, "openvino", norm)
    x = np.pad(np.concatenate(parts, axis=1),
               [(0, 0), (0, 0)] + [(pads[a], pads[a + 3]) for a in range(3)])
    conv = np.stack([naive_conv(x[s], w, b) for s in range(2)])
    ones, zeros = np.ones(cout), np.zeros(cout)
    ref = naive_instance_norm(conv, ones if scale is None else scale,
                              zeros if shift is None else shift, 1e-5)
    if act:
        ref = naive_activation(ref, act, 0.1)
    assert got.shape == ref.shape and got.dtype == np.float32
    assert np.abs(got - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())
    with pytest.raises(ValueError, match="only the 'openvino' conv primitive applies a norm"):
        make_backend("cpu").conv3d_parts(parts, pads, w, b, activation, "winograd", norm)
    with pytest.raises(ValueError, match="channels but the kernel expects"):
        make_backend("cpu").conv3d_parts(parts, pads, np.concatenate([w, w], axis=1), b,
                                         activation, "openvino", norm)


def test_a_channels_last_output_feeds_the_next_layer_as_it_lies() -> None:
    """With channels_last the output is a (S, C, Z, Y, X) view of channels-last memory,
    equal to the channels-first result; a layer reading it (and a channels-first part
    beside it, with pads and the norm) equals the naive reference on the copies."""
    rng = np.random.default_rng(11)
    backend = make_backend("cpu", threads=2)
    x = rng.standard_normal((2, 3, 7, 6, 9)).astype(np.float32)  # (S, C, Z, Y, X)
    w1 = (rng.standard_normal((5, 3, 3, 3, 3)) / 9).astype(np.float32)
    b1 = rng.standard_normal(5).astype(np.float32)
    first = backend.conv3d_parts([x], (1,) * 6, w1, b1, Activation("relu"), "openvino")
    kept = backend.conv3d_parts([x], (1,) * 6, w1, b1, Activation("relu"), "openvino",
                                channels_last=True)
    assert kept.shape == first.shape == (2, 5, 7, 6, 9) and not kept.flags.c_contiguous
    assert kept.transpose(0, 2, 3, 4, 1).flags.c_contiguous  # (S, Z, Y, X, C) in memory
    np.testing.assert_array_equal(kept, first)
    skip = rng.standard_normal((2, 2, 7, 6, 9)).astype(np.float32)
    w2 = (rng.standard_normal((4, 7, 3, 3, 3)) / 14).astype(np.float32)
    b2 = rng.standard_normal(4).astype(np.float32)
    pads = (1, 0, 1, 1, 2, 0)
    norm = InstanceNorm(None, None, 1e-5)
    got = backend.conv3d_parts([kept, skip], pads, w2, b2, None, "openvino", norm)
    joined = np.pad(np.concatenate([first, skip], axis=1),
                    [(0, 0), (0, 0)] + [(pads[a], pads[a + 3]) for a in range(3)])
    conv = np.stack([naive_conv(joined[s], w2, b2) for s in range(2)])
    ref = naive_instance_norm(conv, np.ones(4), np.zeros(4), 1e-5)
    assert got.shape == ref.shape and got.flags.c_contiguous
    assert np.abs(got - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())


def test_channels_last_parts_and_crops_of_them_are_joined_as_they_lie() -> None:
    """Every part channels-last, one of them a crop (a U-Net's skip: a strided view with
    the channels innermost): the layer joins them channels-last and equals the naive conv
    of the channels-first concat, with uneven pads, an anisotropic kernel, odd sizes."""
    rng = np.random.default_rng(12)
    backend = make_backend("cpu", threads=2)
    big = rng.standard_normal((2, 11, 9, 13, 3)).astype(np.float32)  # (S, Z, Y, X, C)
    crop = big.transpose(0, 4, 1, 2, 3)[:, :, 2:9, 1:7, 2:11]  # (S, 3, 7, 6, 9), a view
    up = rng.standard_normal((2, 7, 6, 9, 4)).astype(np.float32).transpose(0, 4, 1, 2, 3)
    w = (rng.standard_normal((5, 7, 3, 1, 3)) / 8).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    pads = (1, 0, 0, 0, 2, 1)
    got = backend.conv3d_parts([crop, up], pads, w, b, Activation("relu"), "openvino")
    joined = np.pad(np.concatenate([np.array(crop), np.array(up)], axis=1),
                    [(0, 0), (0, 0)] + [(pads[a], pads[a + 3]) for a in range(3)])
    ref = np.maximum(np.stack([naive_conv(joined[s], w, b) for s in range(2)]), 0)
    assert got.shape == ref.shape == (2, 5, 6, 8, 8)
    assert np.abs(got - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())


@pytest.mark.parametrize("threshold", [0, 2**40])  # split over the pool, or one thread
def test_channels_last_output_comes_back_channels_first(monkeypatch, threshold) -> None:
    """The layers write channels-last; the copy back runs plane by plane, over the pool."""
    from concurrent.futures import ThreadPoolExecutor

    from znni.primitives.cpu import openvino_conv

    monkeypatch.setattr(openvino_conv, "PARALLEL_TRANSPOSE_BYTES", threshold)
    last = np.random.default_rng(3).standard_normal((3, 5, 7, 6, 4)).astype(np.float32)
    with ThreadPoolExecutor(2) as pool:
        got = openvino_conv._channels_first(last, pool)  # (S, C, Z, Y, X)
    assert got.flags.c_contiguous
    np.testing.assert_array_equal(got, last.transpose(0, 4, 1, 2, 3))


def test_compiled_layers_are_reused_and_bounded() -> None:
    from znni.primitives.cpu.openvino_conv import MAX_COMPILED, OpenVinoConvs

    convs = OpenVinoConvs(threads=1)
    x = np.ones((1, 1, 4, 4, 4), np.float32)
    b = np.zeros(1, np.float32)
    for i in range(MAX_COMPILED + 3):
        w = np.full((1, 1, 1, 1, 1), float(i), np.float32)
        assert convs.conv3d(x, w, b, None)[0, 0, 0, 0, 0] == i
    assert len(convs._compiled) == MAX_COMPILED


def test_only_a_compiled_layer_imports_openvino() -> None:
    """The planner asks whether OpenVINO is installed without importing it (0.1-0.2 s of
    every run); the first layer compiled with it imports it and runs."""
    code = (
        "import sys\n"
        "import numpy as np\n"
        "from znni.planner.graph.search import openvino_ready\n"
        "from znni.primitives.backends import make_backend\n"
        "assert openvino_ready()\n"
        "assert 'openvino' not in sys.modules, 'imported by the planner'\n"
        "x = np.ones((1, 2, 5, 5, 5), np.float32)\n"
        "w = np.ones((3, 2, 3, 3, 3), np.float32)\n"
        "y = make_backend('cpu').conv3d(x, w, np.zeros(3, np.float32), None, 'openvino')\n"
        "assert 'openvino' in sys.modules\n"
        "print(float(y.min()), float(y.max()), y.shape)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["54.0", "54.0", "(1,", "3,", "3,", "3,", "3)"]


def test_large_weights_are_digested_once_per_array() -> None:
    """The compiled-layer key digests a large weight array once (1.8 ms for 128 -> 128 3^3
    weights, every call before); another array, even of equal shape, gets its own digest."""
    from znni.primitives.cpu import openvino_conv

    w = np.random.default_rng(2).standard_normal((64, 64, 3, 3, 3)).astype(np.float32)
    first = openvino_conv._array_digest(w)
    assert openvino_conv._DIGESTS[id(w)][0]() is w
    assert openvino_conv._array_digest(w) == first
    other = w.copy()
    other[0, 0, 0, 0, 0] += 1
    assert openvino_conv._array_digest(other) != first
    assert openvino_conv._array_digest(w.copy()) == first  # equal values, equal digest


def test_a_chain_of_convs_in_one_layer_equals_the_naive_steps() -> None:
    """Three convs in one layer (CpuBackend.conv3d_chain): the first reads a channels-last
    part and a channels-first one with uneven pads and applies a norm and leaky relu, the
    second has an anisotropic (3, 1, 3) kernel and valid pads, the third a 1^3 kernel and
    no activation; odd sizes, a batch of two, both layouts out. Against the naive steps."""
    from znni.primitives.base import ConvStep

    rng = np.random.default_rng(21)
    backend = make_backend("cpu", threads=2)
    last = rng.standard_normal((2, 7, 6, 9, 3)).astype(np.float32).transpose(0, 4, 1, 2, 3)
    first = rng.standard_normal((2, 2, 7, 6, 9)).astype(np.float32)  # (S, C, Z, Y, X)

    def weights(cout: int, cin: int, kernel: tuple[int, int, int]) -> tuple:
        w = (rng.standard_normal((cout, cin, *kernel)) / np.sqrt(cin * np.prod(kernel)))
        return w.astype(np.float32), rng.standard_normal(cout).astype(np.float32)

    norm = InstanceNorm(rng.standard_normal(4).astype(np.float32),
                        rng.standard_normal(4).astype(np.float32), 1e-5)
    steps = [ConvStep((1, 0, 2, 1, 1, 0), *weights(4, 5, (3, 3, 3)), Activation("leaky_relu", 0.1),
                      norm),
             ConvStep((0,) * 6, *weights(3, 4, (3, 1, 3)), Activation("relu")),
             ConvStep((0,) * 6, *weights(2, 3, (1, 1, 1)))]
    ref = np.concatenate([last, first], axis=1)
    for st in steps:
        ref = np.pad(ref, [(0, 0), (0, 0)] + [(st.pads[a], st.pads[a + 3]) for a in range(3)])
        ref = np.stack([naive_conv(ref[s], st.weight, st.bias) for s in range(2)])
        if st.norm is not None:
            ref = naive_instance_norm(ref, st.norm.scale, st.norm.bias, st.norm.epsilon)
        if st.act is not None:
            ref = naive_activation(ref, st.act.kind, st.act.slope)
    for channels_last in (False, True):
        got = backend.conv3d_chain([last, first], steps, channels_last)
        assert got.shape == ref.shape == (2, 2, 5, 5, 7)
        assert got.flags.c_contiguous != channels_last
        assert np.abs(got - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max())
    with pytest.raises(ValueError, match="conv step 1 has weight shape"):
        backend.conv3d_chain([last, first], [steps[0], steps[2]])
    with pytest.raises(ValueError, match="needs one step or more"):
        backend.conv3d_chain([first], [])
