"""`znni segment|plan --precision int8` (issue 53): the output written with its measured
error in the provenance and on stderr, the error equal to an independent computation
(onnxruntime's fp32 and the cached int8 IR on the held-out windows), the rerun finding the
cached network, an fp32 run refused on an int8 output, every refusal (an error above
--max-error, a sequential network, the GPU, NNCF missing) one sentence with exit 2 and
nothing written, and `znni plan` showing the error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from support.engine_ref import small_network, write_network, write_volume

from znni.cli import main

pytest.importorskip("openvino")
pytest.importorskip("nncf")
ort = pytest.importorskip("onnxruntime")
WINDOW = "16,32,32"
SCALE = 1 / 255


@pytest.fixture(scope="module")
def job(tmp_path_factory, onnx_models) -> dict:
    """A random uint8 volume, the exported BasicUNet and one int8 segment run of it."""
    tmp = tmp_path_factory.mktemp("int8")
    vol = np.random.default_rng(11).integers(0, 256, (32, 64, 64)).astype(np.uint8)
    inp = write_volume(tmp / "in.zarr", vol, 3, (16, 32, 32))
    onnx = str(onnx_models.copy("basicunet", tmp / "unet.onnx"))
    out = tmp / "out.zarr"
    args = ["segment", onnx, inp, str(out), "--window", WINDOW, "--scale", str(SCALE),
            "--precision", "int8", "--max-error", "1", "--labels", "argmax"]
    return {"tmp": tmp, "vol": vol, "inp": inp, "onnx": onnx, "out": out, "args": args}


def _one_sentence(err: str) -> str:
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 1, err
    return lines[0]


def _run_first(job: dict, capsys) -> tuple[dict, str]:
    if "record" not in job:
        assert main(job["args"]) == 0, capsys.readouterr().err
        job["stderr"] = capsys.readouterr().err
        job["record"] = zarr.open_array(str(job["out"]), mode="r").attrs["znni"]
    return job["record"], job["stderr"]


def test_int8_writes_its_output_and_its_error(job, capsys) -> None:
    record, err = _run_first(job, capsys)
    assert record["precision"] == "int8"
    int8 = record["int8"]
    assert int8["calibration_windows"] == 16 and int8["held_out_windows"] == 4
    assert int8["held_out_disjoint"] and int8["max_error_allowed"] == 1.0
    assert 0 <= int8["mean_error"] <= int8["max_error"] <= 1.0
    assert 0 <= int8["labels_changed"] <= 1 and len(int8["digest"]) == 32
    line = next(n for n in err.splitlines() if n.startswith("int8: max error"))
    assert f"{int8['max_error']:.2%}" in line and "labels changed" in line
    assert "OpenVINO network at int8" in err
    out = zarr.open_array(str(job["out"]), mode="r")
    assert out.shape == (1, *job["vol"].shape) and out.dtype == np.uint8  # argmax labels
    # the whole-run prediction holds the settlement (sampling, NNCF, errors), as measured
    t = record["plan"]["job_seconds"]
    assert t["total_s"] == pytest.approx(t["startup_s"] + t["windows_s"] + t["io_s"]
                                         + t["settling_s"])
    assert record["plan"]["predicted_job_seconds"] == t["total_s"]
    whole = next(n for n in err.splitlines() if n.startswith("whole run: predicted"))
    assert f"{t['settling_s']:.1f} s of it measured before the sweep" in whole


def test_the_error_equals_an_independent_computation(job, capsys) -> None:
    """fp32: onnxruntime on the held-out windows; int8: the cached IR run by OpenVINO
    directly; max and mean |int8 - fp32| over the fp32 range, and argmax changes."""
    import openvino as ov

    from znni.engine.compute.int8_calibration import sample_windows
    from znni.engine.geometry import Box
    from znni.model.onnx_model import load_onnx_model

    record, _ = _run_first(job, capsys)
    model = load_onnx_model(job["onnx"], scale=SCALE)
    vol = job["vol"]
    sample = sample_windows(lambda b: vol[None, b.lo[0]:b.hi[0], b.lo[1]:b.hi[1],
                                          b.lo[2]:b.hi[2]],
                            Box.from_shape(vol.shape), (16, 32, 32), model)
    held = sample.held_out
    session = ort.InferenceSession(job["onnx"])
    ref = np.concatenate([session.run(None, {"x": held[i:i + 1]})[0] for i in range(4)])
    xml = Path(os.environ["XDG_CACHE_HOME"]) / "znni" / "int8" / record["int8"]["digest"]
    net = ov.Core().compile_model(str(xml / "model.xml"), "CPU",
                                  {"INFERENCE_PRECISION_HINT": "f32"})
    got = np.concatenate([net(held[i:i + 1])[0] for i in range(4)])
    span = ref.max() - ref.min()
    int8 = record["int8"]
    assert int8["max_error"] == pytest.approx(np.abs(got - ref).max() / span, rel=1e-3)
    assert int8["mean_error"] == pytest.approx(np.abs(got - ref).mean() / span, rel=1e-3)
    changed = np.mean(np.argmax(got, axis=1) != np.argmax(ref, axis=1))
    assert int8["labels_changed"] == pytest.approx(changed, abs=2 / got[:, 0].size)


def test_a_rerun_finds_the_cached_network_and_fp32_is_refused_on_int8(job, capsys) -> None:
    record, _ = _run_first(job, capsys)
    xml = Path(os.environ["XDG_CACHE_HOME"]) / "znni" / "int8" / record["int8"]["digest"]
    stamp = (xml / "model.xml").stat().st_mtime_ns
    assert main([*job["args"], "--overwrite"]) == 0
    again = zarr.open_array(str(job["out"]), mode="r").attrs["znni"]["int8"]
    assert again["cached"] and again["digest"] == record["int8"]["digest"]
    assert again["max_error"] == record["int8"]["max_error"]
    assert (xml / "model.xml").stat().st_mtime_ns == stamp  # not quantized again
    assert "quantized network from the cache" in capsys.readouterr().err
    fp32 = [a if a != "int8" else "fp32" for a in job["args"]]
    assert main(fp32) == 2
    assert "precision differs" in _one_sentence(capsys.readouterr().err)


def test_an_error_above_max_error_is_refused_and_nothing_written(job, capsys) -> None:
    out = job["tmp"] / "refused.zarr"
    args = ["segment", job["onnx"], job["inp"], str(out), "--window", WINDOW, "--scale",
            str(SCALE), "--precision", "int8", "--max-error", "0"]
    assert main(args) == 2
    line = _one_sentence(capsys.readouterr().err)
    assert "int8's largest error is" in line and "above --max-error 0" in line
    assert "first and last conv kept in fp32" in line
    assert not out.exists()


def test_int8_refusals_are_one_sentence(job, tmp_path, capsys, monkeypatch) -> None:
    layers, params = small_network(np.random.default_rng(0))
    spec = write_network(tmp_path, layers, params)
    out = tmp_path / "o.zarr"
    assert main(["segment", str(spec), job["inp"], str(out), "--precision", "int8"]) == 2
    assert "applies to ONNX graph models" in _one_sentence(capsys.readouterr().err)
    monkeypatch.setenv("ZNNI_GPU_STANDIN", "1")  # a GPU to refuse int8 on
    assert main(["segment", job["onnx"], job["inp"], str(out), "--precision", "int8",
                 "--device", "gpu"]) == 2
    assert "runs on the CPU" in _one_sentence(capsys.readouterr().err)
    assert main(["segment", job["onnx"], job["inp"], str(out), "--precision", "int8",
                 "--max-error", "-1"]) == 2
    assert "--max-error" in _one_sentence(capsys.readouterr().err)
    assert not out.exists()


def test_nncf_missing_is_one_sentence_and_nothing_written(job, tmp_path) -> None:
    """NNCF made unimportable in a fresh interpreter, with an empty cache."""
    out = tmp_path / "o.zarr"
    args = ["segment", job["onnx"], job["inp"], str(out), "--window", WINDOW, "--precision",
            "int8"]
    code = ("import sys; sys.modules['nncf'] = None\n"
            f"from znni.cli import main; sys.exit(main({args!r}))")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 2
    assert "pip install nncf" in _one_sentence(run.stderr)
    assert not out.exists()


def test_plan_shows_the_error_measured_on_the_input(job, capsys) -> None:
    record, _ = _run_first(job, capsys)
    base = ["plan", job["onnx"], "--window", WINDOW, "--scale", str(SCALE), "--precision",
            "int8", "--max-error", "1", "--labels", "argmax"]
    assert main([*base, "--input", job["inp"], "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["precision"] == "int8" and plan["compiled"] == "openvino-network"
    assert plan["int8"]["digest"] == record["int8"]["digest"] and plan["int8"]["cached"]
    assert plan["int8"]["max_error"] == record["int8"]["max_error"]
    assert main([*base, "--input", job["inp"]]) == 0
    assert "int8: max error" in capsys.readouterr().out
    assert main(base) == 0  # no input: measured once it is given
    assert "measured on the input's own windows once --input is given" in \
        capsys.readouterr().out
    assert main([*base, "--input", job["inp"], "--max-error", "0"]) == 2
    assert "above --max-error" in _one_sentence(capsys.readouterr().err)


def test_auto_picks_a_precision_and_says_why(job, capsys) -> None:
    out = job["tmp"] / "auto.zarr"
    args = ["segment", job["onnx"], job["inp"], str(out), "--window", WINDOW, "--scale",
            str(SCALE), "--precision", "auto", "--max-error", "1"]
    assert main(args) == 0
    err = capsys.readouterr().err
    record = zarr.open_array(str(out), mode="r").attrs["znni"]
    chosen = record["precision_auto"]["chosen"]
    assert record["precision"] == chosen and chosen in ("fp32", "bf16", "int8")
    assert f"precision auto: {chosen}, the fastest predicted within --max-error" in err
    assert main(["plan", job["onnx"], "--window", WINDOW, "--precision", "auto"]) == 0
    assert "--precision auto: predicted output voxels/s fp32" in capsys.readouterr().out
