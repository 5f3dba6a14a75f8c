"""The memory model against what CpuBackend really allocates (tracemalloc counts numpy's
buffers), on small networks: every primitive, several channels, anisotropic kernels."""

from __future__ import annotations

import pytest
from support.planner_nets import traced_peak_bytes

from znni.model.network import Network, network_shapes_only
from znni.planner.hostsim import replay_pass
from znni.planner.memory import layer_memory

pytest.importorskip("pyfftw")

LAYERS = [
    {"kind": "conv", "out_channels": 6, "kernel": [3, 2, 3]},
    {"kind": "relu"},
    {"kind": "maxpool", "window": [2, 2, 2]},
    {"kind": "conv", "out_channels": 7, "kernel": [3, 3, 3]},
    {"kind": "tanh"},
    {"kind": "maxpool", "window": [2, 2, 2]},
    {"kind": "conv", "out_channels": 5, "kernel": [2, 2, 2]},
    {"kind": "relu"},
    {"kind": "conv", "out_channels": 3, "kernel": [1, 1, 1]},
]
CHOICES = [
    ("fft-recompute", "fft-recompute", "fft-recompute", "direct"),
    ("fft-keep", "fft-keep", "fft-keep", "fft-keep"),
    ("direct", "fft-keep", "direct", "fft-recompute"),
]


def _case(choice: tuple[str, ...]) -> tuple[Network, tuple[int, int, int], list[str | None]]:
    """The test network, its input for a 12^3 output, and `choice` as its convs' primitives."""
    net = network_shapes_only({"name": "t", "in_channels": 2, "layers": LAYERS})
    conv_ids = [i for i, op in enumerate(LAYERS) if op["kind"] == "conv"]
    prims: list[str | None] = [None] * len(LAYERS)
    for i, p in zip(conv_ids, choice, strict=True):
        prims[i] = p
    return net, net.input_size_for((12, 12, 12)), prims


@pytest.mark.parametrize("choice", CHOICES)
@pytest.mark.parametrize("workspace_bytes", [2**30, 2**21])
def test_replayed_peak_matches_tracemalloc(choice: tuple[str, ...], workspace_bytes: int) -> None:
    from znni.primitives.cpu import CpuBackend

    net, size, prims = _case(choice)
    shapes = net.layer_shapes(size)
    # one thread: concurrent task temporaries would make the measured peak timing-dependent
    predicted = replay_pass(shapes, prims, threads=1, workspace_bytes=workspace_bytes).peak_bytes
    # spectra bound: exactly what the keep layers need (the simulation's default)
    spectra_bytes = sum(layer_memory(sh, p).kept_bytes for sh, p in zip(shapes, prims,
                                                                      strict=True))
    backend = CpuBackend(threads=1, fft_effort="FFTW_ESTIMATE", spectra_cache_bytes=spectra_bytes,
                         workspace_bytes=workspace_bytes, persist_choices=False)
    measured = traced_peak_bytes(net, backend, prims, size, seed=1)
    # At these tiny shapes (a few MB) cached FFT workspaces weigh more than at patch scale,
    # where benchmarks/planner.py measures peak RSS within a few percent.
    assert 0.8 <= predicted / measured <= 1.2, (predicted, measured)


@pytest.mark.parametrize("choice", CHOICES)
def test_one_patch_alone_is_replayed_as_one(choice: tuple[str, ...]) -> None:
    """A run of a single patch (jobtime.one_patch_peak_bytes): no second patch meets the
    workspaces and spectra the first left cached; replayed and traced alike."""
    from znni.primitives.cpu import CpuBackend

    net, size, prims = _case(choice)
    shapes = net.layer_shapes(size)
    one, two = (replay_pass(shapes, prims, threads=1, patches=n).peak_bytes for n in (1, 2))
    assert one <= two
    spectra_bytes = sum(layer_memory(sh, p).kept_bytes for sh, p in zip(shapes, prims,
                                                                      strict=True))
    measured = traced_peak_bytes(net, CpuBackend(
        threads=1, fft_effort="FFTW_ESTIMATE", spectra_cache_bytes=spectra_bytes,
        persist_choices=False), prims, size, seed=1, patches=1)
    assert 0.8 <= one / measured <= 1.2, (one, measured)
