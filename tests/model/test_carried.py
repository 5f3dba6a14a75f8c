"""An ONNX model carried to a worker that cannot see its path (`OnnxModel.carried`): its
files travel as bytes and are written once on the receiving host, external weights too."""

from __future__ import annotations

import pickle
import tempfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from znni.model.carried import write_files
from znni.model.onnx_model import load_onnx_model


def _external_model(folder: Path) -> Path:
    """Conv 1->2, 3^3, padded (a windowed model), its weights in `w.data` beside it."""
    folder.mkdir()
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((2, 1, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(2).astype(np.float32), "b")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "z", "y", "x"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, "z", "y", "x"])
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1] * 6)
    graph = helper.make_graph([conv], "g", [x], [y], initializer=[w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = folder / "m.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="w.data", size_threshold=0)
    return path


def test_carried_model_runs_where_its_path_is_gone(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    model = load_onnx_model(_external_model(tmp_path / "here"))
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
