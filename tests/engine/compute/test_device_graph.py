"""Graph networks on device-resident tensors (the numpy stand-in device here): the graph
pass, windowed blocks blended on the device, exact tiles placed on the device; each
against the CPU path, under memory caps that force smaller batches and channel chunks,
with a forced allocation failure, and in reduced precision against fp32."""

from __future__ import annotations

from itertools import product

import numpy as np
import pytest
from support.naive import close

from znni.engine.compute.device_tiles import DeviceTiles
from znni.engine.compute.device_windows import DeviceWindows
from znni.engine.compute.graph_device import run_graph_device
from znni.engine.compute.graph_forward import run_graph
from znni.engine.compute.tiles import tile_output
from znni.engine.compute.windows import WindowGrid, blend_box, window_input
from znni.model.onnx_model import load_onnx_model
from znni.primitives.backends import make_backend
from znni.primitives.gpu.conv_dispatch import release_conv_caches
from znni.primitives.gpu.device import HostDevice
from znni.primitives.gpu.graph_device import DeviceGraphOps

CONVS = ("conv", "conv_transpose")
# bf16 keeps 8 mantissa bits (unit roundoff 2^-8 = 3.9e-3) and fp16 11 (4.9e-4); through
# BasicUNet's ~20 stored tensors, normalised between convs, the errors measured 1.2e-2 and
# 1.5e-3 of the output's range: the bounds allow about 3x that.
REDUCED_BOUND = {"fp16": 5e-3, "bf16": 4e-2}


def _ops(device: HostDevice, precision: str = "fp32") -> DeviceGraphOps:
    return DeviceGraphOps(device, precision)


def _done(device: HostDevice, *closers) -> None:
    """Close what holds device memory; then nothing may stay counted."""
    for c in closers:
        c.close()
    release_conv_caches(device)
    assert device.in_use_bytes == 0
    device.close()


def _graph(onnx_models, name: str):
    model = load_onnx_model(onnx_models.path(name))
    return model, model.graph(onnx_models.window(name))


@pytest.mark.parametrize("name", ["basicunet", "unet", "validunet"])
@pytest.mark.parametrize("primitive", ["gemm-loop", "cudnn", "cufft"])
def test_graph_on_the_device_equals_the_cpu(onnx_models, name, primitive) -> None:
    _, graph = _graph(onnx_models, name)
    n = 1 if name == "validunet" else 2  # its exported crop slices a batch of one
    x = np.random.default_rng(0).standard_normal((n, 1, *graph.window)).astype(np.float32)
    want = run_graph(graph, x, make_backend("cpu"))
    device = HostDevice(2**30)
    ops = _ops(device)
    prims = {n.name: primitive for n in graph.nodes if n.op in CONVS}
    xd = ops.to_device(x)
    y = run_graph_device(graph, xd, ops, prims)
    assert close(np.asarray(y), want)
    ops.free(y, xd)
    _done(device, ops)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_reduced_precision_is_within_its_bound(onnx_models, precision) -> None:
    _, graph = _graph(onnx_models, "basicunet")
    x = np.random.default_rng(1).standard_normal((1, 1, *graph.window)).astype(np.float32)
    want = run_graph(graph, x, make_backend("cpu"))
    device = HostDevice(2**30)
    ops = _ops(device, precision)
    xd = ops.to_device(x)
    y = run_graph_device(graph, xd, ops, {})
    assert y.dtype == ops.dtype and y.dtype.itemsize == 2  # stored in 2 bytes
    err = np.abs(np.asarray(y, np.float32) - want).max() / np.abs(want).max()
    assert 0 < err <= REDUCED_BOUND[precision]
    ops.free(y, xd)
    _done(device, ops)


def _windowed(onnx_models):
    model, graph = _graph(onnx_models, "basicunet")
    vol = np.random.default_rng(2).standard_normal((1, 30, 50, 44)).astype(np.float32)
    grid = WindowGrid.for_volume(vol.shape[1:], graph.window, 0.25)
    cpu = make_backend("cpu")

    def host(lo, hi):
        def run(s):
            return run_graph(graph, window_input(vol, (0, 0, 0), s, grid)[None], cpu)[0]

        return blend_box(grid, lo, hi, run, "gaussian", graph.out_channels)

    return graph, vol, grid, host


BOXES = [((0, 0, 0), (15, 25, 44)), ((15, 0, 0), (30, 25, 44)), ((0, 25, 0), (30, 50, 44))]


@pytest.mark.parametrize("batch, kept_bytes", [(1, 0), (2, 8 * 2**20), (4, 2**20)])
def test_windowed_blocks_blend_on_the_device_as_the_host_does(onnx_models, batch,
                                                               kept_bytes) -> None:
    graph, vol, grid, host = _windowed(onnx_models)
    device = HostDevice(2**30, jitter_s=0.002)
    ops = _ops(device)
    run = DeviceWindows(ops, graph, grid, "gaussian", {}, batch, kept_bytes)
    for lo, hi in BOXES:
        assert close(run.block(vol, (0, 0, 0), lo, hi), host(lo, hi))
    assert run.shrinks == [] and device.in_use_bytes > 0  # kept windows, slots, weights
    _done(device, run, ops)


