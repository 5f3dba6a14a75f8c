"""`znni segment` end to end through the CLI: success, and every malformed case refused."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import zarr
from support.engine_ref import dense_volume, small_network, write_network, write_volume
from support.naive import close

from znni.cli import main


@pytest.fixture()
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.setenv("ZNNI_BACKEND", "reference")
    rng = np.random.default_rng(3)
    layers, params = small_network(rng)
    spec = write_network(tmp_path, layers, params, scale=1 / 255)
    layers2, params2 = small_network(rng, in_channels=2)
    spec2 = write_network(tmp_path, layers2, params2, in_channels=2, name="net2")
    vol = rng.integers(0, 256, size=(13, 17, 19)).astype(np.uint8)
    inp = write_volume(tmp_path / "in.zarr", vol, 2, (6, 6, 6))
    return dict(tmp=tmp_path, spec=str(spec), spec2=str(spec2), inp=inp, vol=vol,
                layers=layers, params=params)


def test_cli_segment_writes_reference_output(setup: dict, capsys) -> None:
    out = str(setup["tmp"] / "out.zarr")
    rc = main(["segment", setup["spec"], setup["inp"], out, "--chunks", "4,6,5", "--block",
               "4,6,5", "--roi", "0:13,5:17,0:9", "--border", "zero", "--quiet"])
    assert rc == 0
    assert capsys.readouterr().err == ""  # --quiet: nothing
    ref = dense_volume(setup["layers"], setup["params"], setup["vol"][None], "zero", 1 / 255)
    got = zarr.open_array(out)[...]
    assert close(got[:, :, 5:17, 0:9], ref[:, :, 5:17, 0:9])
    rc = main(["segment", setup["spec"], setup["inp"], out, "--chunks", "4,6,5", "--block",
               "4,6,5", "--roi", "0:13,5:17,0:9", "--border", "zero"])
    assert rc == 0
    assert "0/" in capsys.readouterr().err  # resumed: every block already done


def _snapshot(path: Path) -> dict[str, float]:
    if not path.exists():
        return {}
    if path.is_file():
        return {str(path): path.stat().st_mtime_ns}
    return {str(p): p.stat().st_mtime_ns for p in path.rglob("*")}


def _prepare_bad(name: str, s: dict) -> tuple[list[str], Path]:
    """(CLI argv, output path) of one malformed case, with whatever files it needs."""
    tmp, spec, inp = s["tmp"], s["spec"], s["inp"]
    out = tmp / "out.zarr"
    base = ["segment", spec]
    if name == "missing-input":
        return base + [str(tmp / "nope.zarr"), str(out)], out
    if name == "not-zarr-dir":
        (tmp / "plain").mkdir()
        (tmp / "plain" / "x.txt").write_text("hi")
        return base + [str(tmp / "plain"), str(out)], out
    if name == "zarr-group":
        zarr.open_group(str(tmp / "grp.zarr"), mode="w")
        return base + [str(tmp / "grp.zarr"), str(out)], out
    if name == "2d-input":
        return base + [write_volume(tmp / "2d.zarr", np.zeros((9, 9), np.uint8), 3, (4, 4)),
                       str(out)], out
    if name == "5d-input":
        v = np.zeros((1, 1, 4, 4, 4), np.uint8)
        return base + [write_volume(tmp / "5d.zarr", v, 3, (1, 1, 4, 4, 4)), str(out)], out
    if name == "bool-input":
        v = np.zeros((4, 4, 4), bool)
        return base + [write_volume(tmp / "b.zarr", v, 3, (4, 4, 4)), str(out)], out
    if name == "3d-for-2-channels":
        return ["segment", s["spec2"], inp, str(out)], out
    if name == "wrong-channels":
        v = np.zeros((3, 5, 5, 5), np.uint8)
        return ["segment", s["spec2"], write_volume(tmp / "c3.zarr", v, 3, (1, 5, 5, 5)),
                str(out)], out
    if name == "roi-outside":
        return base + [inp, str(out), "--roi", "0:14,0:17,0:19"], out
    if name == "roi-empty":
        return base + [inp, str(out), "--roi", "5:5,0:17,0:19"], out
    if name == "roi-negative":  # argparse alone takes "-2:5,..." for an option
        return base + [inp, str(out), "--roi", "-2:5,0:17,0:19"], out
    if name == "roi-malformed":
        return base + [inp, str(out), "--roi", "0:5,0:17"], out
    if name == "bad-chunks":
        return base + [inp, str(out), "--chunks", "4,0,4"], out
    if name == "chunks-differ-from-output":
        assert main(base + [inp, str(out), "--quiet", "--chunks", "6,6,6"]) == 0
        return base + [inp, str(out), "--overwrite", "--chunks", "4,4,4"], out
    if name == "chunks-too-large":  # 4 GiB of float32 per chunk; only metadata on disk
        big = zarr.create_array(store=str(tmp / "big.zarr"), shape=(1024,) * 3,
                                chunks=(256,) * 3, dtype="uint8")
        return base + [str(big.store.root), str(out), "--chunks", "1024,1024,1024"], out
    if name == "bad-scheduler":
        return base + [inp, str(out), "--scheduler", "http://x"], out
    if name == "output-is-input":
        return base + [inp, inp], Path(inp)
    if name == "output-is-file":
        out = tmp / "file.zarr"
        out.write_text("x")
        return base + [inp, str(out)], out
    existing = {"output-wrong-shape": ((2, 13, 17, 18), "float32"),
                "output-wrong-dtype": ((2, 13, 17, 19), "uint8")}
    if name in existing:
        shape, dtype = existing[name]
        zarr.create_array(store=str(out), shape=shape, chunks=shape, dtype=dtype)
        return base + [inp, str(out)], out
    if name == "output-of-other-job":
        assert main(base + [inp, str(out), "--quiet", "--roi", "0:6,:,:"]) == 0
        return base + [inp, str(out), "--roi", "0:7,:,:"], out
    raise AssertionError(name)


BAD = ["missing-input", "not-zarr-dir", "zarr-group", "2d-input", "5d-input", "bool-input",
       "3d-for-2-channels", "wrong-channels", "roi-outside", "roi-empty", "roi-negative",
       "roi-malformed",
       "bad-chunks", "chunks-differ-from-output", "chunks-too-large", "bad-scheduler",
       "output-is-input", "output-is-file", "output-wrong-shape", "output-wrong-dtype",
       "output-of-other-job"]


@pytest.mark.parametrize("name", BAD)
def test_cli_segment_refuses_bad_input(setup: dict, capsys, name: str) -> None:
    argv, out = _prepare_bad(name, setup)
    capsys.readouterr()
    before = _snapshot(out)
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("znni segment: error: "), err
    assert "Traceback" not in err
    if name.startswith("chunks-"):
        assert "chunks (" in lines[0], err
    if name == "roi-negative":
        assert "ROI -2:5 on axis z is outside the volume" in lines[0], err
    assert _snapshot(out) == before  # nothing written
    assert not os.environ.get("ZNNI_DEBUG")


def test_cli_segment_clips_chunks_to_the_volume(setup: dict) -> None:
    """Past the volume a chunk would hold only fill; a resume with the same --chunks
    matches the clipped chunks the output was created with."""
    out = str(setup["tmp"] / "out.zarr")
    argv = ["segment", setup["spec"], setup["inp"], out, "--chunks", "100,8,100", "--quiet"]
    assert main(argv) == 0
    assert zarr.open_array(out).chunks == (2, 13, 8, 19)
    assert main(argv) == 0


def test_cli_plan_for_an_input_plans_the_pass_segment_runs(setup: dict, capsys) -> None:
    """Like `segment`, `znni plan` gives the patch pass PLAN_FRACTION of the memory budget;
    with --input (and --roi) no patch is planned larger than that region, and the region's
    predicted time is reported. `--machine` keeps it from calibrating this machine."""
    import json

    from znni.engine.compute.layout import PLAN_FRACTION

    args = ["plan", setup["spec"], "--machine", "ci-2core", "--memory-limit", "1GiB"]
    assert main([*args, "--json"]) == 0
    free = json.loads(capsys.readouterr().out)
    assert free["memory_limit_bytes"] == int(2**30 * PLAN_FRACTION) and "region" not in free
    assert main([*args, "--json", "--input", setup["inp"], "--roi", "0:13,5:17,0:9"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["region"] == [13, 12, 9]
    assert all(o < f for o, f in zip(plan["output_size"], free["output_size"], strict=True))
    assert max(plan["output_size"]) <= 2 * 13  # within the region, up to the pool product
    from znni.planner.costs import FIRST_PASS_S_PER_PEAK_BYTE

    patches = 1  # whole patches in whole batches, plus the first pass's pages
    for r, o in zip((13, 12, 9), plan["output_size"], strict=True):
        patches *= -(-r // o)
    assert plan["predicted_seconds"] == pytest.approx(
        -(-patches // plan["batch"]) * plan["predicted_patch_s"]
        + FIRST_PASS_S_PER_PEAK_BYTE * plan["peak_bytes"])
    assert main([*args, "--input", setup["inp"]]) == 0
    text = capsys.readouterr().out  # one prediction: the whole run's (planner/jobtime)
    assert "the volume 13x17x19: its whole run below" in text and "whole run: about" in text
    assert "steady vox/s: one pass's rate" not in text
    assert main([*args, "--storage-option", "anon=true"]) == 2
    assert "--storage-option needs --input" in capsys.readouterr().err
    assert main([*args, "--window", "8,8,8"]) == 2
    assert "--window applies to ONNX graph models" in capsys.readouterr().err
