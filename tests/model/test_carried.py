"""An ONNX model carried to a worker that cannot see its path (`OnnxModel.carried`): its
files travel as bytes and are written once on the receiving host, external weights too."""

from __future__ import annotations

import pickle
import tempfile
from pathlib import Path

import pytest
from support.onnx_models import external_conv

from znni.model.carried import CarriedFiles, openvino_ir_files, write_files
from znni.model.onnx_model import load_onnx_model


def test_carried_model_runs_where_its_path_is_gone(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_onnx_model(external_conv(tmp_path / "here"))
    before = model.graph((8, 8, 8))
    sent = pickle.dumps(model.carried())
    files = sum(f.stat().st_size for f in (tmp_path / "here").iterdir())
    assert len(sent) > len(pickle.dumps(model)) + files  # a plain model sends its path only
    (tmp_path / "here").rename(tmp_path / "gone")  # the submitting host's files, out of reach
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "worker-tmp"))
    there = pickle.loads(sent)
    assert Path(there.path).parent.parent == tmp_path / "worker-tmp" / "znni-models"
    assert sorted(p.name for p in Path(there.path).parent.iterdir()) == ["m.onnx", "w.data"]
    graph = there.graph((8, 8, 8))
    assert graph.digest == before.digest and there.digest == model.digest
    again = pickle.loads(sent)  # a second worker of the node: the same files, kept
    assert again.path == there.path


def test_carried_names_stay_inside_their_folder(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'../x' names a place outside its folder"):
        write_files((("m.onnx", b"m"), ("../x", b"x")), tmp_path)
    with pytest.raises(ValueError, match="has no files"):
        write_files((), tmp_path)


def test_an_openvino_ir_travels_as_its_two_files(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """int8's quantized IR (the .xml and the .bin of its weights) sent to a worker on
    another host: written there once, byte for byte, under the content's folder."""
    here = tmp_path / "cache" / "entry"
    here.mkdir(parents=True)
    (here / "model.xml").write_bytes(b"<net/>")
    (here / "model.bin").write_bytes(bytes(range(256)) * 3)
    carried = CarriedFiles(openvino_ir_files(here / "model.xml"))
    assert "model.xml" in repr(carried) and "\\x" not in repr(carried)  # names, no bytes
    sent = pickle.dumps(carried)
    (tmp_path / "cache").rename(tmp_path / "gone")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "worker-tmp"))
    path = Path(pickle.loads(sent).path())
    assert path.name == "model.xml" and path.parent.parent.name == "znni-models"
    assert path.read_bytes() == b"<net/>"
    assert path.with_suffix(".bin").read_bytes() == bytes(range(256)) * 3


def test_an_ir_without_its_weights_is_named(tmp_path: Path) -> None:
    (tmp_path / "model.xml").write_bytes(b"<net/>")
    with pytest.raises(ValueError, match=r"model\.xml \(with model\.bin beside it\) is not"):
        openvino_ir_files(tmp_path / "model.xml")
