"""Graph ops on device-resident tensors (DeviceGraphOps, the stand-in device) against the
CPU graph_ops kernels (themselves checked against brute force in test_graph_ops.py):
every op, odd sizes, anisotropic kernels and strides; output-channel chunks under a cap
just below the whole op's peak; a clear error when an op cannot be split; the kernels'
workspace model."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest
from support.naive import close

from znni.engine.compute.graph_forward import KERNELS
from znni.primitives.cpu import graph_ops as g
from znni.primitives.gpu.conv_dispatch import release_conv_caches
from znni.primitives.gpu.device import DeviceOutOfMemory, HostDevice
from znni.primitives.gpu.graph_device import DeviceGraphOps
from znni.primitives.gpu.graph_kernels import KERNELS as XP_KERNELS
from znni.primitives.gpu.graph_split import out_shape, workspace_bytes

RNG = np.random.default_rng(15)
Case = tuple[str, dict, list[np.ndarray]]
TRANSFORMS = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")
NEAREST = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _r(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _conv(cin, cout, group, kernel, strides, pads, dilations, bias=True) -> dict:
    w = _r(cout, cin // group, *kernel)
    return dict(weight=w, bias=_r(cout) if bias else None, strides=strides, pads=pads,
                dilations=dilations, group=group)  # fmt: skip


def _convt(cin, cog, group, kernel, strides, pads, opad, dilations) -> dict:
    return dict(weight=_r(cin, cog, *kernel), bias=_r(cog * group), strides=strides, pads=pads,
                output_padding=opad, dilations=dilations, group=group)  # fmt: skip


def _resize(size, mode, transform, nearest="round_prefer_floor", scales=None) -> dict:
    return dict(size=size, mode=mode, coordinate_transformation_mode=transform,
                nearest_mode=nearest, scales=scales)  # fmt: skip


def _cases() -> dict[str, Case]:
    x = _r(2, 6, 5, 7, 9)
    c: dict[str, Case] = {
        "conv_strided": ("conv", _conv(6, 4, 1, (3, 2, 1), (2, 1, 3), (1, 0, 0, 0, 1, 1), (1, 2, 1)), [x]),
        "conv_grouped": ("conv", _conv(6, 4, 2, (2, 3, 3), (1, 2, 1), (0, 1, 1, 1, 1, 0), (2, 1, 1)), [x]),
        "conv_depthwise": ("conv", _conv(6, 12, 6, (3, 3, 3), (2, 2, 2), (1,) * 6, (1, 1, 1), False), [x]),
        "conv_dilated_1x1": ("conv", _conv(6, 3, 3, (1, 1, 1), (1, 1, 2), (0,) * 6, (1, 1, 1)), [x]),
        "convt_up": ("conv_transpose", _convt(6, 4, 1, (2, 2, 2), (2, 2, 2), (0,) * 6, (0, 0, 0), (1, 1, 1)), [x]),
        "convt_general": ("conv_transpose", _convt(6, 3, 2, (3, 2, 3), (2, 1, 3), (1, 0, 1, 0, 1, 2), (1, 0, 1), (1, 2, 1)), [x]),
        "maxpool": ("maxpool", dict(kernel=(3, 2, 2), strides=(2, 2, 1), pads=(1, 0, 1, 1, 1, 0), dilations=(1, 1, 2), ceil_mode=True), [x]),
        "maxpool_floor": ("maxpool", dict(kernel=(1, 2, 3), strides=(1, 2, 2), pads=(0,) * 6, dilations=(1, 1, 1), ceil_mode=False), [x]),
        "avgpool_incl": ("avgpool", dict(kernel=(2, 3, 3), strides=(2, 2, 3), pads=(1, 1, 0, 0, 1, 1), ceil_mode=True, count_include_pad=True), [x]),
        "avgpool_excl": ("avgpool", dict(kernel=(3, 3, 2), strides=(1, 2, 2), pads=(1, 1, 1, 1, 0, 1), ceil_mode=False, count_include_pad=False), [x]),
        "concat": ("concat", {}, [x, _r(2, 1, 5, 7, 9), _r(2, 3, 5, 7, 9)]),
        "add_pair": ("add", {}, [x, _r(2, 6, 5, 7, 9)]),
        "mul_broadcast": ("mul", {}, [_r(2, 1, 5, 7, 9), x]),
        "slice": ("slice", dict(slices=((0, 2, 1), (5, 0, -2), (1, 5, 1), (0, 7, 3), (8, 1, -3))), [x]),
        "slice_channels": ("slice", dict(slices=((1, 2, 1), (1, 6, 2), (0, 5, 1), (2, 7, 1), (0, 9, 2))), [x]),
        "instance_norm": ("instance_norm", dict(scale=_r(6), bias=_r(6), epsilon=1e-5), [x * 3 + 5]),
        "group_norm": ("group_norm", dict(groups=3, scale=_r(6), bias=_r(6), epsilon=1e-5), [x - 2]),
        "batch_norm": ("batch_norm", dict(scale=_r(6), bias=_r(6), mean=_r(6), var=np.abs(_r(6)) + 0.5, epsilon=1e-5), [x]),
        "relu": ("relu", {}, [x]),
        "leaky_relu": ("leaky_relu", dict(alpha=0.2), [x]),
        "prelu_scalar": ("prelu", dict(slope=np.array([0.3], np.float32)), [x]),
        "prelu_channels": ("prelu", dict(slope=_r(6)), [x]),
        "elu": ("elu", dict(alpha=0.7), [x]),
        "selu": ("selu", {}, [x]),
        "sigmoid": ("sigmoid", {}, [x * 4]),
        "tanh": ("tanh", {}, [x]),
        "softmax": ("softmax", {}, [x * 3]),
        "clip": ("clip", {"min": -0.5, "max": 0.7}, [x]),
        "clip_open": ("clip", {"min": None, "max": 0.2}, [x]),
        "clip_crossed": ("clip", {"min": 0.5, "max": -0.5}, [x]),
        "identity": ("identity", {}, [x]),
    }  # fmt: skip
    for op in ("add", "sub", "mul", "div"):
        for first in (False, True):
            k = _r(6, 1, 1, 1) + 3 if op == "div" else _r(6, 1, 1, 1)
            c[f"{op}_const_{'first' if first else 'last'}"] = (
                op, {"constant": k, "constant_first": first}, [x]
            )  # fmt: skip
        c[f"{op}_scalar"] = (op, {"constant": np.float32(1.5), "constant_first": True}, [x])
    for mode in ("constant", "reflect", "edge"):
        c[f"pad_{mode}"] = ("pad", dict(pads=(2, 0, -1, 1, 3, 2), mode=mode, value=0.25), [x])
    for t in TRANSFORMS:
        c[f"linear_{t}_up"] = ("resize", _resize((9, 14, 20), "linear", t), [x])
        c[f"linear_{t}_down"] = ("resize", _resize((3, 4, 5), "linear", t), [x])
        c[f"linear_{t}_scales"] = (
            "resize",
            _resize((10, 10, 18), "linear", t, scales=(2.0, 1.5, 2.0)),
            [x],
        )
        for nm in NEAREST:
            c[f"nearest_{t}_{nm}"] = ("resize", _resize((9, 4, 18), "nearest", t, nm), [x])
    return c


CASES = _cases()


def cpu(op: str, p: dict, xs: list[np.ndarray]) -> np.ndarray:
    """The CPU graph_ops result, with the executor's own parameter plumbing."""
    if op == "conv":
        return g.conv3d(xs[0], p["weight"], p["bias"], strides=p["strides"], pads=p["pads"],
                        dilations=p["dilations"], groups=p["group"])  # fmt: skip
    return KERNELS.get(op)(p, *xs)


