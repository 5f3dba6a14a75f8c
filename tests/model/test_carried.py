"""An ONNX model carried to a worker that cannot see its path (`OnnxModel.carried`): its
files travel as bytes and are written once on the receiving host, external weights too."""

from __future__ import annotations

import pickle
import tempfile
from pathlib import Path

import pytest
from support.onnx_models import external_conv

from znni.model.carried import write_files
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
