"""The PyTorch dense-equivalent of a ZNNi network, whole or timed per layer on z-slabs.

Dense-equivalent: every maxpool a stride-1 max filter, every later conv and pool
dilated by the product of the earlier pool windows (the dense semantics of docs/design.md),
so one pass over a patch yields the same dense output znni's MPF computes.

On a planner-sized patch (~200^3) the whole dense-equivalent network does not fit
the time of a benchmark on 2 cores (n537 at 218^3 is ~10^15 flops), so the peer is
also measured per layer on z-slabs: each conv (+ReLU) and max filter runs on random
input with the layer's true (y, x) extent and channels on this patch, but only
`planes` output z-planes; its time is scaled by (output planes / timed planes).
Every output plane of such a layer costs the same work, so this normalises the same
computation per voxel rather than modelling it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from math import prod
from typing import Any

from znni.triple import Triple


@dataclass(frozen=True)
class DenseLayer:
    """One conv or max filter of the dense-equivalent network on a given patch."""

    index: int  # op index in the spec (the weights key)
    kind: str  # "conv" or "maxpool"
    cin: int
    cout: int
    kernel: Triple
    dilation: Triple
    size_in: Triple
    size_out: Triple

    @property
    def flops(self) -> float:
        """Multiply-adds x2 of a conv, compares of a max filter (one per window voxel)."""
        per_out = 2 * self.cin * prod(self.kernel) if self.kind == "conv" else prod(self.kernel)
        return float(per_out * self.cout * prod(self.size_out))

    def slab_in_bytes(self, planes: int) -> int:
        """float32 bytes of the input slab that yields `planes` output z-planes."""
        z = planes + self.dilation[0] * (self.kernel[0] - 1)
        return 4 * self.cin * z * self.size_in[1] * self.size_in[2]

    def slab_out_bytes(self, planes: int) -> int:
        return 4 * self.cout * planes * self.size_out[1] * self.size_out[2]


def dense_layers(spec: dict, size: Triple) -> list[DenseLayer]:
    """The convs and max filters of the dense-equivalent network over an input patch."""
    out: list[DenseLayer] = []
    n, dil, cin = tuple(size), (1, 1, 1), spec["in_channels"]
    for i, layer in enumerate(spec["layers"]):
        kind = layer["kind"]
        if kind not in ("conv", "maxpool"):
            continue
        k = tuple(layer["kernel"] if kind == "conv" else layer["window"])
        nout = tuple(a - d * (kk - 1) for a, d, kk in zip(n, dil, k, strict=True))
        if min(nout) < 1:
            raise ValueError(f"patch {size} is smaller than the field of view at layer {i}")
        cout = layer["out_channels"] if kind == "conv" else cin
        out.append(DenseLayer(i, kind, cin, cout, k, dil, n, nout))  # type: ignore[arg-type]
        n, cin = nout, cout
        if kind == "maxpool":
            dil = tuple(d * kk for d, kk in zip(dil, k, strict=True))
    return out


def torch_dense(torch: Any, spec: dict, params: dict) -> Any:
    """The whole dense-equivalent network as an nn.Sequential (convs with ReLU)."""
    nn = torch.nn
    mods, dil, cin = [], (1, 1, 1), spec["in_channels"]
    for i, layer in enumerate(spec["layers"]):
        kind = layer["kind"]
        if kind == "conv":
            conv = nn.Conv3d(cin, layer["out_channels"], layer["kernel"], dilation=dil)
            conv.weight.data = torch.from_numpy(params[f"{i}.weight"])
            conv.bias.data = torch.from_numpy(params[f"{i}.bias"])
            mods.append(conv)
            cin = layer["out_channels"]
        elif kind == "maxpool":
            mods.append(nn.MaxPool3d(layer["window"], stride=1, dilation=dil))
            dil = tuple(d * w for d, w in zip(dil, layer["window"], strict=True))
        elif kind == "relu":
            mods.append(nn.ReLU())
        else:
            raise ValueError(f"layer {i}: kind {kind!r} has no dense-equivalent here")
    return nn.Sequential(*mods).eval()


def slab_planes(layer: DenseLayer, plane_s: float, budget_s: float, max_bytes: int) -> int:
    """Output planes to time: about `budget_s` of work, at least 1, at most all planes,
    input + output slab within `max_bytes` (1 plane even when it alone is larger)."""
    planes = int(max(1, min(layer.size_out[0], budget_s / max(plane_s, 1e-9))))
    while planes > 1 and layer.slab_in_bytes(planes) + layer.slab_out_bytes(planes) > max_bytes:
        planes -= max(1, planes // 8)
    return planes


@dataclass(frozen=True)
class SlabTiming:
    layer: DenseLayer
    one_plane_s: float  # a warm 1-plane slab
    planes: int  # output planes in the slab whose time is scaled
    slab_s: float  # that slab's seconds

    @property
    def scaled_s(self) -> float:
        """Seconds for all of the layer's output planes on the patch."""
        return self.slab_s * self.layer.size_out[0] / self.planes


def _layer_run(torch: Any, layer: DenseLayer, params: dict, planes: int) -> Any:
    """A closure running the torch layer on a random slab giving `planes` output planes."""
    z = planes + layer.dilation[0] * (layer.kernel[0] - 1)
    x = torch.randn(1, layer.cin, z, layer.size_in[1], layer.size_in[2])  # (1, C, Z, Y, X)
    f = torch.nn.functional
    if layer.kind == "conv":
        w = torch.from_numpy(params[f"{layer.index}.weight"])
        b = torch.from_numpy(params[f"{layer.index}.bias"])
        return lambda: torch.relu(f.conv3d(x, w, b, dilation=layer.dilation))
    pool = torch.nn.MaxPool3d(layer.kernel, stride=1, dilation=layer.dilation)
    return lambda: pool(x)


def _time_once(torch: Any, fn: Any) -> float:
    with torch.inference_mode():
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


def torch_slabs(
    torch: Any, spec: dict, params: dict, size: Triple, budget_s: float, max_bytes: int
) -> list[SlabTiming]:
    """Per-layer z-slab timings of the dense-equivalent network over an input patch.

    Each layer: a cold then a warm 1-plane slab (the warm one sets the slab size), then,
    if more planes fit `budget_s` (shared evenly by the layers) and `max_bytes`, one timed
    slab of that many planes. The larger slab amortises per-call overhead (in torch's
    favour). Sum of SlabTiming.scaled_s is the network's seconds on the patch.
    """
    layers = dense_layers(spec, size)
    per_layer_s = budget_s / len(layers)
    out = []
    for layer in layers:
        one = _layer_run(torch, layer, params, 1)
        _time_once(torch, one)  # cold: oneDNN primitive creation, first touch
        one_s = _time_once(torch, one)
        del one
        planes = slab_planes(layer, one_s, per_layer_s, max_bytes)
        slab_s = one_s
        if planes > 1:
            slab_s = _time_once(torch, _layer_run(torch, layer, params, planes))
        out.append(SlabTiming(layer, one_s, planes, slab_s))
    return out
