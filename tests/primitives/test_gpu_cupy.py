"""The same parity checks on a real CUDA device through CuPy (`make test-gpu`, which fails without one)."""

from __future__ import annotations

import numpy as np
import pytest
from support.gpu_helpers import net_layers, ops_from_layers, valid_size
from support.naive import close, naive_conv, naive_dense

from znni.primitives import ReferenceBackend, dense_forward

pytestmark = [pytest.mark.gpu]


@pytest.fixture
def cupy_device():
    from znni.primitives.gpu.cupy_device import CupyDevice

    dev = CupyDevice()
    yield dev
    dev.close()


@pytest.mark.parametrize("primitive", ["gpu-direct", "gemm", "fft-keep", "gpu-fft"])
def test_cupy_conv_matches_scipy(cupy_device, primitive):
    from znni.primitives.gpu.backend import GpuBackend

    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 13, 12, 11)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 2, 5)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    out = GpuBackend(cupy_device).conv3d(x, w, b, None, primitive)
    assert close(out, np.stack([naive_conv(x[i], w, b) for i in range(2)]))


@pytest.mark.parametrize("cap", [2**30, 150_000])
@pytest.mark.parametrize("primitive", ["gpu-direct", "gpu-fft"])
def test_cupy_dense_network_under_caps_matches_brute_force(cupy_device, cap, primitive):
    from znni.primitives.gpu.backend import GpuBackend

    rng = np.random.default_rng(7)
    layers, params = net_layers(2, rng)
    ops = ops_from_layers(layers, params)
    size = [valid_size(layers, m, d) for d, m in enumerate((13, 19, 17))]
    x = rng.standard_normal((1, 2, *size)).astype(np.float32)
    cupy_device.memory_cap_bytes = cap
    backend = GpuBackend(cupy_device)
    out = dense_forward(ops, x, backend, [primitive] * len(ops))
    assert close(out, dense_forward(ops, x, ReferenceBackend()))
    assert close(out[0], naive_dense(layers, params, x[0]))
    assert cupy_device.peak_bytes <= cap and cupy_device.in_use_bytes == backend.kept.nbytes
