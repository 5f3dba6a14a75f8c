"""GPU kernels on the numpy array module vs scipy; the stand-in device's accounting and streams."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from support.naive import close, naive_conv

from znni.primitives.gpu.conv import direct_conv, direct_workspace_bytes
from znni.primitives.gpu.device import DeviceOutOfMemory, DeviceStreamError, HostDevice
from znni.primitives.gpu.fft_conv import (
    cufft_size,
    fft_conv,
    fft_shape,
    fft_workspace_bytes,
    kernel_spectra,
)
from znni.primitives.gpu.workspace import Workspace, WorkspaceOverflow

CASES = [  # (S, Cin, Cout, size, kernel)
    (1, 1, 1, (5, 5, 5), (1, 1, 1)),
    (2, 3, 4, (9, 8, 11), (3, 2, 4)),
    (3, 2, 5, (7, 13, 6), (5, 1, 3)),
    (1, 4, 2, (10, 10, 10), (7, 7, 7)),
]


def _case(rng, s, cin, cout, size, kernel):
    x = rng.standard_normal((s, cin, *size)).astype(np.float32)
    w = rng.standard_normal((cout, cin, *kernel)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    ref = np.stack([naive_conv(x[i], w, b) for i in range(s)])
    out = np.empty(ref.shape, np.float32)
    return x, w, b, ref, out


@pytest.mark.parametrize("case", CASES)
def test_direct_conv_matches_scipy_within_its_workspace_model(case):
    x, w, b, ref, out = _case(np.random.default_rng(1), *case)
    s, cin, cout, size, kernel = case
    ws = Workspace(direct_workspace_bytes(s, cin, cout, size, kernel), "direct")
    direct_conv(np, x, w, b, out, ws)
    assert close(out, ref)
    assert ws.in_use_bytes == 0 and ws.peak_bytes > 0


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("batch_bytes", [1, 3000, 2**24])  # 1: one image per cuFFT batch
def test_fft_conv_matches_scipy_within_its_workspace_model(case, keep, batch_bytes):
    x, w, b, ref, out = _case(np.random.default_rng(2), *case)
    s, cin, cout, size, kernel = case
    limit = fft_workspace_bytes(s, cin, cout, size, keep, batch_bytes)
    spectra = None
    if keep:
        spectra = kernel_spectra(np, w, fft_shape(size), batch_bytes, Workspace(2**30, "k"))
    ws = Workspace(limit, "fft")
    fft_conv(np, x, w, b, out, ws, batch_bytes, spectra)
    assert close(out, ref)
    assert ws.in_use_bytes == 0


def test_workspace_overflow_is_detected():
    x, w, b, _, out = _case(np.random.default_rng(3), 2, 3, 4, (9, 8, 11), (3, 2, 4))
    with pytest.raises(WorkspaceOverflow, match="reserved"):
        fft_conv(np, x, w, b, out, Workspace(1000, "fft"), 2**20)


def test_cufft_sizes_are_smooth_minimal_and_even_when_asked():
    for n in range(1, 300):
        m = cufft_size(n)
        assert m >= n
        r = m
        for p in (2, 3, 5, 7):
            while r % p == 0:
                r //= p
        assert r == 1
        assert all(not _smooth(k) for k in range(n, m))
        assert cufft_size(n, even=True) % 2 == 0
    assert cufft_size(11) == 12 and cufft_size(97) == 98


def _smooth(k: int) -> bool:
    for p in (2, 3, 5, 7):
        while k % p == 0:
            k //= p
    return k == 1


def test_host_device_accounts_allocations_and_refuses_past_the_cap():
    dev = HostDevice(1000)
    try:
        a = dev.alloc((100,))  # 400 bytes
        b = dev.alloc((100,))
        assert dev.in_use_bytes == 800
        with pytest.raises(DeviceOutOfMemory, match="cap"):
            dev.alloc((100,))
        dev.free(a)
        c = dev.alloc((50,))
        assert dev.in_use_bytes == 600 and dev.peak_bytes == 800
        dev.free(b, c)
        assert dev.in_use_bytes == 0
        with pytest.raises(ValueError):
            dev.free(np.empty(3))
    finally:
        dev.close()


def test_host_streams_run_in_order_and_events_order_across_streams():
    dev = HostDevice(10**6, jitter_s=0.002, seed=4)
    try:
        copy, comp = dev.stream("copy"), dev.stream("compute")
        src = np.arange(1000, dtype=np.float32)
        buf = dev.alloc((1000,))
        result = np.empty(1000, np.float32)
        for rep in range(5):
            dev.copy_to_device(buf, src + rep, copy, f"in{rep}")
            ev = dev.record(copy)
            dev.wait(comp, ev)
            dev.launch(comp, lambda: np.multiply(buf, 2, out=buf), f"k{rep}")
            done = dev.record(comp)
            dev.wait(copy, done)
            dev.copy_to_host(result, buf, copy, f"out{rep}")
            dev.host_wait(dev.record(copy))
            assert np.array_equal(result, 2 * (src + rep))
        dev.free(buf)
    finally:
        dev.close()


def test_a_failing_launch_surfaces_at_the_next_wait_and_later_work_is_skipped():
    dev = HostDevice(10**6)
    try:
        comp, copy = dev.stream("compute"), dev.stream("copy")
        ran = threading.Event()

        def boom():
            raise KeyError("injected")

        dev.launch(comp, boom, "bad")
        dev.launch(comp, ran.set, "after")
        dev.wait(copy, dev.record(comp))
        with pytest.raises(DeviceStreamError, match="injected"):
            dev.host_wait(dev.record(copy))
        with pytest.raises(DeviceStreamError, match="injected"):
            dev.synchronize()
        assert not ran.is_set()
        dev.synchronize()  # reported once; the device is usable again
    finally:
        dev.close()
