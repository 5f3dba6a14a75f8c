"""`SlabInput`: a block input whose z rows arrive in order, and where its slabs are cut."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from znni.engine.slab_input import SlabInput, slab_rows


def _naive_slabs(lo: int, hi: int, step: int) -> list[tuple[int, int]]:
    """Consecutive rows with the same chunk row z // step, as [z0, z1) relative to lo."""
    out: list[list[int]] = []
    for z in range(lo, hi):
        if out and (z - 1) // step == z // step:
            out[-1][1] = z + 1 - lo
        else:
            out.append([z - lo, z + 1 - lo])
    return [(a, b) for a, b in out]


@pytest.mark.parametrize("lo,hi,step", [(0, 22, 6), (5, 23, 6), (6, 12, 6), (7, 8, 32),
                                        (0, 160, 32), (3, 40, 1), (31, 97, 32)])
def test_slabs_are_the_chunk_rows_of_the_box(lo, hi, step) -> None:
    assert slab_rows(lo, hi, step) == _naive_slabs(lo, hi, step)


@pytest.mark.parametrize("lo,hi,step", [(0, 10, 0), (4, 4, 2), (5, 3, 2)])
def test_bad_slab_arguments_are_refused(lo, hi, step) -> None:
    with pytest.raises(ValueError, match="step"):
        slab_rows(lo, hi, step)


def test_rows_are_handed_over_as_their_slabs_arrive() -> None:
    data = np.arange(2 * 10 * 3 * 4, dtype=np.float32).reshape(2, 10, 3, 4)
    gates = [threading.Event() for _ in range(3)]
    slabs = SlabInput(data.shape)

    def read(z0: int, z1: int) -> np.ndarray:
        assert gates[[0, 4, 8].index(z0)].wait(10)
        return data[:, z0:z1]

    filler = threading.Thread(target=slabs.fill, args=([(0, 4), (4, 8), (8, 10)], read))
    filler.start()
    got = []
    waiter = threading.Thread(target=lambda: got.append(slabs.wait_rows(6).copy()))
    waiter.start()
    gates[0].set()
    waiter.join(0.3)
    assert waiter.is_alive()  # rows 4-5 are not in yet
    gates[1].set()
    waiter.join(10)
    assert not waiter.is_alive() and np.array_equal(got[0][:, :8], data[:, :8])
    gates[2].set()
    filler.join(10)
    assert np.array_equal(slabs.wait_rows(10), data) and slabs.waited_s > 0.2


def test_a_failed_fill_reaches_the_waiting_worker() -> None:
    slabs = SlabInput((1, 6, 2, 2))

    def read(z0: int, z1: int) -> np.ndarray:
        if z0 >= 3:
            raise ValueError("input s3://b/in.zarr is not readable (test)")
        return np.ones((1, z1 - z0, 2, 2), np.float32)

    with pytest.raises(ValueError, match="not readable"):
        slabs.fill([(0, 3), (3, 6)], read)
    assert slabs.wait_rows(3).shape == (1, 6, 2, 2)  # the rows that arrived
    with pytest.raises(ValueError, match="not readable"):
        slabs.wait_rows(4)
