"""ONNX import + graph executor against onnxruntime: single ops built with onnx.helper,
torch exports (TorchScript and dynamo, fixed and dynamic axes), and every refusal."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from support.naive import close

from znni.engine.compute.graph_forward import run_graph
from znni.model.onnx_import import load_onnx
from znni.primitives.backends import make_backend

ort = pytest.importorskip("onnxruntime")
RNG = np.random.default_rng(7)


def _model(path: Path, nodes, inits, cin=3, window=(5, 7, 9), opset=17, out="y") -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, *window])
    y = helper.make_tensor_value_info(out, TensorProto.FLOAT, ["n", "c", "z", "y", "x"])
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()]
    graph = helper.make_graph(nodes, "g", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.save(model, path)
    return path


def _check(path: Path, window=None, backend="cpu") -> None:
    g = load_onnx(path, window)
    x = RNG.standard_normal((1, g.in_channels, *g.window)).astype(np.float32)
    ref = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
    got = run_graph(g, x, make_backend(backend))
    assert got.shape == ref.shape
    assert close(got, ref)


def _w(*shape):
    return RNG.standard_normal(shape).astype(np.float32) * 0.3


SINGLE_OPS = {
    "conv_pad_anisotropic": (
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[0, 1, 2, 1, 1, 0])],
        {"w": _w(4, 3, 2, 3, 1), "b": _w(4)},
    ),
    "conv_stride_dilation": (
        [
            helper.make_node(
                "Conv",
                ["x", "w"],
                ["y"],
                strides=[1, 2, 2],
                dilations=[2, 1, 1],
                pads=[1, 1, 1, 1, 1, 1],
            )
        ],
        {"w": _w(2, 3, 2, 3, 3)},
    ),
    "conv_depthwise_same": (
        [helper.make_node("Conv", ["x", "w"], ["y"], group=3, auto_pad="SAME_UPPER")],
        {"w": _w(3, 1, 3, 2, 3)},
    ),
    "conv_transpose": (
        [
            helper.make_node(
                "ConvTranspose",
                ["x", "w", "b"],
                ["y"],
                strides=[1, 2, 2],
                pads=[0, 1, 0, 0, 0, 1],
                output_padding=[0, 1, 0],
            )
        ],
        {"w": _w(3, 2, 1, 3, 2), "b": _w(2)},
    ),
    "maxpool_ceil": (
        [
            helper.make_node(
                "MaxPool", ["x"], ["y"], kernel_shape=[1, 2, 3], strides=[1, 2, 2], ceil_mode=1
            )
        ],
        {},
    ),
    "avgpool_pads": (
        [
            helper.make_node(
                "AveragePool",
                ["x"],
                ["y"],
                kernel_shape=[2, 3, 3],
                strides=[2, 1, 2],
                pads=[1, 1, 0, 0, 1, 1],
            )
        ],
        {},
    ),
    "resize_nearest": (
        [
            helper.make_node(
                "Resize",
                ["x", "", "s"],
                ["y"],
                mode="nearest",
                coordinate_transformation_mode="asymmetric",
                nearest_mode="floor",
            )
        ],
        {"s": np.array([1, 1, 1, 2, 2], np.float32)},
    ),
    "resize_linear_sizes": (
        [
            helper.make_node(
                "Resize",
                ["x", "", "", "sz"],
                ["y"],
                mode="linear",
                coordinate_transformation_mode="align_corners",
            )
        ],
        {"sz": np.array([1, 3, 8, 11, 13], np.int64)},
    ),
    "slice_pad": (
        [
            helper.make_node("Slice", ["x", "st", "en", "ax"], ["t"]),
            helper.make_node("Pad", ["t", "p"], ["y"], mode="reflect"),
        ],
        {
            "st": np.array([1, 1], np.int64),
            "en": np.array([-1, 100], np.int64),
            "ax": np.array([2, 4], np.int64),
            "p": np.array([0, 0, 1, 2, 0, 0, 0, 0, 2, 1]),
        },
    ),
    "norms": (
        [
            helper.make_node("InstanceNormalization", ["x", "sc", "bi"], ["t"]),
            helper.make_node("BatchNormalization", ["t", "sc", "bi", "mu", "va"], ["y"]),
        ],
        {"sc": _w(3) + 1, "bi": _w(3), "mu": _w(3), "va": np.abs(_w(3)) + 0.5},
    ),
    "pointwise": (
        [
            helper.make_node("PRelu", ["x", "sl"], ["a"]),
            helper.make_node("Selu", ["a"], ["b"]),
            helper.make_node("Clip", ["b", "lo", "hi"], ["c"]),
            helper.make_node("Div", ["c", "k"], ["d"]),
            helper.make_node("Sub", ["k", "d"], ["e"]),
            helper.make_node("Softmax", ["e"], ["y"], axis=1),
        ],
        {"sl": _w(3, 1, 1, 1), "lo": np.float32(-0.5), "hi": np.float32(0.7), "k": np.float32(1.7)},
    ),
    "concat_add_mul": (
        [
            helper.make_node("Sigmoid", ["x"], ["a"]),
            helper.make_node("Tanh", ["x"], ["b"]),
            helper.make_node("Mul", ["a", "b"], ["c"]),
            helper.make_node("Concat", ["c", "x"], ["y"], axis=1),
        ],
        {},
    ),
}


@pytest.mark.parametrize("name", sorted(SINGLE_OPS))
def test_single_ops_match_onnxruntime(tmp_path: Path, name: str) -> None:
    nodes, inits = SINGLE_OPS[name]
    _check(_model(tmp_path / f"{name}.onnx", nodes, inits))


def test_reference_backend_gives_the_same(tmp_path: Path) -> None:
    nodes, inits = SINGLE_OPS["conv_pad_anisotropic"]
    _check(_model(tmp_path / "c.onnx", nodes, inits), backend="reference")


def test_batch_norm_after_conv_is_folded(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["t"]),
        helper.make_node("BatchNormalization", ["t", "sc", "bi", "mu", "va"], ["y"]),
    ]
    inits = {
        "w": _w(3, 3, 1, 2, 2),
        "b": _w(3),
        "sc": _w(3) + 1,
        "bi": _w(3),
        "mu": _w(3),
        "va": np.abs(_w(3)) + 0.5,
    }
    path = _model(tmp_path / "bn.onnx", nodes, inits)
    assert [n.op for n in load_onnx(path).nodes] == ["conv"]
    _check(path)


def _torch_unet():
    torch = pytest.importorskip("torch")
    nn = torch.nn

    class TinyUNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.e1 = nn.Sequential(nn.Conv3d(1, 4, 3, padding=1), nn.BatchNorm3d(4), nn.ReLU())
            self.e2 = nn.Sequential(
                nn.Conv3d(4, 8, (1, 3, 3), padding=(0, 1, 1)),
                nn.InstanceNorm3d(8, affine=True),
                nn.LeakyReLU(0.1),
            )
            self.up = nn.ConvTranspose3d(8, 4, (1, 2, 2), stride=(1, 2, 2))
            self.gn = nn.GroupNorm(2, 8)
            self.out = nn.Conv3d(8, 2, 1)

        def forward(self, x):
            a = self.e1(x)
            b = self.e2(nn.functional.max_pool3d(a, (1, 2, 2)))
            u = (
                self.up(b)
                + nn.functional.interpolate(b, scale_factor=(1, 2, 2), mode="trilinear")[:, :4]
            )
            c = torch.cat([a, u], 1)
            return torch.softmax(self.out(nn.functional.elu(self.gn(c))), 1)

    torch.manual_seed(0)
    model = TinyUNet().eval()
    bn = model.e1[1]
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    return torch, model


@pytest.mark.parametrize("dynamo", [False, True])
def test_torch_exported_unet_fixed_and_dynamic(tmp_path: Path, dynamo: bool) -> None:
    torch, model = _torch_unet()
    if dynamo:
        pytest.importorskip("onnxscript")
    x = torch.randn(1, 1, 6, 16, 20)
    fixed, dynamic = tmp_path / "fixed.onnx", tmp_path / "dynamic.onnx"
    kw = {"input_names": ["x"], "output_names": ["y"], "dynamo": dynamo}
    torch.onnx.export(model, (x,), fixed, **kw)
    if dynamo:
        dims = {
            2: torch.export.Dim("z", min=2, max=64),
            3: 2 * torch.export.Dim("y", max=64),
            4: 2 * torch.export.Dim("x", max=64),
        }
        torch.onnx.export(model, (x,), dynamic, dynamic_shapes=(dims,), **kw)
    else:
        torch.onnx.export(model, (x,), dynamic, dynamic_axes={"x": {2: "z", 3: "y", 4: "x"}}, **kw)
    _check(fixed)
    for window in ((5, 12, 14), (7, 20, 18)):
        _check(dynamic, window)
    with torch.no_grad():  # and against torch itself
        xin = torch.randn(1, 1, 5, 12, 14)
        want = model(xin).numpy()
    got = run_graph(load_onnx(dynamic, (5, 12, 14)), xin.numpy(), make_backend("cpu"))
    assert close(got, want)


def test_bad_models_are_refused_with_one_sentence(tmp_path: Path) -> None:
    good = _model(tmp_path / "good.onnx", *SINGLE_OPS["concat_add_mul"])
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(good.read_bytes()[:40])
    with pytest.raises(ValueError, match="not a valid ONNX model"):
        load_onnx(truncated)
    with pytest.raises(FileNotFoundError):
        load_onnx(tmp_path / "missing.onnx")
    flat = _model(tmp_path / "flat.onnx", [helper.make_node("Flatten", ["x"], ["y"])], {})
    with pytest.raises(ValueError, match=r"'Flatten'.*supported: .*Conv"):
        load_onnx(flat)
    x2d = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 7, 9])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "c", "z", "y", "x"])
    g2d = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x2d], [y])
    onnx.save(helper.make_model(g2d), tmp_path / "2d.onnx")
    with pytest.raises(ValueError, match="4 dimensions.*5D input"):
        load_onnx(tmp_path / "2d.onnx")
    x1 = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 5, 7, 9])
    x2 = helper.make_tensor_value_info("x2", TensorProto.FLOAT, [1, 3, 5, 7, 9])
    g2 = helper.make_graph([helper.make_node("Add", ["x", "x2"], ["y"])], "g", [x1, x2], [y])
    onnx.save(helper.make_model(g2), tmp_path / "two.onnx")
    with pytest.raises(ValueError, match="2 inputs"):
        load_onnx(tmp_path / "two.onnx")
    with pytest.raises(ValueError, match="no output 'z'; its outputs are y"):
        load_onnx(good, output_name="z")
    with pytest.raises(ValueError, match="fixed input of .*differs on axis z"):
        load_onnx(good, (6, 7, 9))


def _external(folder: Path, weight_seed: int) -> Path:
    """A one-conv model whose weights sit in `w.data` beside it, as torch's dynamo
    export writes them."""
    folder.mkdir()
    nodes, _ = SINGLE_OPS["conv_pad_anisotropic"]
    rng = np.random.default_rng(weight_seed)
    inits = {"w": rng.standard_normal((4, 3, 1, 3, 3)).astype(np.float32),
             "b": rng.standard_normal(4).astype(np.float32)}
    inline = _model(folder / "inline.onnx", nodes, inits)
    model = onnx.load(str(inline))
    onnx.save_model(model, str(folder / "m.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="w.data", size_threshold=0)
    return folder / "m.onnx"


def test_external_weights_are_read_and_are_part_of_the_digest(tmp_path: Path) -> None:
    first, second = _external(tmp_path / "a", 1), _external(tmp_path / "b", 2)
    assert SINGLE_OPS["conv_pad_anisotropic"][0][0].op_type == "Conv"
    _check(first)  # against onnxruntime, which reads w.data too
    assert load_onnx(first).digest != load_onnx(first.parent / "inline.onnx").digest
    before = load_onnx(first).digest
    assert first.read_bytes() == second.read_bytes()  # the graph names, not holds, weights
    (first.parent / "w.data").write_bytes((second.parent / "w.data").read_bytes())
    assert load_onnx(first).digest != before  # new weights: another model
    (first.parent / "w.data").unlink()
    with pytest.raises(ValueError, match=r"keeps weights in .*w\.data, which does not exist"):
        load_onnx(first)


def test_dynamic_model_needs_a_window(tmp_path: Path) -> None:
    xd = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, "z", "y", "x"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "c", "z", "y", "x"])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [xd], [y])
    onnx.save(helper.make_model(g), tmp_path / "dyn.onnx")
    with pytest.raises(ValueError, match="dynamic spatial input axes.*--window"):
        load_onnx(tmp_path / "dyn.onnx")
    assert load_onnx(tmp_path / "dyn.onnx", (3, 4, 5)).out_window == (3, 4, 5)


def test_reversing_slice_runs_through_index_zero(tmp_path: Path) -> None:
    nodes = [helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["y"])]
    inits = {"st": np.array([-1], np.int64), "en": np.array([-(2**62)], np.int64),
             "ax": np.array([4], np.int64), "sp": np.array([-1], np.int64)}
    _check(_model(tmp_path / "rev.onnx", nodes, inits))


def test_a_settled_model_is_parsed_once_and_read_again_when_it_changes(
    tmp_path: Path, monkeypatch
) -> None:
    """Model files last changed over SETTLED_NS ago are parsed once per process and
    resolved again per window from that parse (constant shape arithmetic remembered);
    new contents (even of the same size) are read again, and a file changed just now is
    never kept, since its clock tick may hide a change."""
    import os

    from znni.model import onnx_cache, onnx_import

    onnx_cache.clear()
    reads = []
    real = onnx_import._read_model
    monkeypatch.setattr(onnx_import, "_read_model", lambda p: reads.append(p) or real(p))
    first, second = _external(tmp_path / "a", 1), _external(tmp_path / "b", 2)
    old = 1_700_000_000
    for f in (first, first.parent / "w.data"):
        os.utime(f, (old, old))
    graphs = [load_onnx(first, w) for w in (None, (5, 7, 9), None)]
    assert len(reads) == 1
    assert len({(g.digest, g.out_window, len(g.nodes)) for g in graphs}) == 1
    _check(first)  # still equal to onnxruntime from the kept parse
    # new weights of the same size, with another old time: read again, another digest
    (first.parent / "w.data").write_bytes((second.parent / "w.data").read_bytes())
    os.utime(first.parent / "w.data", (old + 1, old + 1))
    assert load_onnx(first).digest != graphs[0].digest and len(reads) == 2
    # a file changed just now is read every time
    fresh = _external(tmp_path / "c", 3)
    load_onnx(fresh)
    load_onnx(fresh)
    assert len(reads) == 4
    onnx_cache.clear()


def test_constant_nodes_are_evaluated_once_per_model_and_handed_out_as_copies() -> None:
    """ParsedModel.evaluate runs a constant node once for the same small feeds (the shape
    arithmetic that does not depend on the window), again for other values or large
    feeds, and hands out copies its callers may change."""
    from znni.model.onnx_cache import MEMO_FEED_BYTES, ParsedModel

    parsed = ParsedModel(((1, 1),), None, [], "d")
    runs = []

    def run(value):  # noqa: ANN001, ANN202
        return lambda: runs.append(value) or [np.array(value) * 2]

    a = parsed.evaluate(("o",), {"i": np.array([3])}, run([3]))
    a[0][0] = 99
    b = parsed.evaluate(("o",), {"i": np.array([3])}, run([3]))
    c = parsed.evaluate(("o",), {"i": np.array([4])}, run([4]))
    assert [int(b[0][0]), int(c[0][0])] == [6, 8] and runs == [[3], [4]]
    big = {"i": np.zeros(MEMO_FEED_BYTES // 4 + 1, np.float32)}
    parsed.evaluate(("o",), big, run([0]))
    parsed.evaluate(("o",), big, run([0]))
    assert runs == [[3], [4], [0], [0]]