@pytest.fixture
def device_for() -> Callable[[int], HostDevice]:
    made: list[HostDevice] = []

    def make(cap: int = 2**28) -> HostDevice:
        made.append(HostDevice(cap, jitter_s=0.0002))
        return made[-1]

    yield make
    for dev in made:
        dev.close()


def run_op(device: HostDevice, op: str, p: dict, xs: list[np.ndarray]) -> tuple[np.ndarray, int]:
    """The op on device-resident inputs through DeviceGraphOps: (host result, the output
    channel chunks it ran in); every device array freed afterwards."""
    ops = DeviceGraphOps(device)
    dx = [ops.to_device(x) for x in xs]
    try:
        y = ops.run(op, "node", p, dx)
        got = np.array(y, np.float32)
        ops.free(y)
        return got, ops.log[-1][1]
    finally:
        ops.free(*dx)
        ops.close()
        release_conv_caches(device)


def _whole_peak(op: str, p: dict, xs: list[np.ndarray]) -> int:
    """Device bytes at the peak of the op run whole (inputs and parameters included)."""
    dev = HostDevice(2**30)
    try:
        assert run_op(dev, op, p, xs)[1] == 1
        return dev.peak_bytes
    finally:
        dev.close()


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_op_matches_the_cpu_kernel(device_for, name):
    op, p, xs = CASES[name]
    dev = device_for()
    got, chunks = run_op(dev, op, p, xs)
    assert close(got, cpu(op, p, xs))
    assert chunks == 1 and dev.in_use_bytes == 0 and dev.peak_bytes <= dev.memory_cap_bytes


