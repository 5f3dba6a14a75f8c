"""`--device`: CPU-GPU and GPU runs over multi-block volumes through the stand-in device,
and a clear refusal when no CUDA device is there."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from support.engine_ref import dense_volume, small_network, write_network, write_volume
from support.naive import close

from znni.cli import main
from znni.engine.context import StoreContext
from znni.engine.job import SegmentJob
from znni.engine.segment import check_and_plan, segment
from znni.model.network import load_network

CTX = StoreContext()  # store options (none) and caches for this module's calls


@pytest.fixture()
def setup(tmp_path: Path) -> dict:
    rng = np.random.default_rng(11)
    layers, params = small_network(rng)
    spec = write_network(tmp_path, layers, params, scale=1 / 255)
    vol = rng.integers(0, 256, size=(21, 26, 23)).astype(np.uint8)
    inp = write_volume(tmp_path / "in.zarr", vol, 3, (7, 9, 8))
    ref = dense_volume(layers, params, vol[None], "reflect", 1 / 255)
    return dict(tmp=tmp_path, spec=spec, inp=inp, ref=ref)


def _run(setup: dict, device: str, name: str) -> np.ndarray:
    net = load_network(setup["spec"])
    out = str(setup["tmp"] / name)
    job = SegmentJob(net, setup["inp"], out, device=device, chunks=(8, 8, 8), block=(8, 8, 8))
    report = segment(job)
    assert report.blocks_total >= 8
    assert report.plan is not None
    if device != "cpu":  # what ran on the device, by name: the stand-in has no cuDNN
        convs = report.plan["device_ran"]["convs"]
        assert convs and set(convs) <= {"gemm-loop", "cufft", "cufft-keep"}
    return zarr.open_array(out)[...]


@pytest.mark.parametrize("device", ["cpu-gpu", "gpu"])
def test_gpu_devices_on_standin_equal_cpu_and_reference(setup, monkeypatch, device) -> None:
    cpu = _run(setup, "cpu", "cpu.zarr")
    monkeypatch.setenv("ZNNI_GPU_STANDIN", "1")
    other = _run(setup, device, f"{device}.zarr")
    assert close(cpu, setup["ref"])
    assert close(other, cpu)


def test_cpu_gpu_plan_splits_between_devices(setup, monkeypatch) -> None:
    monkeypatch.setenv("ZNNI_GPU_STANDIN", "1")
    net = load_network(setup["spec"])
    plan = check_and_plan(SegmentJob(net, setup["inp"], str(setup["tmp"] / "o.zarr"), device="cpu-gpu"))
    assert plan.algorithm == "cpu-gpu"
    devices = [layer.device for layer in plan.layers]
    assert devices[0] == "cpu" and devices[-1] == "gpu"
    assert plan.split_op is not None and devices[plan.split_op - 1] == "cpu"
    assert devices[plan.split_op] == "gpu"


@pytest.mark.parametrize("device", ["gpu", "cpu-gpu"])
def test_gpu_device_without_cuda_is_one_sentence(setup, monkeypatch, capsys, device) -> None:
    try:
        import cupy  # noqa: F401

        pytest.skip("CuPy is installed here; the refusal is for machines without it")
    except ImportError:
        pass
    monkeypatch.delenv("ZNNI_GPU_STANDIN", raising=False)
    out = setup["tmp"] / "nogpu.zarr"
    rc = main(["segment", str(setup["spec"]), setup["inp"], str(out), "--device", device])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert "pip install 'znni[gpu-cuda13]'" in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_auto_device_falls_back_to_cpu_silently(setup, monkeypatch, capsys) -> None:
    monkeypatch.delenv("ZNNI_GPU_STANDIN", raising=False)
    out = setup["tmp"] / "auto.zarr"
    rc = main(["segment", str(setup["spec"]), setup["inp"], str(out), "--quiet"])
    assert rc == 0 and capsys.readouterr().err == ""
    assert close(zarr.open_array(str(out))[...], setup["ref"])


@pytest.mark.parametrize("batch", [2, 3])
def test_plan_batch_stacks_patches_and_equals_reference(setup, batch) -> None:
    """A plan with S > 1 runs S patches per dense pass; the output does not change."""
    import dataclasses

    net = load_network(setup["spec"])
    job = SegmentJob(net, setup["inp"], str(setup["tmp"] / f"b{batch}.zarr"),
                     chunks=(16, 16, 16), block=(16, 16, 16))
    plan = check_and_plan(job)
    small = net.input_size_for((4, 3, 4))
    plan = dataclasses.replace(plan, batch=batch, input_size=small,
                               output_size=net.output_size(small))
    report = segment(job, plan=plan)
    assert report.plan["batch"] == batch and report.blocks_total >= 4
    assert close(zarr.open_array(str(job.output_path))[...], setup["ref"])


@pytest.mark.parametrize("stage", ["cpu", "gpu"])
def test_failure_in_either_stage_marks_no_partial_block_and_resume_completes(
    setup, monkeypatch, stage
) -> None:
    """An error injected in the CPU or the GPU stage of a cpu-gpu run surfaces (no hang),
    the ledger lists only blocks that were written whole, and a rerun completes exactly."""
    from znni.engine.io.ledger import read_ledger
    from znni.primitives.cpu import CpuBackend
    from znni.primitives.gpu.backend import GpuBackend

    monkeypatch.setenv("ZNNI_GPU_STANDIN", "1")
    net = load_network(setup["spec"])
    out = str(setup["tmp"] / f"fail-{stage}.zarr")
    job = SegmentJob(net, setup["inp"], out, device="cpu-gpu", chunks=(8, 8, 8), block=(8, 8, 8))
    target = CpuBackend if stage == "cpu" else GpuBackend
    method = "conv3d" if stage == "cpu" else "run_ops"
    original = getattr(target, method)
    calls = {"n": 0}

    def failing(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 7:
            raise RuntimeError(f"injected {stage} failure")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(target, method, failing)
    with pytest.raises(Exception, match=f"injected {stage} failure"):
        segment(job)
    _, done = read_ledger(job.output_path, ctx=CTX)
    assert 0 < len(done) < 36  # some blocks finished before the failure, not all
    written = zarr.open_array(out)[...]
    for key in done:  # every block the ledger calls done holds its final values
        box = tuple(slice(*(int(v) for v in r.split(":"))) for r in key.split(","))
        assert close(written[(slice(None), *box)], setup["ref"][(slice(None), *box)])
    monkeypatch.setattr(target, method, original)
    report = segment(job)
    assert report.blocks_computed == report.blocks_total - len(done)
    assert close(zarr.open_array(out)[...], setup["ref"])


def test_plan_never_batches_more_patches_than_the_region_holds(setup) -> None:
    net = load_network(setup["spec"])
    plan = check_and_plan(SegmentJob(net, setup["inp"], str(setup["tmp"] / "one.zarr")))
    region = (21, 26, 23)
    patches = 1
    for r, o in zip(region, plan.output_size):
        patches *= -(-r // o)
    assert plan.batch <= patches
