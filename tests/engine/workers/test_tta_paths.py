"""Test-time flips (`--tta`) on the two execution paths tests/engine/workers/test_tta.py
does not run: blocks as tasks on a real Dask LocalCluster (`--scheduler local:2`) are
bit-identical to the local run with the same flips (windowed and exact ONNX models, a
sequential MPF network), and the CPU-GPU pipeline on the host-backed stand-in GPU
(`ZNNI_GPU_STANDIN=1`, `--device cpu-gpu`) equals the CPU run. Every test also checks
that the flips changed the output, so a path that drops `--tta` fails."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import zarr
from support.engine_ref import small_network, write_network, write_volume
from support.naive import close

from znni.cli import main
from znni.engine.job import SegmentJob
from znni.engine.segment import segment
from znni.engine.workers.base import TRACE_ENV
from znni.model.loading import load_model

SHAPE, CHUNKS = (20, 40, 36), (8, 16, 16)  # 3 x 3 x 3 blocks of one chunk each
GRAPH_WINDOWS = {"basicunet": (16, 32, 32), "validunet": None}  # validunet: exact tiles


@pytest.fixture(scope="module")
def volume(tmp_path_factory) -> str:
    vol = np.random.default_rng(12).integers(0, 256, size=SHAPE).astype(np.uint8)
    return write_volume(tmp_path_factory.mktemp("tta-paths") / "in.zarr", vol, 3, CHUNKS)


@pytest.fixture(scope="module")
def sequential(tmp_path_factory) -> Path:
    layers, params = small_network(np.random.default_rng(13))  # maxpool (2, 1, 2): MPF
    return write_network(tmp_path_factory.mktemp("tta-seq"), layers, params, scale=1 / 255)


def _model_args(kind: str, tmp_path: Path, request, sequential: Path) -> list[str]:
    """The network and its options on `znni segment`'s command line (an ONNX model only
    where torch and onnx are there to export it: the `onnx_models` fixture skips)."""
    if kind == "sequential":
        return [str(sequential)]
    onnx_models = request.getfixturevalue("onnx_models")
    args = [str(onnx_models.copy(kind, tmp_path / f"{kind}.onnx")), "--scale", str(1 / 255)]
    window = GRAPH_WINDOWS[kind]
    return args + (["--window", ",".join(map(str, window)), "--overlap", "0.25"] if window
                   else [])


def _traced_run(tmp_path: Path, monkeypatch, args: list[str], volume: str, name: str,
                *extra: str) -> tuple[np.ndarray, list[tuple[int, str]]]:
    """`znni segment` of `volume` into tmp_path/name: its output and the (pid, block) lines the
    workers traced (engine/workers/base.trace_block)."""
    trace = tmp_path / f"{name}.trace"
    monkeypatch.setenv(TRACE_ENV, str(trace))  # before a LocalCluster spawns its workers
    out = tmp_path / name
    assert main(["segment", args[0], volume, str(out), *args[1:], "--chunks",
                 ",".join(map(str, CHUNKS)), "--block", ",".join(map(str, CHUNKS)),
                 "--quiet", *extra]) == 0
    lines = [line.split() for line in trace.read_text().splitlines()]
    return zarr.open_array(str(out), mode="r")[...], [(int(p), key) for p, key in lines]


@pytest.mark.parametrize("kind", ["basicunet", "validunet", "sequential"])
def test_dask_local_cluster_with_flips_is_bitwise_the_local_run(
        tmp_path, monkeypatch, request, volume, sequential, kind) -> None:
    """Windows (and exact tiles, and MPF patches) with their flipped copies run in a fixed
    company whatever the blocks and workers, and FFTW plans by estimate here (conftest),
    so the workers' blocks are bit-identical to the local run's."""
    pytest.importorskip("distributed")
    monkeypatch.setenv("ZNNI_FFT_EFFORT", "FFTW_ESTIMATE")  # FFTW_MEASURE may round otherwise
    args = _model_args(kind, tmp_path, request, sequential)
    local, local_trace = _traced_run(tmp_path, monkeypatch, args, volume, "local.zarr",
                                     "--tta", "flips")
    dask, dask_trace = _traced_run(tmp_path, monkeypatch, args, volume, "dask.zarr",
                                   "--tta", "flips", "--scheduler", "local:2")
    plain, _ = _traced_run(tmp_path, monkeypatch, args, volume, "plain.zarr")
    blocks = {key for _, key in local_trace}
    assert len(blocks) == 27 and {key for _, key in dask_trace} == blocks
    assert os.getpid() not in {pid for pid, _ in dask_trace}  # every block on a Dask worker
    assert np.array_equal(dask, local)
    assert not close(dask, plain)  # the flips reached the workers
    record = zarr.open_array(str(tmp_path / "dask.zarr"), mode="r").attrs["znni"]
    assert record["tta"] == "flips"
    if kind != "sequential":
        assert record["plan"]["flips"] == 8


@pytest.mark.parametrize("kind", ["sequential", "basicunet"])
def test_standin_cpu_gpu_with_flips_equals_the_cpu(tmp_path, monkeypatch, request, volume,
                                                   sequential, kind) -> None:
    """`--device cpu-gpu --tta flips:zx` on the stand-in GPU: a sequential network through
    the CPU-GPU pipeline (layers up to the split on the CPU, the rest on the device, each
    patch's four copies one after another), a windowed ONNX model with every window on
    the device; both equal the CPU run with the same flips within docs/design.md's
    tolerance, and the flips ran on the device (4x its unflipped work)."""
    monkeypatch.setenv("ZNNI_GPU_STANDIN", "1")
    if kind == "sequential":
        model, window = load_model(sequential), None
    else:
        path = request.getfixturevalue("onnx_models").path(kind)
        model, window = load_model(path, scale=1 / 255), GRAPH_WINDOWS[kind]
    outs, reports = {}, {}
    for device, tta in (("cpu", "flips:zx"), ("cpu-gpu", "flips:zx"), ("cpu-gpu", None)):
        out = tmp_path / f"{device}-{tta}.zarr"
        reports[device, tta] = segment(SegmentJob(model, volume, str(out), chunks=CHUNKS,
                                                  block=CHUNKS, window=window, device=device,
                                                  tta=tta))
        outs[device, tta] = zarr.open_array(str(out), mode="r")[...]
    flipped, plan = outs["cpu-gpu", "flips:zx"], reports["cpu-gpu", "flips:zx"].plan
    assert close(flipped, outs["cpu", "flips:zx"])
    assert not close(flipped, outs["cpu-gpu", None])  # the flips changed the output
    ran = plan["device_ran"]
    assert ran["device"] == "host-standin" and not ran["fallbacks"]
    unflipped = reports["cpu-gpu", None].plan
    if kind == "sequential":
        assert plan["algorithm"] == "cpu-gpu" and 0 < plan["split_op"] < len(model.ops)
        # every patch's four copies through the device's layers: 4x the unflipped calls
        assert sum(ran["convs"].values()) == 4 * sum(unflipped["device_ran"]["convs"].values())
    else:
        assert plan["flips"] == 4 and unflipped["flips"] == 1
        # four copies a window in batches of plan["batch"] items (the plan may batch more)
        calls = sum(ran["convs"].values()) / sum(unflipped["device_ran"]["convs"].values())
        assert calls == pytest.approx(4 * unflipped["batch"] / plan["batch"])
