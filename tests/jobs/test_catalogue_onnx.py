"""The catalogue with ONNX models: one model per (name, output_name, scale, shift), cached
and bounded, reloaded when the file changes; JSON specs refuse the ONNX-only options."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from znni.jobs.catalogue import ModelOptions, NetworkCatalogue, UnknownNetworkError, describe

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")


@pytest.fixture()
def models(tmp_path: Path, onnx_models) -> Path:
    onnx_models.copy("chain", tmp_path / "chain.onnx")
    spec = {"name": "j", "in_channels": 1, "weights": "j.npz",
            "layers": [{"kind": "conv", "out_channels": 1, "kernel": [1, 1, 1]}]}
    (tmp_path / "j.json").write_text(json.dumps(spec))
    np.savez(tmp_path / "j.npz", **{"0.weight": np.ones((1, 1, 1, 1, 1), np.float32),
                                    "0.bias": np.zeros(1, np.float32)})
    return tmp_path


def test_one_model_per_option_combination(models: Path) -> None:
    cat = NetworkCatalogue(models, entries=2)
    assert cat.names() == ["chain", "j"]
    plain = cat.get("chain")
    assert cat.get("chain", ModelOptions(scale=1.0, shift=0.0)) is plain  # the same model
    scaled = cat.get("chain", ModelOptions(scale=0.5))
    assert scaled.digest != plain.digest and scaled.input_scale == 0.5  # type: ignore[union-attr]
    assert cat.get("chain", ModelOptions(scale=0.5)) is scaled
    cat.get("chain", ModelOptions(shift=1.0))
    cat.get("j")
    assert len(cat._cache) == 2  # bounded: the least recently used ones were dropped
    assert describe("chain", plain)["mode"] == "exact"


def test_a_changed_file_is_loaded_again(models: Path, onnx_models) -> None:
    cat = NetworkCatalogue(models)
    before = cat.get("chain")
    onnx_models.copy("chain3", models / "chain.onnx")
    os.utime(models / "chain.onnx", ns=(1, 1))
    after = cat.get("chain")
    assert after.out_channels == 3 and after.digest != before.digest


def test_new_external_weights_are_loaded_again(models: Path) -> None:
    """Weights in a data file beside an unchanged graph (torch's dynamo export writes
    NAME.onnx.data): new weights there are a new model, not the cached one."""
    import onnx

    for seed, folder in ((1, models / "a"), (2, models / "b")):
        folder.mkdir()
        torch.manual_seed(seed)
        net = torch.nn.Sequential(torch.nn.Conv3d(1, 2, 3), torch.nn.ReLU())
        torch.onnx.export(net.eval(), (torch.zeros(1, 1, 8, 8, 8),), folder / "tmp.onnx",
                          input_names=["x"], dynamo=False,
                          dynamic_axes={"x": {2: "z", 3: "y", 4: "x"}})
        onnx.save_model(onnx.load(str(folder / "tmp.onnx")), str(folder / "ext.onnx"),
                        save_as_external_data=True, location="ext.onnx.data",
                        size_threshold=0)
        (folder / "tmp.onnx").unlink()
    cat = NetworkCatalogue(models / "a")
    assert cat.names() == ["ext"]  # the data file is not a network
    before = cat.get("ext")
    assert cat.get("ext") is before
    data = (models / "b" / "ext.onnx.data").read_bytes()
    assert len(data) == (models / "a" / "ext.onnx.data").stat().st_size
    (models / "a" / "ext.onnx.data").write_bytes(data)
    os.utime(models / "a" / "ext.onnx.data", ns=(2, 2))
    after = cat.get("ext")
    assert after is not before and after.digest != before.digest


def test_refusals(models: Path) -> None:
    cat = NetworkCatalogue(models)
    with pytest.raises(ValueError, match="scale, shift apply to ONNX models only"):
        cat.get("j", ModelOptions(scale=2.0, shift=1.0))
    with pytest.raises(ValueError, match="has no output 'nope'"):
        cat.get("chain", ModelOptions(output_name="nope"))
    with pytest.raises(UnknownNetworkError, match="available networks: chain, j"):
        cat.get("missing")
    (models / "chain.json").write_text("{}")
    with pytest.raises(ValueError, match="defined twice, by chain.json and chain.onnx"):
        cat.get("chain")
    (models / "bad.onnx").write_bytes(b"not a model")
    with pytest.raises(ValueError, match="network 'bad' cannot be loaded"):
        cat.get("bad")
