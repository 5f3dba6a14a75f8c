"""`znni check` passes packages whose test output the spec's operations give, fails a
tampered one; `znni segment`, `plan` and `check` refuse broken or unsupported packages
with one sentence, exit 2, and write nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from support import bioimage_packages as bp
from support.engine_ref import write_volume

from znni.cli import main

pytest.importorskip("torch")
pytest.importorskip("bioimageio.spec")

PRE = [{"id": "scale_range", "kwargs": {"axes": ["z", "y", "x"], "min_percentile": 2.0,
                                        "max_percentile": 98.0}}]
POST = [{"id": "sigmoid"}]


@pytest.fixture(scope="module")
def onnx(tmp_path_factory) -> Path:
    return bp.export_onnx(tmp_path_factory.mktemp("check-onnx") / "tiny.onnx")


@pytest.fixture(scope="module")
def volume(tmp_path_factory) -> str:
    vol = np.random.default_rng(2).integers(0, 256, (2, 12, 16, 16)).astype(np.uint8)
    return write_volume(tmp_path_factory.mktemp("check-vol") / "in.zarr", vol, 3,
                        (1, 12, 16, 16))


@pytest.mark.parametrize("pack", ["folder", "zip", "rdf"])
def test_package_passes_its_own_test(onnx, tmp_path, capsys, pack) -> None:
    pkg = bp.build(tmp_path / "pkg", onnx, PRE, POST, pack=pack)
    assert main(["check", str(pkg)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("znni check: tiny-unet: output prob: max abs difference ")
    assert out.rstrip().endswith("PASS")
    assert float(out.split("max abs difference ")[1].split(";")[0]) <= 1e-5


def test_tampered_test_output_fails(onnx, tmp_path, capsys) -> None:
    pkg = bp.build(tmp_path / "pkg", onnx, PRE, POST)
    y = np.load(pkg / "test_output.npy")
    y[0, 0, :2] += 0.01  # 512 of 4096 values, beyond atol + rtol
    np.save(pkg / "test_output.npy", y)
    (pkg / "rdf.yaml").write_text((pkg / "rdf.yaml").read_text())  # no sha256 recorded
    assert main(["check", str(pkg)]) == 1
    out = capsys.readouterr().out
    assert "512 of 4096 values outside atol 0.001" in out and out.rstrip().endswith("FAIL")


def _edit_rdf(pkg: Path, change) -> None:
    rdf = yaml.safe_load((pkg / "rdf.yaml").read_text())
    change(rdf)
    (pkg / "rdf.yaml").write_text(yaml.safe_dump(rdf, sort_keys=False))


def _corrupt(pkg: Path) -> None:
    (pkg / "rdf.yaml").write_text("format_version: 0.5.4\ntype: model\ninputs: [\n")


def _no_weights(pkg: Path) -> None:
    (pkg / "weights.onnx").unlink()


def _two_d(pkg: Path) -> None:
    for name in ("test_input.npy", "test_output.npy"):
        np.save(pkg / name, np.load(pkg / name)[:, :, 0])

    def change(rdf: dict) -> None:
        for t in rdf["inputs"] + rdf["outputs"]:
            del t["axes"][2]
        rdf["inputs"][0]["preprocessing"][0]["kwargs"]["axes"] = ["y", "x"]
    _edit_rdf(pkg, change)


def _unsupported(pkg: Path) -> None:
    _edit_rdf(pkg, lambda rdf: rdf["outputs"][0]["postprocessing"].append(
        {"id": "scale_mean_variance", "kwargs": {"reference_tensor": "raw"}}))


REFUSALS = {
    "corrupt_rdf": (_corrupt, "cannot be read"),
    "missing_weights": (_no_weights, "weights.onnx does not point to an existing file"),
    "2d_model": (_two_d, "is a 2D model (input axes batch, channel, y, x); znni runs 3D"),
    "unsupported_op": (_unsupported, "postprocessing 'scale_mean_variance' is not supported"),
}


@pytest.mark.parametrize("command", ["segment", "plan", "check"])
@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refused_with_one_sentence_and_nothing_written(onnx, volume, tmp_path, capsys,
                                                       case, command) -> None:
    pkg = bp.build(tmp_path / "pkg", onnx, PRE, POST)
    breaks, words = REFUSALS[case]
    breaks(pkg)
    out = tmp_path / "out.zarr"
    argv = {"segment": ["segment", str(pkg), volume, str(out)],
            "plan": ["plan", str(pkg)], "check": ["check", str(pkg)]}[command]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_torchscript_only_is_refused_with_how_to_export(onnx, volume, tmp_path,
                                                        capsys) -> None:
    pkg = bp.build(tmp_path / "pkg", onnx, PRE, POST, weights="torchscript")
    out = tmp_path / "out.zarr"
    assert main(["segment", str(pkg), volume, str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "has torchscript weights only; znni runs ONNX weights" in err
    assert "torch.onnx.export" in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_format_04_package_passes(onnx, tmp_path, capsys) -> None:
    pre04 = [{"name": "scale_range", "kwargs": {"mode": "per_sample", "axes": "zyx",
                                                "min_percentile": 2.0, "max_percentile": 98.0}}]
    pkg = bp.build_v04(tmp_path / "pkg04", onnx, pre04, [{"name": "sigmoid"}], PRE, POST)
    assert main(["check", str(pkg)]) == 0
    assert capsys.readouterr().out.rstrip().endswith("PASS")


def test_plan_shows_the_package_window_grid(onnx, tmp_path, capsys) -> None:
    pkg = bp.build(tmp_path / "pkg", onnx, [], POST, size={"min": 12, "step": 4})
    assert main(["plan", str(pkg), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "network tiny-unet: 2 -> 2 channels" in out
    assert "windows: 12x12x12 plus multiples of 4x4x4" in out
