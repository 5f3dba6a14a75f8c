"""GpuBackend on the stand-in device: dense output vs brute force and the reference backend,
under memory caps that force sub-batches, with the streams' ordering checked from the log."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from support.gpu_helpers import net_layers, ops_from_layers, valid_size
from support.naive import close, naive_dense, naive_dense_at, random_network

from znni.primitives import ReferenceBackend, dense_forward
from znni.primitives.backends import make_backend
from znni.primitives.base import Activation, Conv
from znni.primitives.gpu.backend import GpuBackend
from znni.primitives.gpu.cupy_device import cuda_available
from znni.primitives.gpu.device import HostDevice
from znni.primitives.reference import conv3d_reference, maxpool_reference


@pytest.fixture
def device_factory():
    made = []

    def make(cap, jitter_s=0.0005, seed=0):
        dev = HostDevice(cap, jitter_s=jitter_s, seed=seed)
        made.append(dev)
        return dev

    yield make
    for dev in made:
        dev.close()


def launches(dev: HostDevice, prefix: str) -> int:
    """Compute launches of sub-batches whose tag starts with `prefix`, from the device log."""
    return sum(
        1
        for e in dev.log
        if e.phase == "issue" and e.kind == "launch" and e.tag.startswith(prefix) and "#" in e.tag
    )


@pytest.mark.parametrize("seed", range(8))
def test_random_networks_match_brute_force_and_reference(device_factory, seed):
    rng = np.random.default_rng(100 + seed)
    cin = int(rng.integers(1, 4))
    layers, params = random_network(rng, cin, max_pools=2)
    ops = ops_from_layers(layers, params)
    size = [valid_size(layers, int(rng.integers(1, 8)), d) for d in range(3)]
    x = rng.standard_normal((2, cin, *size)).astype(np.float32)
    dev = device_factory(2**28)
    backend = GpuBackend(dev)
    out = dense_forward(ops, x, backend)
    assert close(out, dense_forward(ops, x, ReferenceBackend()))
    positions = list(np.ndindex(*out.shape[2:]))[:20]
    for b in range(2):
        got = np.array([out[b, :, i, j, k] for i, j, k in positions])
        assert close(got, naive_dense_at(layers, params, x[b], positions))
    # only the conv parameters stay, kept for the next call
    assert dev.in_use_bytes == backend.kept.nbytes and dev.peak_bytes <= dev.memory_cap_bytes
    backend.kept.clear()
    assert dev.in_use_bytes == 0


@pytest.mark.parametrize(
    "primitive,cap",
    [("gpu-direct", 150_000), ("gemm", 150_000), ("fft-keep", 150_000), ("gpu-fft", 150_000)],
)
def test_memory_cap_forces_four_sub_batches_and_output_stays_exact(device_factory, primitive, cap):
    rng = np.random.default_rng(7)
    layers, params = net_layers(2, rng)
    ops = ops_from_layers(layers, params)
    size = [valid_size(layers, m, d) for d, m in enumerate((13, 19, 17))]
    x = rng.standard_normal((1, 2, *size)).astype(np.float32)
    dev = device_factory(cap)
    backend = GpuBackend(dev)
    out = dense_forward(ops, x, backend, [primitive] * len(ops))
    assert close(out[0], naive_dense(layers, params, x[0]))
    # Counted from the device's own log: the widest layer ran in >= 4 streamed sub-batches.
    counts = Counter()
    for e in dev.log:
        if e.phase == "issue" and e.kind == "launch" and "#" in e.tag:
            counts[e.tag.split("#")[0]] += 1
    assert max(counts.values()) >= 4, counts
    assert 0 < dev.peak_bytes <= cap
    assert dev.in_use_bytes == backend.kept.nbytes  # the last layer's parameters, kept


def test_large_cap_runs_the_whole_network_gpu_only_in_one_pass(device_factory):
    rng = np.random.default_rng(8)
    layers, params = net_layers(1, rng)
    ops = ops_from_layers(layers, params)
    size = [valid_size(layers, 12, d) for d in range(3)]
    x = rng.standard_normal((1, 1, *size)).astype(np.float32)
    dev = device_factory(2**30)
    backend = GpuBackend(dev)
    out = dense_forward(ops, x, backend)
    assert close(out, dense_forward(ops, x, ReferenceBackend()))
    h2d = [e for e in dev.log if e.phase == "issue" and e.kind == "h2d" and "#" in e.tag]
    assert len(h2d) == 1 and len(backend.sub_batches) == 1  # one upload, every op on device


def test_conv_too_big_for_one_sample_is_split_over_output_channels(device_factory):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, 3, 12, 11, 10)).astype(np.float32)
    w = rng.standard_normal((8, 3, 3, 3, 2)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)
    dev = device_factory(60_000)
    backend = GpuBackend(dev)
    out = backend.conv3d(x, w, b, Activation("elu"), "gpu-direct")
    ref = conv3d_reference(x, w, b)
    ref = np.where(ref > 0, ref, np.expm1(np.minimum(ref, 0)))
    assert close(out, ref)
    groups = {e.tag.split("#")[0] for e in dev.log if e.kind == "launch" and "#" in e.tag}
    assert len(groups) >= 2  # several output-channel groups, each its own streamed pass
    assert dev.peak_bytes <= 60_000


def test_mpf_and_maxpool_stream_by_sample_and_channel(device_factory):
    rng = np.random.default_rng(10)
    x = rng.standard_normal((3, 4, 9, 7, 11)).astype(np.float32)
    dev = device_factory(40_000)
    backend = GpuBackend(dev)
    assert np.array_equal(backend.mpf(x, (2, 2, 2)), ReferenceBackend().mpf(x, (2, 2, 2)))
    assert launches(dev, "mpf") >= 6
    assert np.array_equal(backend.maxpool(x, (2, 3, 2)), maxpool_reference(x, (2, 3, 2)))
    act = backend.activation(x.copy(), Activation("leaky_relu", 0.2))
    assert close(act, np.where(x > 0, x, 0.2 * x))
    assert dev.peak_bytes <= 40_000


def test_streams_overlap_upload_of_the_next_sub_batch_with_compute(device_factory):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((6, 2, 9, 9, 9)).astype(np.float32)
    w = rng.standard_normal((3, 2, 2, 2, 2)).astype(np.float32)
    dev = device_factory(40_000, jitter_s=0.002, seed=3)
    out = GpuBackend(dev).conv3d(x, w, np.zeros(3, np.float32), None, "gemm")
    assert close(out, conv3d_reference(x, w, np.zeros(3, np.float32)))
    n = launches(dev, "conv3d")
    assert n >= 4
    issue = {(e.kind, e.tag): e.seq for e in dev.log if e.phase == "issue"}
    start = {(e.kind, e.tag): e.seq for e in dev.log if e.phase == "start"}
    end = {(e.kind, e.tag): e.seq for e in dev.log if e.phase == "end"}
    tag = next(e.tag.split("#")[0] for e in dev.log if e.kind == "launch")
    for j in range(n):
        t = f"{tag}#{j}"
        # each sub-batch: uploaded, then computed, then downloaded
        assert end[("h2d", t)] < start[("launch", t)] < end[("launch", t)] < start[("d2h", t)]
        if j + 1 < n:  # the next upload is queued before this download: it overlaps compute j
            assert issue[("h2d", f"{tag}#{j + 1}")] < issue[("d2h", t)]
        if j >= 2:  # slot reuse: upload j waits for compute j-2 that read the same slot
            assert end[("launch", f"{tag}#{j - 2}")] < start[("h2d", t)]


def test_a_layer_that_cannot_fit_is_refused_with_the_cap_named(device_factory):
    x = np.zeros((1, 2, 20, 20, 20), np.float32)
    w = np.zeros((4, 2, 3, 3, 3), np.float32)
    backend = GpuBackend(device_factory(10_000))
    with pytest.raises(ValueError, match="10000-byte device memory cap"):
        backend.conv3d(x, w, np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="unknown GPU conv primitive"):
        backend.conv3d(x, w, np.zeros(4, np.float32), None, "winograd")


def test_stand_in_backend_is_registered_and_gpu_names_the_fix_without_cuda():
    backend = make_backend("gpu-standin", memory_cap_bytes=123_456)
    assert backend.name == "gpu-standin" and backend.device.memory_cap_bytes == 123_456
    backend.device.close()
    if cuda_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(ValueError, match=r"pip install 'znni\[gpu-cuda13\]'|no CUDA device"):
        make_backend("gpu")


def test_planner_primitive_names_are_accepted(device_factory):
    rng = np.random.default_rng(12)
    layers, params = net_layers(1, rng, widths=(2, 2, 1))
    ops = ops_from_layers(layers, params)
    size = [valid_size(layers, 10, d) for d in range(3)]
    x = rng.standard_normal((1, 1, *size)).astype(np.float32)
    prims = [
        ("gpu-fft" if i == 0 else "gpu-direct") if lay["kind"] == "conv" else None
        for i, lay in enumerate(layers)
    ]
    out = dense_forward(ops, x, GpuBackend(device_factory(2**26)), prims)
    assert close(out[0], naive_dense(layers, params, x[0]))


def test_conv_parameters_are_uploaded_once_per_run(device_factory):
    """A dense run calls the backend once per patch batch; the weights go up once."""
    rng = np.random.default_rng(9)
    layers, params = net_layers(2, rng)
    ops = ops_from_layers(layers, params)
    size = [valid_size(layers, 9, d) for d in range(3)]
    backend = GpuBackend(device_factory(2**28))
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal((1, 2, *size)).astype(np.float32)
        primitives = ["fft-keep" if isinstance(op, Conv) else None for op in ops]
        out = dense_forward(ops, x, backend, primitives)
        assert close(out, dense_forward(ops, x, ReferenceBackend()))
    assert backend.kept.uploads == sum(isinstance(op, Conv) for op in ops)
