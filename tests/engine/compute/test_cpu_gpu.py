"""The CPU-GPU pipeline over a multi-block volume: equal to CPU-only, failures surface, no hang."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from support.gpu_helpers import net_layers, ops_from_layers, valid_size
from support.naive import close, naive_dense, naive_fov

from znni.engine.compute.cpu_gpu import PipelineError, run_patches_cpu_gpu
from znni.primitives import ReferenceBackend, dense_forward
from znni.primitives.gpu.backend import GpuBackend
from znni.primitives.gpu.device import DeviceStreamError, HostDevice


@pytest.fixture(scope="module")
def net():
    rng = np.random.default_rng(21)
    layers, params = net_layers(2, rng)
    return layers, params, ops_from_layers(layers, params)


@pytest.fixture
def gpu():
    dev = HostDevice(200_000, jitter_s=0.0005, seed=5)
    yield GpuBackend(dev)
    dev.close()


def _blocks(layers, rng, n_blocks=(2, 2, 1)):
    """A volume cut into blocks of one patch each (output patch = P*j per axis)."""
    fov = naive_fov(layers)
    patch_in = [valid_size(layers, f, d) for d, f in enumerate(fov)]
    out = [n - f + 1 for n, f in zip(patch_in, fov)]
    shape = [o * nb + f - 1 for o, nb, f in zip(out, n_blocks, fov)]
    volume = rng.standard_normal((2, *shape)).astype(np.float32)
    starts = [
        (i * out[0], j * out[1], k * out[2])
        for i in range(n_blocks[0])
        for j in range(n_blocks[1])
        for k in range(n_blocks[2])
    ]
    return volume, patch_in, out, starts


def _patches(volume, patch_in, starts):
    for z, y, x in starts:
        yield volume[None, :, z : z + patch_in[0], y : y + patch_in[1], x : x + patch_in[2]]


@pytest.mark.parametrize("split_op", [0, 3, 5, 8])
def test_pipeline_equals_cpu_only_over_a_multi_block_volume(net, gpu, split_op):
    layers, params, ops = net
    rng = np.random.default_rng(split_op)
    volume, patch_in, out, starts = _blocks(layers, rng)
    cpu = ReferenceBackend()
    dense = np.zeros((3, *(s - f + 1 for s, f in zip(volume.shape[1:], naive_fov(layers)))))
    outs = list(run_patches_cpu_gpu(ops, _patches(volume, patch_in, starts), cpu, gpu, split_op))
    assert len(outs) == len(starts)
    for (z, y, x), o, p in zip(starts, outs, _patches(volume, patch_in, starts)):
        assert close(o, dense_forward(ops, p, cpu))  # CPU-only, patch by patch
        dense[:, z : z + out[0], y : y + out[1], x : x + out[2]] = o[0]
    if split_op == 3:  # the whole assembled volume against the brute-force network once
        assert close(dense, naive_dense(layers, params, volume))
    assert gpu.device.in_use_bytes == gpu.kept.nbytes  # conv parameters, kept for reuse


def _run_blocks(ops, patches, cpu, gpu, split_op, ledger):
    """A minimal block sweep: a block is marked done only once its output exists."""
    for i, y in enumerate(run_patches_cpu_gpu(ops, patches, cpu, gpu, split_op)):
        assert np.isfinite(y).all()
        ledger.append(i)


class _FailingCpu(ReferenceBackend):
    def __init__(self, fail_on_call: int, error: BaseException):
        self.calls, self.fail_on_call, self.error = 0, fail_on_call, error

    def mpf(self, x, window):
        self.calls += 1
        if self.calls == self.fail_on_call:
            raise self.error
        return super().mpf(x, window)


@pytest.mark.parametrize("error", [RuntimeError("disk on fire"), ValueError("bad patch")])
def test_cpu_stage_failure_surfaces_and_later_blocks_are_not_marked_done(net, gpu, error):
    layers, _, ops = net
    volume, patch_in, _, starts = _blocks(layers, np.random.default_rng(1))
    ledger: list[int] = []
    cpu = _FailingCpu(3, error)  # the third patch's CPU half fails
    expected = PipelineError if isinstance(error, RuntimeError) else ValueError
    with pytest.raises(expected, match=str(error)):
        _run_blocks(ops, _patches(volume, patch_in, starts), cpu, gpu, 5, ledger)
    assert ledger == [0, 1]
    assert _no_pipeline_threads()


def test_gpu_stage_failure_stops_the_cpu_stage(net):
    layers, _, ops = net
    volume, patch_in, _, starts = _blocks(layers, np.random.default_rng(2), (4, 2, 1))
    dev = HostDevice(200_000)
    gpu = GpuBackend(dev)
    calls = {"n": 0}
    real = gpu._chain

    def failing_chain(dops, params):
        compute = real(dops, params)

        def wrapped(j, din, dout, ws):
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("injected GPU fault")
            compute(j, din, dout, ws)

        return wrapped

    gpu._chain = failing_chain
    produced: list[int] = []

    def counted():
        for i, p in enumerate(_patches(volume, patch_in, starts)):
            produced.append(i)
            yield p

    ledger: list[int] = []
    try:
        with pytest.raises(DeviceStreamError, match="injected GPU fault"):
            _run_blocks(ops, counted(), ReferenceBackend(), gpu, 3, ledger)
    finally:
        dev.close()
    # Patch 0 finished; the patch whose GPU half failed was never reported, and the CPU
    # stage stopped soon after instead of running through all eight patches.
    assert ledger == [0]
    assert len(produced) < len(starts)
    assert _no_pipeline_threads()


def test_closing_the_iterator_early_stops_the_cpu_stage(net, gpu):
    layers, _, ops = net
    volume, patch_in, _, starts = _blocks(layers, np.random.default_rng(3), (3, 2, 1))
    it = run_patches_cpu_gpu(ops, _patches(volume, patch_in, starts), ReferenceBackend(), gpu, 2)
    next(it)
    it.close()
    assert _no_pipeline_threads()


def test_bad_split_op_is_refused(net, gpu):
    _, _, ops = net
    with pytest.raises(ValueError, match="split_op=99"):
        list(run_patches_cpu_gpu(ops, iter([]), ReferenceBackend(), gpu, 99))


def _no_pipeline_threads() -> bool:
    return not any(t.name == "znni-cpu-stage" and t.is_alive() for t in threading.enumerate())