def test_a_small_cap_shrinks_the_batch_and_splits_channels(onnx_models) -> None:
    graph, vol, grid, host = _windowed(onnx_models)
    device = HostDevice(6_000_000)
    ops = _ops(device)
    run = DeviceWindows(ops, graph, grid, "gaussian", {}, 4, 2**20)
    lo, hi = BOXES[0]
    assert close(run.block(vol, (0, 0, 0), lo, hi), host(lo, hi))
    assert run.shrinks == [2, 1]  # four and two windows did not fit
    assert max(n for _, n in ops.log) >= 2  # and some op ran in channel chunks
    assert device.peak_bytes <= 6_000_000
    _done(device, run, ops)


@pytest.mark.parametrize("fail_at", [5, 40, 200])
def test_an_allocation_failure_shrinks_and_succeeds(onnx_models, fail_at) -> None:
    graph, vol, grid, host = _windowed(onnx_models)
    device = HostDevice(2**30, fail_at=fail_at)
    ops = _ops(device)
    run = DeviceWindows(ops, graph, grid, "gaussian", {}, 4, 2**20)
    lo, hi = BOXES[1]
    assert close(run.block(vol, (0, 0, 0), lo, hi), host(lo, hi))
    assert device.reservations > fail_at  # it failed, and the run went on
    # recovered by a smaller batch, or (inside an op) by output channel chunks
    assert run.shrinks == [2] or max(n for _, n in ops.log) >= 2
    _done(device, run, ops)


def test_a_window_that_never_fits_is_one_sentence(onnx_models) -> None:
    graph, vol, grid, _ = _windowed(onnx_models)
    device = HostDevice(1_000_000)
    ops = _ops(device)
    run = DeviceWindows(ops, graph, grid, "gaussian", {}, 2, 0)
    with pytest.raises(ValueError, match="1000000-byte device memory cap"):
        run.block(vol, (0, 0, 0), *BOXES[0])
    _done(device, run, ops)


def test_uploads_are_queued_while_batches_compute(onnx_models) -> None:
    """The host never waits for a batch's compute before queueing the next batch's upload
    on the copy stream (it waits only to reuse a pinned buffer): the upload of batch k + 1
    is issued before batch k's compute has ended, and the device runs it then."""
    graph, vol, grid, _ = _windowed(onnx_models)
    device = HostDevice(2**30, jitter_s=0.002)
    ops = _ops(device)
    run = DeviceWindows(ops, graph, grid, "gaussian", {}, 1, 0)
    run.block(vol, (0, 0, 0), (0, 0, 0), (30, 50, 44))
    uploads = [e.seq for e in device.log if e.kind == "h2d" and e.phase == "issue"]
    ends = [e.seq for e in device.log
            if e.kind == "launch" and e.tag == "windows" and e.phase == "end"]
    assert len(uploads) == len(ends) == grid.num_windows >= 8
    ahead = sum(uploads[k + 1] < ends[k] for k in range(len(ends) - 1))
    assert ahead >= len(ends) // 2
    _done(device, run, ops)


@pytest.mark.parametrize("batch, cap", [(1, 2**30), (4, 2**30), (4, 1_500_000)])
def test_exact_tiles_on_the_device_equal_the_host_tiles(onnx_models, batch, cap) -> None:
    model, _ = _graph(onnx_models, "validunet")
    tile = (12, 24, 24)
    graph, out = model.graph(tile), tile_output(model, tile)
    starts = [[0, 3], [0, 4, 8], [0, 6]]  # overlapping tiles on the (1, 2, 2) grid
    extent = [s[-1] + o for s, o in zip(starts, out)]
    x = np.random.default_rng(4).random((1, *[e + t - o for e, t, o in
                                               zip(extent, tile, out)]), np.float32)
    want = np.empty((graph.out_channels, *extent), np.float32)
    cpu = make_backend("cpu")
    for p in product(*starts):
        src = tuple(slice(p[a], p[a] + tile[a]) for a in range(3))
        dst = tuple(slice(p[a], p[a] + out[a]) for a in range(3))
        want[(slice(None), *dst)] = run_graph(graph, x[(slice(None), *src)][None], cpu)[0]
    keep = (slice(1, extent[0]), slice(2, extent[1] - 1), slice(0, extent[2]))
    device = HostDevice(cap)
    ops = _ops(device)
    run = DeviceTiles(ops, graph, tile, out, {}, batch)
    assert close(run.block(x, starts, keep), want[(slice(None), *keep)])
    assert (run.shrinks != []) == (cap < 2**30)
    _done(device, run, ops)
