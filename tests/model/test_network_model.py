"""The network model: field of view, valid patch sizes, layer shapes, digests."""

from __future__ import annotations

import json

import numpy as np
import pytest

from znni.model import load_network


def write_net(tmp_path, layers, in_channels=1, **extra):
    rng = np.random.default_rng(0)
    params, c = {}, in_channels
    for i, layer in enumerate(layers):
        if layer["kind"] == "conv":
            k = layer["kernel"] if isinstance(layer["kernel"], list) else [layer["kernel"]] * 3
            params[f"{i}.weight"] = rng.standard_normal((layer["out_channels"], c, *k)).astype("f4")
            params[f"{i}.bias"] = rng.standard_normal(layer["out_channels"]).astype("f4")
            c = layer["out_channels"]
    spec = {"name": "t", "in_channels": in_channels, "weights": "t.npz", "layers": layers, **extra}
    (tmp_path / "t.json").write_text(json.dumps(spec))
    np.savez(tmp_path / "t.npz", **params)
    return tmp_path / "t.json"


N337 = [
    {"kind": "conv", "out_channels": 4, "kernel": [2, 2, 2]}, {"kind": "relu"},
    {"kind": "maxpool", "window": [2, 2, 2]},
    {"kind": "conv", "out_channels": 4, "kernel": [3, 3, 3]}, {"kind": "relu"},
    {"kind": "maxpool", "window": [2, 2, 2]},
    {"kind": "conv", "out_channels": 4, "kernel": [3, 3, 3]}, {"kind": "relu"},
    {"kind": "maxpool", "window": [2, 2, 2]},
    {"kind": "conv", "out_channels": 4, "kernel": [3, 3, 3]}, {"kind": "relu"},
    {"kind": "conv", "out_channels": 4, "kernel": [3, 3, 3]}, {"kind": "relu"},
    {"kind": "conv", "out_channels": 4, "kernel": [3, 3, 3]}, {"kind": "relu"},
    {"kind": "conv", "out_channels": 3, "kernel": [3, 3, 3]}, {"kind": "sigmoid"},
]


def test_n337_field_of_view_matches_the_paper(tmp_path):
    net = load_network(write_net(tmp_path, N337))
    assert net.fov == (85, 85, 85)  # the ZNNi paper's network table
    assert net.pool_product == (8, 8, 8)
    assert net.out_channels == 3


def test_anisotropic_fov_and_valid_sizes(tmp_path):
    layers = [
        {"kind": "conv", "out_channels": 2, "kernel": [1, 3, 5]},
        {"kind": "maxpool", "window": [1, 2, 3]},
        {"kind": "conv", "out_channels": 2, "kernel": [3, 3, 3]},
    ]
    net = load_network(write_net(tmp_path, layers))
    # fov = 1 + (k1-1) + (p-1) + (k2-1)*p per axis
    assert net.fov == (3, 1 + 2 + 1 + 4, 1 + 4 + 2 + 6)
    size = net.input_size_for((5, 5, 5))
    assert net.is_valid_input_size(size)
    out = net.output_size(size)
    assert all(o >= 5 and o % p == 0 for o, p in zip(out, net.pool_product))
    assert not net.is_valid_input_size((size[0], size[1] + 1, size[2]))


def test_layer_shapes_track_fragment_batches_and_flops(tmp_path):
    net = load_network(write_net(tmp_path, N337))
    shapes = net.layer_shapes((85 + 7, 85 + 7, 85 + 7))
    pools = [s for s in shapes if s.kind == "maxpool"]
    assert [p.batch_out for p in pools] == [8, 64, 512]
    assert shapes[-2].size_out == (1, 1, 1) and shapes[-2].batch_out == 512
    conv0 = shapes[0]
    assert conv0.direct_flops == 2 * 1 * 4 * 1 * 91**3 * 8


def test_digest_changes_with_weights_and_spec(tmp_path):
    path = write_net(tmp_path, N337)
    d1 = load_network(path).digest
    w = dict(np.load(tmp_path / "t.npz"))
    w["0.bias"] = w["0.bias"] + 1
    np.savez(tmp_path / "t2.npz", **w)
    assert load_network(path, tmp_path / "t2.npz").digest != d1
    assert load_network(path).digest == d1


def test_input_transform_and_leaky_slope_are_read(tmp_path):
    layers = [{"kind": "conv", "out_channels": 1, "kernel": 1}, {"kind": "leaky_relu", "slope": 0.3}]
    net = load_network(write_net(tmp_path, layers, input={"scale": 0.5, "shift": -1}))
    assert (net.input_scale, net.input_shift) == (0.5, -1.0)
    assert net.ops[1].slope == 0.3


def test_weights_override_path(tmp_path):
    path = write_net(tmp_path, N337)
    (tmp_path / "t.npz").rename(tmp_path / "other.npz")
    with pytest.raises(ValueError, match="does not exist"):
        load_network(path)
    assert load_network(path, tmp_path / "other.npz").out_channels == 3
