"""`znni agglomerate --plan` and `znni plan --agglomerate`: the predicted agglomeration,
one line (a JSON object with --json), nothing written; a network that writes neither
affinities nor a boundary map is refused in one sentence."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr
from support.engine_ref import write_network

from znni.cli import main
from znni.engine.agglomerate.synthetic import synthetic_cells


def _network(tmp: Path, out_channels: int, name: str) -> str:
    layers = [{"kind": "conv", "out_channels": 4, "kernel": [3, 3, 3]}, {"kind": "relu"},
              {"kind": "conv", "out_channels": out_channels, "kernel": [1, 1, 1]},
              {"kind": "sigmoid"}]
    rng = np.random.default_rng(0)
    params = {"0.weight": rng.standard_normal((4, 1, 3, 3, 3)).astype(np.float32),
              "0.bias": np.zeros(4, np.float32),
              "2.weight": rng.standard_normal((out_channels, 4, 1, 1, 1)).astype(np.float32),
              "2.bias": np.zeros(out_channels, np.float32)}
    return str(write_network(tmp, layers, params, name=name))


def test_agglomerate_plan_prints_the_prediction_and_writes_nothing(tmp_path: Path,
                                                                   capsys) -> None:
    _, affs = synthetic_cells((24, 40, 40), seed=1)
    path = tmp_path / "affs.zarr"
    arr = zarr.create_array(str(path), shape=affs.shape, chunks=(3, 8, 16, 16),
                            dtype="float32")
    arr[...] = affs
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    rc = main(["agglomerate", str(path), str(tmp_path / "seg-{threshold}.zarr"),
               "--threshold", "0.3,0.5", "--block", "16,32,32", "--plan"])
    assert rc == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("predicted: fragments ") and len(out.splitlines()) == 1
    for part in ("faces ", "agglomerate ", "relabel ", "total ", "M voxels/s", "GiB",
                 f"16x32x32 sample of {path}", "edges per voxel"):
        assert part in out
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_plan_agglomerate_adds_a_line_and_a_json_object(tmp_path: Path, capsys) -> None:
    spec = _network(tmp_path, 3, "affs3")
    assert main(["plan", spec, "--machine", "ci-2core", "--agglomerate"]) == 0
    lines = capsys.readouterr().out.splitlines()
    line = lines[-1]
    assert line.startswith("agglomeration (threshold 0.5) of the output over 512x512x512")
    assert "predicted: fragments " in line and "synthetic cells" in line
    assert main(["plan", spec, "--machine", "ci-2core", "--agglomerate", "0.3,0.6",
                 "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["agglomerate"]
    assert got["thresholds"] == [0.3, 0.6] and got["region"] == [512, 512, 512]
    assert got["total_s"] == pytest.approx(got["fragments_s"] + got["faces_s"]
                                           + got["agglomerate_s"] + got["relabel_s"])
    assert got["peak_bytes"] > 0 and "synthetic cells" in got["basis"]


def test_plan_agglomerate_refuses_two_output_channels(tmp_path: Path, capsys) -> None:
    spec = _network(tmp_path, 2, "two")
    assert main(["plan", spec, "--machine", "ci-2core", "--agglomerate"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "3 channels (affinities) or 1 (a boundary map)" in err and "writes 2" in err
