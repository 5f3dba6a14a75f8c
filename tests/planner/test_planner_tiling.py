"""The memory model through CpuBackend's overlap-save tiled FFT path: the planner asks the
backend's own tiling model, and the replayed peak matches tracemalloc of a real run."""

from __future__ import annotations

from dataclasses import replace
from math import prod

import pytest
from support.planner_nets import traced_peak_bytes

from znni.model.network import LayerShape, network_shapes_only
from znni.planner.costs import conv_work, cpu_conv_work
from znni.planner.hostsim import replay_pass
from znni.planner.memory import layer_memory
from znni.planner.tiles import fft_tiles, tile_geometry, tiled_layer

pytest.importorskip("pyfftw")

LAYERS = [
    {"kind": "conv", "out_channels": 8, "kernel": [3, 3, 2]},
    {"kind": "relu"},
    {"kind": "conv", "out_channels": 6, "kernel": [3, 3, 3]},
]


def padded_input_bytes(layer: LayerShape, m: int) -> int:
    """Bytes of the input zero-padded to whole tiles (0 when whole tiles cover it exactly):
    nonzero means the last tiles run past the input and CpuBackend fills them with zeros."""
    counts, t_out, t_in = tile_geometry(layer, m)
    need = tuple(c * t + (ti - t) for c, t, ti in zip(counts, t_out, t_in, strict=True))
    if counts == (1, 1, 1) or need == layer.size_in:
        return 0
    return layer.batch_in * layer.channels_in * prod(need) * 4


SIZE = (27, 26, 25)  # odd, anisotropic: tiles do not cover the input exactly (padded split)


def _net():  # type: ignore[no-untyped-def]
    return network_shapes_only({"name": "tiled", "in_channels": 5, "layers": LAYERS})


@pytest.mark.parametrize("prim", ["fft-keep", "fft-recompute"])
def test_tiled_fft_peak_matches_tracemalloc(prim: str) -> None:
    from znni.primitives.cpu import CpuBackend

    net = _net()
    shapes = net.layer_shapes(SIZE)
    prims: list[str | None] = [prim if sh.kind == "conv" else None for sh in shapes]
    spectra = sum(layer_memory(sh, p).kept_bytes for sh, p in zip(shapes, prims, strict=True))
    convs = [sh for sh in shapes if sh.kind == "conv"]
    # the case under test really is tiled, with a zero-padded split
    assert all(fft_tiles(sh, prim, spectra) > 1 for sh in convs)
    assert all(padded_input_bytes(sh, fft_tiles(sh, prim, spectra)) > 0 for sh in convs)
    predicted = replay_pass(shapes, prims, threads=1, workspace_bytes=2**30,
                            spectra_bytes=spectra).peak_bytes
    untiled = sum(sh.in_bytes + sh.out_bytes for sh in shapes)
    backend = CpuBackend(threads=1, fft_effort="FFTW_ESTIMATE", spectra_cache_bytes=spectra,
                         workspace_bytes=2**30, persist_choices=False)
    measured = traced_peak_bytes(net, backend, prims, SIZE, seed=3)
    assert measured > untiled  # tiles, copies and workspaces really cost memory
    assert 0.85 <= predicted / measured <= 1.15, (predicted, measured)


def test_tiled_work_counts_the_tiles_and_copies() -> None:
    sh = next(s for s in _net().layer_shapes(SIZE) if s.kind == "conv")
    m = fft_tiles(sh, "fft-recompute", None)
    t = tiled_layer(sh, m)
    assert t.batch_in == sh.batch_in * m**3 and t.size_out == tuple(-(-o // m) for o in
                                                                       sh.size_out)
    whole, tiled = conv_work(sh, "fft-recompute"), cpu_conv_work(sh, "fft-recompute")
    # more, smaller transforms; pruned kernel transforms at the tile size; copies counted
    assert tiled.kernel_fft_flops < whole.kernel_fft_flops
    assert tiled.memory_bytes > whole.memory_bytes
    assert cpu_conv_work(sh, "direct") == conv_work(sh, "direct")


@pytest.mark.parametrize(
    ("s", "cin", "cout", "n", "k", "threads"),
    [(1, 1, 80, (60, 61, 62), (2, 2, 2), 2), (8, 80, 80, (29, 27, 31), (3, 3, 3), 2),
     (512, 80, 3, (5, 5, 5), (1, 1, 1), 2), (64, 40, 40, (17, 19, 18), (3, 2, 3), 1),
     (1, 300, 300, (40, 200, 250), (3, 3, 3), 2)],
)
def test_direct_bytes_closed_form_matches_backend(
    s: int, cin: int, cout: int, n: tuple[int, int, int], k: tuple[int, int, int], threads: int
) -> None:
    from znni.model.network import LayerShape
    from znni.planner.hostsim import direct_bytes
    from znni.primitives.cpu.direct_conv import direct_bytes as backend_bytes

    out = tuple(a - b + 1 for a, b in zip(n, k, strict=True))
    sh = LayerShape(0, "conv", s, cin, n, s, cout, out, k)  # type: ignore[arg-type]
    assert direct_bytes(sh, threads) == backend_bytes(s, cin, cout, n, k, threads)


def test_tiled_recompute_makes_each_spectrum_once_per_call() -> None:
    # n537's second conv: 8 fragments of 127^3, 80 -> 80 channels, 5^3 kernels; its tiles
    # fill many transform chunks, but CpuBackend makes the recomputed spectra once per call
    sh = LayerShape(3, "conv", 8, 80, (127, 127, 127), 8, 80, (123, 123, 123), (5, 5, 5))
    t = tiled_layer(sh, fft_tiles(sh, "fft-recompute", None))
    work = cpu_conv_work(sh, "fft-recompute")
    one_chunk = conv_work(t, "fft-recompute")
    assert work.kernel_fft_flops == one_chunk.kernel_fft_flops
    eight = cpu_conv_work(replace(sh, batch_in=64, batch_out=64), "fft-recompute")
    assert eight.kernel_fft_flops == work.kernel_fft_flops
    assert eight.fft_flops == pytest.approx(8 * work.fft_flops)


@pytest.mark.parametrize(
    ("s", "out", "n", "depth", "slab"),
    [(512, (5, 5, 5), (9, 9, 9), 10000, 2**23), (1, (62, 62, 62), (64, 64, 64), 1080, 2**23),
     (3, (7, 9, 11), (9, 13, 14), 50, 20000), (2, (30, 31, 29), (33, 33, 33), 300, 1)],
)
def test_direct_computed_columns_closed_form_matches_blocks(s, out, n, depth, slab) -> None:
    # what the direct-conv cost counts: every position its GEMMs compute, block by block
    from znni.primitives.cpu.direct_conv import (
        _blocks,
        block_columns,
        block_shape,
        computed_columns,
    )

    blocks = _blocks(s, out, n, depth, slab, 2)
    listed = sum(block_columns(b[2] - b[1], b[4] - b[3], n[1], n[2], out[2]) for b in blocks)
    assert computed_columns(s, out, n, *block_shape(s, out, n, depth, slab, 2)) == (
        listed, len(blocks))
    assert listed >= s * prod(out)  # dropped positions between valid outputs count too
