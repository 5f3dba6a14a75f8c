"""Malformed specs and weights: one sentence on stderr, exit 2, nothing written."""

from __future__ import annotations

import json

import numpy as np
import pytest

from znni.cli import main

GOOD_LAYERS = [
    {"kind": "conv", "out_channels": 2, "kernel": [3, 3, 3]},
    {"kind": "relu"},
    {"kind": "maxpool", "window": [2, 2, 2]},
    {"kind": "conv", "out_channels": 1, "kernel": [1, 2, 2]},
    {"kind": "sigmoid"},
]


def good_weights():
    return {
        "0.weight": np.ones((2, 1, 3, 3, 3), np.float32),
        "0.bias": np.zeros(2, np.float32),
        "3.weight": np.ones((1, 2, 1, 2, 2), np.float32),
        "3.bias": np.zeros(1, np.float32),
    }


def spec(**changes):
    body = {"name": "n", "in_channels": 1, "weights": "w.npz", "layers": GOOD_LAYERS}
    body.update(changes)
    return body


def weights(**changes):
    w = good_weights()
    for key, value in changes.items():
        key = key.replace("_", ".", 1)
        if value is None:
            w.pop(key)
        else:
            w[key] = value
    return w


CASES = {
    "not json": ("{not json", good_weights(), "not valid JSON"),
    "not an object": ("[1, 2]", good_weights(), "expected a JSON object"),
    "unknown top key": (spec(layer=[]), good_weights(), "unknown key 'layer'"),
    "no layers": (spec(layers=[]), good_weights(), "non-empty list"),
    "unknown kind": (spec(layers=[{"kind": "conv2d"}]), good_weights(), "layer 0 key 'kind'"),
    "bad kernel": (
        spec(layers=[{"kind": "conv", "out_channels": 2, "kernel": [3, 0, 3]}]),
        good_weights(),
        "layer 0 (conv) key 'kernel'",
    ),
    "bad out_channels": (
        spec(layers=[{"kind": "conv", "out_channels": -1, "kernel": 3}]),
        good_weights(),
        "key 'out_channels' must be a positive integer",
    ),
    "bad pool window": (
        spec(layers=[*GOOD_LAYERS[:2], {"kind": "maxpool", "window": [2, 2]}, *GOOD_LAYERS[3:]]),
        good_weights(),
        "layer 2 (maxpool) key 'window'",
    ),
    "unknown layer key": (
        spec(layers=[{**GOOD_LAYERS[0], "stride": 2}, *GOOD_LAYERS[1:]]),
        good_weights(),
        "layer 0 (conv) has unknown key 'stride'",
    ),
    "bad in_channels": (spec(in_channels=0), good_weights(), "'in_channels' must be a positive"),
    "bad input scale": (
        spec(input={"scale": "x"}),
        good_weights(),
        "'input.scale' must be a number",
    ),
    "no conv": (spec(layers=[{"kind": "relu"}]), {}, "no conv layer"),
    "missing weight key": (
        spec(),
        weights(**{"3_bias": None}),
        "layer 3 (conv) needs key '3.bias'",
    ),
    "wrong weight shape": (
        spec(),
        weights(**{"0_weight": np.ones((2, 2, 3, 3, 3), np.float32)}),
        "layer 0 key '0.weight' has shape (2, 2, 3, 3, 3), expected (2, 1, 3, 3, 3)",
    ),
    "wrong bias shape": (
        spec(),
        weights(**{"3_bias": np.zeros(2, np.float32)}),
        "key '3.bias' has shape (2,), expected (1,)",
    ),
    "unexpected key": (
        spec(),
        weights(**{"1_weight": np.zeros(1, np.float32)}),
        "unexpected key '1.weight'",
    ),
    "nan weight": (
        spec(),
        weights(**{"0_bias": np.array([0.0, np.nan], np.float32)}),
        "contains NaN or infinity",
    ),
    "integer weight": (
        spec(),
        weights(**{"0_bias": np.array([0, 1], np.int64)}),
        "has dtype int64, expected a float",
    ),
    "weights file missing": (spec(weights="missing.npz"), good_weights(), "does not exist"),
    "weights not npz": (spec(weights="spec.json"), good_weights(), "not a readable .npz"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_network_is_refused_with_one_sentence(tmp_path, capsys, name):
    body, w, message = CASES[name]
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(body if isinstance(body, str) else json.dumps(body))
    np.savez(tmp_path / "w.npz", **w)
    out = tmp_path / "out.zarr"
    code = main(["segment", str(spec_path), str(tmp_path / "in.zarr"), str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert message in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_missing_spec_file(tmp_path, capsys):
    code = main(["segment", str(tmp_path / "nope.json"), "in.zarr", str(tmp_path / "o.zarr")])
    assert code == 2
    assert "does not exist" in capsys.readouterr().err


def test_network_that_is_a_directory(tmp_path, capsys):
    """A Zarr array given as the network (arguments swapped) is named as what it is."""
    (tmp_path / "in.zarr").mkdir()
    code = main(["segment", str(tmp_path / "in.zarr"), "x.zarr", str(tmp_path / "o.zarr")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert "is a directory without an rdf.yaml; give a JSON network spec, an .onnx model " \
        "file or a bioimage.io package" in err
    assert not (tmp_path / "o.zarr").exists()
