"""Fast CPU conv primitives against scipy (tests/support/naive.py) and the reference path."""

from __future__ import annotations

from math import prod

import numpy as np
import pytest
from support.naive import close, naive_activation, naive_conv

from znni.primitives.base import Activation
from znni.primitives.cpu import CONV_PRIMITIVES, CpuBackend
from znni.primitives.cpu.fft_conv import COMPLEX_BYTES, spectrum_shape
from znni.primitives.cpu.tiling import recompute_parts
from znni.primitives.fft_sizes import padded_shape
from znni.primitives.reference import conv3d_reference

ACTS = ["relu", "sigmoid", "tanh", "elu", "leaky_relu", "linear"]


@pytest.fixture(scope="module")
def backend():
    # FFTW_ESTIMATE plans never write wisdom; choices stay in memory.
    b = CpuBackend(threads=2, fft_effort="FFTW_ESTIMATE", persist_choices=False)
    yield b
    b.close()


def _layer(rng, s, cin, cout, size, kernel):
    x = rng.standard_normal((s, cin, *size)).astype(np.float32)
    w = (rng.standard_normal((cout, cin, *kernel)) / np.sqrt(cin * np.prod(kernel))).astype(
        np.float32
    )
    b = (0.1 * rng.standard_normal(cout)).astype(np.float32)
    return x, w, b


def _naive(x, w, b, act: Activation | None):
    out = np.stack([naive_conv(x[i], w, b) for i in range(x.shape[0])])
    return out if act is None else naive_activation(out, act.kind, act.slope)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("primitive", CONV_PRIMITIVES)
def test_random_shapes_match_scipy_and_reference(backend, primitive, seed):
    rng = np.random.default_rng(1000 + seed)
    s = int(rng.integers(1, 4))
    cin, cout = (int(v) for v in rng.integers(1, 7, size=2))
    kernel = tuple(int(v) for v in rng.integers(1, 6, size=3))  # anisotropic
    size = tuple(int(k + rng.integers(0, 9)) for k in kernel)  # odd and even sizes
    act = Activation(ACTS[seed % len(ACTS)], 0.1)
    x, w, b = _layer(rng, s, cin, cout, size, kernel)
    out = backend.conv3d(x, w, b, act, primitive)
    assert out.dtype == np.float32
    assert close(out, _naive(x, w, b, act)), (primitive, s, cin, cout, size, kernel)
    ref = conv3d_reference(x, w, b)
    assert close(backend.conv3d(x, w, b, None, primitive), ref)


@pytest.mark.parametrize("primitive", CONV_PRIMITIVES)
@pytest.mark.parametrize(
    ("s", "cin", "cout", "size", "kernel"),
    [
        (1, 80, 3, (5, 6, 7), (3, 2, 3)),  # many input channels, tiny space
        (2, 3, 80, (4, 5, 6), (2, 3, 1)),  # many output channels
        (3, 40, 40, (4, 4, 5), (1, 1, 1)),  # 1x1x1 kernel
        (1, 1, 4, (17, 13, 11), (5, 4, 3)),  # single-channel first layer, primes
        (2, 2, 2, (1, 7, 8), (1, 3, 3)),  # a flat axis
    ],
)
def test_channel_extremes_match_reference(backend, primitive, s, cin, cout, size, kernel):
    rng = np.random.default_rng(cin * 100 + cout)
    x, w, b = _layer(rng, s, cin, cout, size, kernel)
    out = backend.conv3d(x, w, b, Activation("elu"), primitive)
    ref = conv3d_reference(x, w, b)
    assert close(out, naive_activation(ref, "elu"))


def test_chosen_primitive_matches_reference_and_is_cached(backend):
    rng = np.random.default_rng(7)
    x, w, b = _layer(rng, 2, 4, 5, (12, 11, 10), (3, 3, 3))
    out = backend.conv3d(x, w, b, None, None)
    assert close(out, conv3d_reference(x, w, b))
    assert len(backend.chooser.choices) >= 1
    key = next(iter(backend.chooser.choices))
    assert backend.chooser.choices[key] in CONV_PRIMITIVES


def test_kept_spectra_are_reused_and_keyed_by_size(backend):
    rng = np.random.default_rng(8)
    x, w, b = _layer(rng, 1, 3, 4, (9, 9, 9), (3, 3, 3))
    backend.spectra.clear()
    backend.conv3d(x, w, b, None, "fft-keep")
    backend.conv3d(x, w, b, None, "fft-keep")
    assert len(backend.spectra) == 1
    x2 = rng.standard_normal((1, 3, 13, 9, 9)).astype(np.float32)  # another padded size
    assert close(backend.conv3d(x2, w, b, None, "fft-keep"), conv3d_reference(x2, w, b))
    assert len(backend.spectra) == 2
    w2 = w.copy()
    w2[0, 0, 0, 0, 0] += 1.0  # same shape, other weights: must not hit the cache
    assert close(backend.conv3d(x, w2, b, None, "fft-keep"), conv3d_reference(x, w2, b))
    assert len(backend.spectra) == 3