SPLITTABLE = [
    "conv_strided", "conv_grouped", "conv_depthwise", "convt_up", "convt_general", "maxpool",
    "avgpool_incl", "concat", "add_pair", "mul_broadcast", "add_const_first", "div_const_last",
    "slice", "slice_channels", "pad_reflect", "instance_norm", "group_norm", "batch_norm",
    "prelu_channels", "elu", "clip", "linear_half_pixel_up", "nearest_asymmetric_floor",
]  # fmt: skip


@pytest.mark.parametrize("name", SPLITTABLE)
def test_a_small_cap_splits_along_channels_and_still_agrees(device_for, name):
    op, p, xs = CASES[name]
    cap = _whole_peak(op, p, xs) - 1
    dev = device_for(cap)
    got, chunks = run_op(dev, op, p, xs)
    assert close(got, cpu(op, p, xs))
    assert chunks >= 2 and dev.in_use_bytes == 0 and 0 < dev.peak_bytes <= cap


@pytest.mark.parametrize("name", ["softmax"])
def test_an_op_that_cannot_be_split_names_op_shape_and_cap(device_for, name):
    op, p, xs = CASES[name]
    xs = [x[:1] for x in xs]
    cap = _whole_peak(op, p, xs) - 1
    dev = device_for(cap)
    with pytest.raises(DeviceOutOfMemory, match=rf"'{op}' on input \(1, 6, 5, 7, 9\).* {cap}-byte"):
        run_op(dev, op, p, xs)
    assert dev.in_use_bytes == 0


def test_bad_parameters_are_refused_before_any_work(device_for):
    dev = device_for()
    x = _r(1, 4, 5, 5, 5)
    with pytest.raises(ValueError, match="mode must be one of"):
        run_op(dev, "resize", _resize((6, 6, 6), "cubic", "half_pixel"), [x])
    with pytest.raises(ValueError, match="num_groups=3"):
        run_op(dev, "group_norm", dict(groups=3, scale=None, bias=None, epsilon=1e-5), [x])
    with pytest.raises(ValueError, match="no kernel for graph op 'gelu'"):
        run_op(dev, "gelu", {}, [x])
    assert not dev.log and dev.in_use_bytes == 0


@pytest.mark.parametrize("name", sorted(n for n in CASES if CASES[n][0] != "identity"))
def test_workspace_model_bounds_the_kernels_temporaries(name):
    """The numpy kernel's traced peak (its result included) stays within the model."""
    op, p, xs = CASES[name]
    shapes = [x.shape for x in xs]
    out = out_shape(op, p, shapes)
    model = workspace_bytes(op, p, sum(x.nbytes for x in xs), out, shapes)
    tracemalloc.start()
    try:
        XP_KERNELS[op](np, p, *xs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= model, f"{name}: traced {peak} bytes > model {model}"
