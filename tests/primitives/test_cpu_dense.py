"""Whole random networks through CpuBackend against the brute-force dense reference."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support.naive import close, naive_dense_at, random_network

from znni.model import load_network
from znni.primitives import dense_forward
from znni.primitives.backends import make_backend
from znni.primitives.cpu import CONV_PRIMITIVES, CpuBackend


@pytest.fixture(scope="module")
def backend():
    b = make_backend("cpu", threads=2, fft_effort="FFTW_ESTIMATE", persist_choices=False)
    yield b
    b.close()


def _network(tmp_path, layers, params, in_channels):
    spec = tmp_path / "net.json"
    spec.write_text(json.dumps({"in_channels": in_channels, "weights": "w.npz", "layers": layers}))
    np.savez(tmp_path / "w.npz", **params)
    return load_network(spec)


def test_registry_builds_the_cpu_backend(backend):
    assert isinstance(backend, CpuBackend)
    assert backend.name == "cpu"


@pytest.mark.parametrize("seed", range(10))
def test_random_network_through_cpu_backend_equals_brute_force(tmp_path, backend, seed):
    rng = np.random.default_rng(500 + seed)
    cin = int(rng.integers(1, 4))
    layers, params = random_network(rng, cin)
    net = _network(tmp_path, layers, params, cin)
    size = net.input_size_for(tuple(int(v) for v in rng.integers(1, 5, size=3)))
    x = rng.standard_normal((2, cin, *size)).astype(np.float32)
    n_ops = len(net.ops)
    # Alternate a fixed primitive per seed with the backend's own choice.
    fixed = None if seed % 4 == 3 else CONV_PRIMITIVES[seed % 3]
    out = dense_forward(net.ops, x, backend, [fixed] * n_ops)
    expected = tuple(n - f + 1 for n, f in zip(size, net.fov))
    assert out.shape == (2, net.out_channels, *expected)
    all_pos = list(np.ndindex(*expected))
    pick = rng.choice(len(all_pos), size=min(30, len(all_pos)), replace=False)
    positions = [all_pos[i] for i in sorted(pick)]
    for b in range(2):
        ref = naive_dense_at(layers, params, x[b], positions)
        got = np.array([out[b, :, i, j, k] for i, j, k in positions])
        assert close(got, ref), (net.fov, size, fixed)