@pytest.mark.parametrize(
    ("x_shape", "w_shape", "primitive"),
    [
        ((1, 2, 5, 5, 5), (3, 3, 2, 2, 2), "direct"),  # channel mismatch
        ((1, 2, 2, 5, 5), (3, 2, 3, 2, 2), "direct"),  # input smaller than kernel
        ((2, 5, 5, 5), (3, 2, 2, 2, 2), "direct"),  # not 5-D
        ((1, 2, 5, 5, 5), (3, 2, 2, 2, 2), "winograd"),  # unknown primitive
    ],
)
def test_bad_arguments_raise_value_error(backend, x_shape, w_shape, primitive):
    x = np.zeros(x_shape, np.float32)
    w = np.zeros(w_shape, np.float32)
    with pytest.raises(ValueError):
        backend.conv3d(x, w, np.zeros(w_shape[0], np.float32), None, primitive)


@pytest.mark.parametrize("work_bytes", [2**29, 40_000, 1])
@pytest.mark.parametrize("tiles", [2, 3, 4])
@pytest.mark.parametrize("primitive", ["fft-keep", "fft-recompute"])
def test_overlap_save_tiles_match_scipy(primitive, tiles, work_bytes):
    # work_bytes: all tiles in one transform chunk, a few per chunk, one per chunk (the tiles
    # stream through one buffer and are scattered into the output chunk by chunk)
    rng = np.random.default_rng(tiles)
    b = CpuBackend(threads=2, fft_effort="FFTW_ESTIMATE", persist_choices=False, fft_tiles=tiles,
                   fft_work_bytes=work_bytes)
    try:
        for size, kernel in [
            ((13, 10, 17), (3, 2, 4)),
            ((6, 9, 5), (1, 5, 2)),
            ((3, 11, 8), (3, 1, 1)),
        ]:
            x, w, bias = _layer(rng, 2, 3, 4, size, kernel)
            act = Activation("leaky_relu", 0.2)
            assert close(b.conv3d(x, w, bias, act, primitive), _naive(x, w, bias, act))
    finally:
        b.close()


@pytest.mark.parametrize("slab_bytes", [2**23, 20_000, 1])
@pytest.mark.parametrize(
    ("s", "cin", "kernel", "size", "gemms"),
    [
        (2, 22, (3, 3, 2), (9, 11, 13), 3),  # split: 22*3*2 = 132 rows per GEMM
        (1, 130, (1, 4, 1), (3, 10, 7), 4),  # split: 130 rows, flat in z and x
        (3, 9, (2, 5, 3), (6, 13, 8), 1),  # not split: 9*2*3 = 54 < 128, one GEMM of 270
        (1, 140, (1, 1, 1), (5, 4, 3), 1),  # 1x1x1: the input view itself, no gather
    ],
)
def test_direct_conv_split_gathers_match_naive(s, cin, kernel, size, gemms, slab_bytes):
    # Deep layers gather (c, dz, dx) columns once over L + (ky-1)*X positions and run one
    # GEMM per dy on row-shifted views; blocks of whole planes, of rows and of one row each.
    from concurrent.futures import ThreadPoolExecutor

    from znni.primitives.cpu.direct_conv import column_layout, direct_conv3d

    assert column_layout(cin, kernel)[1] == gemms  # the case takes the path it names
    rng = np.random.default_rng(cin)
    x, w, bias = _layer(rng, s, cin, 5, size, kernel)
    act = Activation("elu", 1.0)
    with ThreadPoolExecutor(2) as pool:
        got = direct_conv3d(pool, x, w, bias, act, slab_bytes=slab_bytes)
    assert close(got, _naive(x, w, bias, act))


@pytest.mark.parametrize("part_channels", [5, 3, 2, 1])
@pytest.mark.parametrize("work_bytes", [2**29, 1])
def test_tiled_recompute_in_parts_of_output_channels_matches_naive(part_channels, work_bytes):
    # Recomputed spectra are made once per part of the output channels (5 = all in one part,
    # 3 = a full part and a short one) and every tile streams through each part.
    rng = np.random.default_rng(part_channels)
    size, kernel = (12, 9, 14), (3, 2, 4)
    x, w, bias = _layer(rng, 2, 3, 5, size, kernel)
    padded = padded_shape(tuple(-(-(n - k + 1) // 2) + k - 1 for n, k in zip(size, kernel)))
    nf = prod(spectrum_shape(padded))
    part_bytes = part_channels * 3 * nf * COMPLEX_BYTES
    assert recompute_parts(3, 5, nf, part_bytes) == part_channels
    b = CpuBackend(threads=2, fft_effort="FFTW_ESTIMATE", persist_choices=False, fft_tiles=2,
                   fft_work_bytes=work_bytes, recompute_spectra_bytes=part_bytes)
    try:
        act = Activation("leaky_relu", 0.2)
        assert close(b.conv3d(x, w, bias, act, "fft-recompute"), _naive(x, w, bias, act))
    finally:
        b.close()


def test_recompute_spectra_bytes_must_be_positive():
    with pytest.raises(ValueError, match="recompute_spectra_bytes"):
        CpuBackend(recompute_spectra_bytes=0)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("primitive", CONV_PRIMITIVES)
def test_one_voxel_outputs_of_a_batch_with_every_activation(backend, primitive, act):
    # Regression: fused activations on strided (sample, channel) views went wrong here.
    rng = np.random.default_rng(11)
    x, w, b = _layer(rng, 3, 3, 4, (1, 1, 3), (1, 1, 3))
    a = Activation(act, 0.1)
    assert close(backend.conv3d(x, w, b, a, primitive), _naive(x, w, b, a))
