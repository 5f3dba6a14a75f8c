"""The pinned host buffer pool: reuse after the caller drops a buffer, bounded bytes."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from znni.primitives.gpu.device import HostDevice
from znni.primitives.gpu.pinned_pool import MIN_BLOCK_BYTES, PinnedPool, block_size


def test_block_sizes_are_powers_of_two_from_64_kib():
    assert block_size(1) == MIN_BLOCK_BYTES
    assert block_size(MIN_BLOCK_BYTES + 1) == 2 * MIN_BLOCK_BYTES
    assert block_size(3 << 20) == 4 << 20


def test_a_dropped_buffer_is_reused_not_pinned_again():
    pool = PinnedPool(bytearray, 1 << 22)
    a = pool.take((10, 20), np.float32)
    a[...] = 1.0
    del a
    gc.collect()
    b = pool.take((20, 10), np.float32)
    assert b.shape == (20, 10) and b.dtype == np.float32
    assert pool.allocations == 1 and pool.reuses == 1
    assert pool.held_bytes == MIN_BLOCK_BYTES


def test_a_view_keeps_its_block_in_use():
    pool = PinnedPool(bytearray, 1 << 22)
    a = pool.take((1000,), np.float32)
    view = a[10:].reshape(-1, 10)
    del a
    gc.collect()
    second = pool.take((1000,), np.float32)  # the first block is in use through `view`
    assert pool.allocations == 2 and pool.reuses == 0
    del view
    gc.collect()
    assert pool.idle_bytes() == MIN_BLOCK_BYTES and second.base is not None


def test_the_pool_is_bounded_in_bytes():
    pool = PinnedPool(bytearray, 2 * MIN_BLOCK_BYTES)
    held = [pool.take((100,), np.uint8) for _ in range(3)]
    assert pool.held_bytes == 2 * MIN_BLOCK_BYTES and pool.overflows == 1
    del held
    gc.collect()
    assert pool.idle_bytes() == 2 * MIN_BLOCK_BYTES  # the unpooled one is simply freed
    big = pool.take((2 * MIN_BLOCK_BYTES,), np.uint8)  # idle small blocks make room
    assert pool.held_bytes == 2 * MIN_BLOCK_BYTES and pool.overflows == 1
    del big
    gc.collect()
    pool.clear()
    assert pool.held_bytes == 0 and pool.idle_bytes() == 0


def test_a_negative_bound_is_refused():
    with pytest.raises(ValueError, match="-1"):
        PinnedPool(bytearray, -1)


def test_the_stand_in_device_hands_out_pooled_buffers():
    dev = HostDevice(2**20, pinned_bytes=1 << 20)
    buf = dev.pinned((4, 5), np.float32)
    buf[...] = 3.0
    assert dev.pinned_pool.held_bytes == MIN_BLOCK_BYTES
    dev.close()
