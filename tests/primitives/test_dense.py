"""Dense MPF inference of whole networks against the brute-force strided network."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support.naive import close, naive_dense, naive_dense_at, naive_fov, random_network

from znni.model import load_network
from znni.primitives import ReferenceBackend, dense_forward


def _network(tmp_path, layers, params, in_channels):
    spec = tmp_path / "net.json"
    spec.write_text(json.dumps({"in_channels": in_channels, "weights": "w.npz", "layers": layers}))
    np.savez(tmp_path / "w.npz", **params)
    return load_network(spec)


@pytest.mark.parametrize("seed", range(24))
def test_random_network_dense_output_equals_brute_force(tmp_path, seed):
    rng = np.random.default_rng(seed)
    cin = int(rng.integers(1, 4))
    layers, params = random_network(rng, cin)
    net = _network(tmp_path, layers, params, cin)
    assert net.fov == naive_fov(layers)
    size = net.input_size_for(tuple(int(v) for v in rng.integers(1, 5, size=3)))
    x = rng.standard_normal((2, cin, *size)).astype(np.float32)  # a batch of two patches
    out = dense_forward(net.ops, x, ReferenceBackend())
    expected_out = tuple(n - f + 1 for n, f in zip(size, net.fov))
    assert out.shape == (2, net.out_channels, *expected_out)
    # Brute force at up to 40 sampled output voxels (every voxel on small outputs).
    all_pos = list(np.ndindex(*expected_out))
    pick = rng.choice(len(all_pos), size=min(40, len(all_pos)), replace=False)
    positions = [all_pos[i] for i in sorted(pick)]
    for b in range(2):
        ref = naive_dense_at(layers, params, x[b], positions)
        got = np.array([out[b, :, i, j, k] for i, j, k in positions])
        assert close(got, ref), (net.fov, size)


def test_whole_output_brute_force_with_two_pools(tmp_path):
    rng = np.random.default_rng(99)
    layers = [
        {"kind": "conv", "out_channels": 3, "kernel": [2, 3, 1]},
        {"kind": "relu"},
        {"kind": "maxpool", "window": [2, 1, 3]},
        {"kind": "conv", "out_channels": 2, "kernel": [1, 2, 2]},
        {"kind": "tanh"},
        {"kind": "maxpool", "window": [1, 2, 2]},
        {"kind": "conv", "out_channels": 2, "kernel": [2, 2, 1]},
        {"kind": "sigmoid"},
    ]
    params = {}
    cin = 2
    for i, layer in enumerate(layers):
        if layer["kind"] == "conv":
            shape = (layer["out_channels"], cin, *layer["kernel"])
            params[f"{i}.weight"] = rng.standard_normal(shape).astype(np.float32)
            params[f"{i}.bias"] = rng.standard_normal(shape[0]).astype(np.float32)
            cin = shape[0]
    net = _network(tmp_path, layers, params, 2)
    size = net.input_size_for((4, 4, 6))
    x = rng.standard_normal((1, 2, *size)).astype(np.float32)
    out = dense_forward(net.ops, x, ReferenceBackend())[0]
    assert close(out, naive_dense(layers, params, x[0]))


def test_invalid_patch_size_is_refused(tmp_path):
    layers = [
        {"kind": "conv", "out_channels": 1, "kernel": [2, 2, 2]},
        {"kind": "maxpool", "window": [2, 2, 2]},
    ]
    params = {"0.weight": np.ones((1, 1, 2, 2, 2), np.float32), "0.bias": np.zeros(1, np.float32)}
    net = _network(tmp_path, layers, params, 1)
    assert net.is_valid_input_size((8, 8, 8))
    assert not net.is_valid_input_size((9, 9, 9))
    with pytest.raises(ValueError, match="divisible by 2"):
        dense_forward(net.ops, np.zeros((1, 1, 9, 9, 9), np.float32), ReferenceBackend())
