"""`znni demo` (what `make demo` runs): the boundary map, its score and its preview."""

from __future__ import annotations

import re
from pathlib import Path

import zarr

from znni.cli import main


def test_demo_segments_the_synthetic_volume_and_finds_its_membranes(tmp_path: Path,
                                                                     capsys) -> None:
    assert main(["demo", "--dir", str(tmp_path / "d"), "--quiet"]) == 0
    out = capsys.readouterr().out
    boundaries = zarr.open_array(str(tmp_path / "d" / "boundaries.zarr"), mode="r")
    assert boundaries.shape == (1, 64, 192, 192)
    assert boundaries.attrs["znni"]["network"]["name"] == "demo-membranes"
    score = re.search(r"on true membranes ([\d.]+), inside cells ([\d.]+); at 0.5: "
                      r"precision ([\d.]+), recall ([\d.]+)", out)
    assert score is not None, out
    on, inside, precision, recall = (float(v) for v in score.groups())
    assert on > inside + 0.3 and precision > 0.6 and recall > 0.6  # the map finds membranes
    png = re.search(r"preview: (\S+)", out)
    assert png is not None and Path(png.group(1)).read_bytes()[:4] == b"\x89PNG"


def test_demo_refuses_a_directory_it_cannot_make(tmp_path: Path, capsys) -> None:
    (tmp_path / "file").write_text("x")
    assert main(["demo", "--dir", str(tmp_path / "file"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"znni demo: error: cannot write the demo into {tmp_path / 'file'}: File exists"
