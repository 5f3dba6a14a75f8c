"""`znni segment` on OME-Zarr (--level, --output-format, --pyramid) and `znni preview`,
end to end through the CLI on real stores written by ome-zarr-py."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import zarr
from ome_zarr.format import FormatV04
from ome_zarr.writer import write_image
from support.engine_ref import dense_volume, small_network, write_network, write_volume
from support.naive import close

from znni.cli import main


@pytest.fixture()
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.setenv("ZNNI_BACKEND", "reference")
    rng = np.random.default_rng(9)
    layers, params = small_network(rng)
    spec = write_network(tmp_path, layers, params, scale=1 / 255)
    vol = rng.integers(0, 256, size=(8, 24, 20)).astype(np.uint8)
    group = zarr.open_group(str(tmp_path / "in.ome.zarr"), mode="w", zarr_format=2)
    axes = [{"name": a, "type": "space", "unit": "nanometer"} for a in "zyx"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        write_image(vol, group, fmt=FormatV04(), axes=axes, scale_factors=[{"y": 2, "x": 2}],
                    scale={"z": 40.0, "y": 4.0, "x": 4.0}, storage_options={"chunks": (4, 8, 8)})
    plain = write_volume(tmp_path / "plain.zarr", vol, 3, (4, 8, 8))
    return dict(tmp=tmp_path, spec=str(spec), ome=str(tmp_path / "in.ome.zarr"), plain=plain,
                vol=vol, layers=layers, params=params)


def _refused(capsys, argv: list[str], match: str, missing: Path | None = None) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err, err
    if missing is not None:
        assert not missing.exists()


def test_level_1_of_an_ome_input(setup: dict) -> None:
    out = setup["tmp"] / "l1.ome.zarr"
    assert main(["segment", setup["spec"], setup["ome"], str(out), "--level", "1",
                 "--quiet"]) == 0
    group = zarr.open_group(str(out), mode="r")
    level1 = np.asarray(zarr.open_group(setup["ome"], mode="r")["s1"][...])
    ref = dense_volume(setup["layers"], setup["params"], level1[None], "reflect", 1 / 255)
    assert close(np.asarray(group["0"][...]), ref)
    ms = group.attrs["ome"]["multiscales"][0]
    assert ms["datasets"][0]["coordinateTransformations"][0]["scale"] == [1.0, 40.0, 8.0, 8.0]
    assert group.attrs["znni"]["level"] == 1


def test_plain_input_to_ome_with_pyramid(setup: dict) -> None:
    out = setup["tmp"] / "p.ome.zarr"
    assert main(["segment", setup["spec"], setup["plain"], str(out), "--output-format",
                 "ome-zarr", "--pyramid", "2", "--quiet"]) == 0
    group = zarr.open_group(str(out), mode="r")
    assert [group[k].shape for k in ("0", "1", "2")] == [(2, 8, 24, 20), (2, 4, 12, 10),
                                                         (2, 2, 6, 5)]


def test_segment_refusals(setup: dict, capsys) -> None:
    out = setup["tmp"] / "never.zarr"
    base = ["segment", setup["spec"]]
    _refused(capsys, [*base, setup["plain"], str(out), "--level", "1"],
             "--level applies to OME-Zarr image groups", out)
    _refused(capsys, [*base, setup["ome"], str(out), "--level", "5"], "there is no level 5", out)
    _refused(capsys, [*base, setup["ome"], str(out), "--pyramid", "-1"], "0 or more levels", out)
    _refused(capsys, [*base, setup["ome"], str(out), "--output-format", "zarr", "--pyramid", "1"],
             "--pyramid applies to OME-Zarr outputs", out)


def test_preview_writes_a_png(setup: dict, capsys) -> None:
    from matplotlib.image import imread

    out = setup["tmp"] / "o.ome.zarr"
    assert main(["segment", setup["spec"], setup["ome"], str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["preview", str(out)]) == 0
    png = Path(capsys.readouterr().out.strip())
    assert png == setup["tmp"] / "o-z4.png" and png.is_file()
    pixels = imread(png)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and np.ptp(pixels[..., :3]) > 0.5
    target = setup["tmp"] / "shots" / "x3.png"
    assert main(["preview", str(out), "--x", "3", "-o", str(target)]) == 0
    assert capsys.readouterr().out.strip() == str(target) and target.stat().st_size > 1000


def test_preview_refusals(setup: dict, capsys) -> None:
    out = setup["tmp"] / "o.zarr"
    assert main(["segment", setup["spec"], setup["plain"], str(out), "--quiet"]) == 0
    png = setup["tmp"] / "p.png"
    _refused(capsys, ["preview", str(setup["tmp"] / "none.zarr"), "-o", str(png)],
             "does not exist", png)
    _refused(capsys, ["preview", str(out), "--z", "8", "-o", str(png)],
             "outside the output's z range 0..7", png)
    _refused(capsys, ["preview", setup["plain"], "-o", str(png)], "has no znni provenance", png)
    with pytest.raises(SystemExit) as e:
        main(["preview", str(out), "--z", "1", "--y", "2"])
    assert e.value.code == 2
