"""`znni evaluate SEGMENTATION GROUND_TRUTH` on real Zarr arrays: the human table and
--json carry scikit-image's numbers (--roi and --border as documented), and bad input is
one sentence on stderr with exit 2 and no traceback."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr
from skimage.metrics import adapted_rand_error, variation_of_information

from znni.cli import main


def write(path: Path, values: np.ndarray) -> str:
    arr = zarr.create_array(str(path), shape=values.shape, dtype=values.dtype,
                            chunks=tuple(min(8, n) for n in values.shape))
    arr[...] = values
    return str(path)


@pytest.fixture()
def pair(tmp_path: Path) -> dict:
    z, y, x = np.indices((10, 24, 20))
    gt = (1 + (y // 6) * 4 + x // 5).astype(np.uint32)
    gt[:, :, :3] = 0
    seg = np.roll(gt, 1, axis=2).astype(np.uint64) * np.uint64(2**33)
    seg[:, 12:] += np.uint64(1)  # objects crossing y = 12 split in two
    return dict(tmp=tmp_path, seg=write(tmp_path / "seg.zarr", seg), segv=seg,
                gt=write(tmp_path / "gt.zarr", gt), gtv=gt)


def expected(seg: np.ndarray, gt: np.ndarray) -> dict[str, float]:
    """scikit-image's scores (labels renumbered for its sparse table, gt's 0 kept)."""
    _, s = np.unique(seg, return_inverse=True)
    s = s.reshape(seg.shape)
    g = gt.astype(np.int64)
    split, merge = variation_of_information(g, s, ignore_labels=(0,))
    are, prec, rec = adapted_rand_error(g, s)  # its precision is our recall (#6485)
    return dict(voi_split=split, voi_merge=merge, arand=are, precision=rec, recall=prec)


def test_json_report_has_skimages_numbers(pair: dict, capsys: pytest.CaptureFixture) -> None:
    assert main(["evaluate", pair["seg"], pair["gt"], "--json", "--block", "4,8,8"]) == 0
    report = json.loads(capsys.readouterr().out)
    for key, value in expected(pair["segv"], pair["gtv"]).items():
        assert report[key] == pytest.approx(value, rel=1e-10, abs=1e-12), key
    assert report["voi"] == pytest.approx(report["voi_split"] + report["voi_merge"])
    assert report["voxels"] == int((pair["gtv"] != 0).sum())
    assert report["roi"] == [[0, 10], [0, 24], [0, 20]] and report["border"] == 0


def test_table_prints_the_scores(pair: dict, capsys: pytest.CaptureFixture) -> None:
    assert main(["evaluate", pair["seg"], pair["gt"]]) == 0
    out = capsys.readouterr().out
    want = expected(pair["segv"], pair["gtv"])
    want["voi"] = want["voi_split"] + want["voi_merge"]
    rows = dict(re.findall(r"^  (VOI split|VOI merge|VOI|ARAND|precision|recall) +(\S+)", out,
                           re.MULTILINE))
    names = {"VOI split": "voi_split", "VOI merge": "voi_merge", "VOI": "voi",
             "ARAND": "arand", "precision": "precision", "recall": "recall"}
    assert set(rows) == set(names)
    for name, key in names.items():
        assert float(rows[name]) == pytest.approx(want[key], abs=1e-4), name
    assert f"{int((pair['gtv'] != 0).sum()):,} of 4,800 voxels scored" in out


def test_roi_and_border_score_the_cropped_masked_volumes(pair: dict,
                                                         capsys: pytest.CaptureFixture) -> None:
    assert main(["evaluate", pair["seg"], pair["gt"], "--json", "--roi", "2:9,:,5:",
                 "--border", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    seg, gt = pair["segv"][2:9, :, 5:], pair["gtv"][2:9, :, 5:].copy()
    p = np.pad(gt, ((0, 0), (1, 1), (1, 1)), mode="edge")
    c = p[:, 1:-1, 1:-1]
    near = (c != p[:, :-2, 1:-1]) | (c != p[:, 2:, 1:-1]) | (c != p[:, 1:-1, :-2]) \
        | (c != p[:, 1:-1, 2:])
    gt[near] = 0  # a one-voxel band on each side of every border, in xy
    for key, value in expected(seg, gt).items():
        assert report[key] == pytest.approx(value, rel=1e-10, abs=1e-12), key
    assert report["voxels"] == int((gt != 0).sum()) and report["border"] == 1


def write_bad(d: Path, name: str) -> list[str]:
    good = write(d / "good.zarr", np.ones((4, 5, 6), np.uint16))
    if name == "missing path":
        return [good, str(d / "nowhere.zarr")]
    if name == "shape mismatch":
        return [write(d / "other.zarr", np.ones((4, 5, 7), np.uint16)), good]
    if name == "float segmentation":
        return [write(d / "float.zarr", np.ones((4, 5, 6), np.float32)), good]
    if name == "bad --roi":
        return [good, good, "--roi", "0:2,0:3"]
    if name == "roi outside":
        return [good, good, "--roi", "0:9,:,:"]
    if name == "bad --border":
        return [good, good, "--border", "one"]
    return [good, good, "--block", "0,1,1"]


BAD = {
    "missing path": "ground truth .*nowhere.zarr does not exist",
    "shape mismatch": r"has shape \(4, 5, 7\) .* has shape \(4, 5, 6\)",
    "float segmentation": "segmentation .* has dtype float32; labels must be integers",
    "bad --roi": "ROI '0:2,0:3' must have 3 comma-separated ranges",
    "roi outside": "ROI 0:9 on axis z is outside the volume",
    "bad --border": "--border 'one' must be a whole number",
    "bad --block": "--block '0,1,1' must be 3 positive integers",
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_is_one_sentence_and_exit_2(tmp_path: Path, name: str,
                                              capsys: pytest.CaptureFixture) -> None:
    assert main(["evaluate", *write_bad(tmp_path, name)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("znni evaluate: error: ") and "\n" not in err
    assert "Traceback" not in err and captured.out == ""
    assert re.search(BAD[name], err), err


def test_a_subprocess_exits_2_without_a_traceback(tmp_path: Path) -> None:
    args = write_bad(tmp_path, "float segmentation")
    proc = subprocess.run([sys.executable, "-m", "znni.cli", "evaluate", *args],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "labels must be integers" in proc.stderr
