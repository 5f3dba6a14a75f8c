"""The networks benchmark's PyTorch peer: dense-equivalent geometry and slab arithmetic.

The benchmark's znni/torch ratio is only honest if its torch network computes the
same dense output (checked against tests/support/naive.py) and if a z-slab of `planes`
output planes has the layer's true (y, x) extent (checked on the layer's shapes
from naive_fov). Torch is optional: those tests skip without it.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest
from support.naive import close, naive_dense, naive_fov, random_network

spec_ = importlib.util.spec_from_file_location(
    "_dense_torch", Path(__file__).resolve().parents[2] / "benchmarks" / "_dense_torch.py"
)
assert spec_ is not None and spec_.loader is not None
dt = importlib.util.module_from_spec(spec_)
sys.modules["_dense_torch"] = dt  # dataclasses look their module up there
spec_.loader.exec_module(dt)


def relu_network(seed: int, cin: int) -> tuple[dict, dict]:
    """tests/support/naive.py's random network with every activation a ReLU (torch_dense's kind)."""
    layers, params = random_network(np.random.default_rng(seed), cin, max_pools=2)
    layers = [lay if lay["kind"] in ("conv", "maxpool") else {"kind": "relu"} for lay in layers]
    return {"in_channels": cin, "layers": layers}, params


@pytest.mark.parametrize("seed", range(6))
def test_dense_layers_end_at_the_naive_dense_output_size(seed: int) -> None:
    spec, _ = relu_network(seed, 2)
    fov = naive_fov(spec["layers"])
    size = (fov[0] + 3, fov[1] + 1, fov[2] + 4)  # odd, anisotropic
    layers = dt.dense_layers(spec, size)
    assert layers[-1].size_out == tuple(n - f + 1 for n, f in zip(size, fov, strict=True))
    stride = np.ones(3, int)  # dilation = product of the earlier pool windows, per axis
    for lay, raw in zip(layers, [x for x in spec["layers"] if x["kind"] != "relu"], strict=True):
        assert lay.dilation == tuple(int(s) for s in stride)
        if raw["kind"] == "maxpool":
            stride *= np.array(raw["window"])
    with pytest.raises(ValueError, match="field of view"):
        dt.dense_layers(spec, tuple(f - 1 for f in fov))


def test_slab_planes_bounds_and_scaling() -> None:
    lay = dt.DenseLayer(3, "conv", 80, 80, (5, 5, 5), (2, 2, 2), (100, 90, 90), (92, 82, 82))
    assert dt.slab_planes(lay, 0.5, 5.0, 2**40) == 10  # budget over the one-plane cost
    assert dt.slab_planes(lay, 1e-6, 1e3, 2**40) == 92  # never more than the layer has
    assert dt.slab_planes(lay, 10.0, 1.0, 2**40) == 1  # at least one
    cap = 3 * 2**27
    planes = dt.slab_planes(lay, 1e-6, 1e3, cap)
    assert planes > 1 and lay.slab_in_bytes(planes) + lay.slab_out_bytes(planes) <= cap
    # input slab: planes + dilation*(k-1) z-planes of the full (y, x) input extent
    assert lay.slab_in_bytes(4) == 4 * 80 * (4 + 8) * 90 * 90
    scaled = dt.SlabTiming(lay, 0.3, 4, 1.0).scaled_s  # a 4-plane slab of cost 1.0, 92 planes
    assert scaled == pytest.approx(1.0 * 92 / 4)


@pytest.mark.parametrize("seed", [2, 4, 8])  # two pools, anisotropic, z kernels > 1 after
def test_torch_dense_equivalent_matches_naive_dense(seed: int) -> None:
    torch = pytest.importorskip("torch")
    spec, params = relu_network(seed, 2)
    fov = naive_fov(spec["layers"])
    x = np.random.default_rng(seed).random((2, fov[0] + 1, fov[1] + 2, fov[2]), np.float32)
    with torch.inference_mode():
        out = dt.torch_dense(torch, spec, params)(torch.from_numpy(x[None])).numpy()[0]
    assert close(out, naive_dense(spec["layers"], params, x))


@pytest.mark.parametrize("seed", [4, 8])
def test_slab_run_yields_the_planes_of_the_true_extent(seed: int) -> None:
    torch = pytest.importorskip("torch")
    spec, params = relu_network(seed, 3)
    fov = naive_fov(spec["layers"])
    size = (fov[0] + 5, fov[1] + 2, fov[2] + 3)
    for lay in dt.dense_layers(spec, size):
        planes = min(2, lay.size_out[0])
        with torch.inference_mode():
            y = dt._layer_run(torch, lay, params, planes)()
        assert tuple(y.shape) == (1, lay.cout, planes, *lay.size_out[1:])
