"""A sequential spec as a graph: the window (strided) network against the brute-force one,
and the same network exported from torch's nn.Sequential to ONNX gives the same output."""

from __future__ import annotations

import json

import numpy as np
import pytest
from support.naive import close, naive_fov, naive_strided_network, random_network

from znni.engine.compute.graph_forward import run_graph
from znni.model import load_network
from znni.model.graph import graph_from_network
from znni.model.onnx_import import load_onnx
from znni.primitives.backends import make_backend


def _network(tmp_path, layers, params, cin):
    spec = tmp_path / "net.json"
    spec.write_text(json.dumps({"in_channels": cin, "weights": "w.npz", "layers": layers}))
    np.savez(tmp_path / "w.npz", **params)
    return load_network(spec)


def _window(net, rng) -> tuple[int, int, int]:
    size = net.input_size_for(tuple(int(v) for v in rng.integers(1, 3, size=3)))
    return (size[0], size[1], size[2])


@pytest.mark.parametrize("seed", range(8))
def test_sequential_graph_equals_the_strided_network(tmp_path, seed) -> None:
    rng = np.random.default_rng(seed)
    cin = int(rng.integers(1, 3))
    layers, params = random_network(rng, cin, max_pools=2)
    net = _network(tmp_path, layers, params, cin)
    window = _window(net, rng)
    graph = graph_from_network(net, window)
    x = rng.standard_normal((1, cin, *window)).astype(np.float32)
    got = run_graph(graph, x, make_backend("cpu"))
    ref = naive_strided_network(layers, params, x[0].astype(np.float64))
    assert got.shape[1:] == ref.shape == (graph.out_channels, *graph.out_window)
    assert close(got[0], ref)
    assert min(window) >= min(naive_fov(layers))


def test_sequential_exported_to_onnx_equals_the_json_spec(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    layers, params = random_network(rng, 2, max_pools=2)
    net = _network(tmp_path, layers, params, 2)
    mods = []
    for i, layer in enumerate(layers):
        kind = layer["kind"]
        if kind == "conv":
            w = params[f"{i}.weight"]
            conv = torch.nn.Conv3d(w.shape[1], w.shape[0], w.shape[2:])
            conv.weight.data, conv.bias.data = (
                torch.from_numpy(w),
                torch.from_numpy(params[f"{i}.bias"]),
            )
            mods.append(conv)
        elif kind == "maxpool":
            mods.append(torch.nn.MaxPool3d(layer["window"]))
        else:
            mods.append(
                {
                    "relu": torch.nn.ReLU(),
                    "sigmoid": torch.nn.Sigmoid(),
                    "tanh": torch.nn.Tanh(),
                    "elu": torch.nn.ELU(),
                    "leaky_relu": torch.nn.LeakyReLU(layer.get("slope", 0.01)),
                    "linear": torch.nn.Identity(),
                }[kind]
            )
    window = _window(net, rng)
    path = tmp_path / "seq.onnx"
    torch.onnx.export(
        torch.nn.Sequential(*mods).eval(),
        (torch.zeros(1, 2, *window),),
        path,
        input_names=["x"],
        dynamo=False,
    )
    x = rng.standard_normal((1, 2, *window)).astype(np.float32)
    backend = make_backend("cpu")
    from_onnx = run_graph(load_onnx(path), x, backend)
    from_json = run_graph(graph_from_network(net, window), x, backend)
    assert close(from_onnx, from_json)


def test_wrong_window_is_refused(tmp_path) -> None:
    rng = np.random.default_rng(0)
    layers, params = random_network(rng, 1, max_pools=1)
    net = _network(tmp_path, layers, params, 1)
    graph = graph_from_network(net, _window(net, rng))
    with pytest.raises(ValueError, match="runs on"):
        run_graph(graph, np.zeros((1, 1, 3, 3, 3), np.float32), make_backend("cpu"))


def test_in_place_activations_never_touch_live_or_caller_arrays() -> None:
    """relu may overwrite a dying tensor, but not the caller's input, nor an array that a
    live name still shares (identity aliases its input)."""
    from znni.model.graph import Graph, Node

    nodes = (
        Node("r", "relu", ("x",), ("a",)),  # x is the caller's: must stay untouched
        Node("i", "identity", ("a",), ("b",)),  # b is a's very array
        Node("s", "sigmoid", ("b",), ("c",)),  # b dies here but a lives on: no overwrite
        Node("cat", "concat", ("a", "c"), ("y",)),
    )
    shapes = {"x": (1, 1, 2, 3, 4), "a": (1, 1, 2, 3, 4), "b": (1, 1, 2, 3, 4),
              "c": (1, 1, 2, 3, 4), "y": (1, 2, 2, 3, 4)}
    graph = Graph("alias", "x", 1, (2, 3, 4), nodes, "y", 2, (2, 3, 4), "d", shapes)
    x = np.random.default_rng(0).standard_normal((1, 1, 2, 3, 4)).astype(np.float32)
    before = x.copy()
    y = run_graph(graph, x, make_backend("reference"))
    relu = np.maximum(before, 0)
    assert np.array_equal(x, before)
    assert np.allclose(y[:, :1], relu) and np.allclose(y[:, 1:], 1 / (1 + np.exp(-relu)))


def test_in_place_activations_never_touch_arrays_that_slices_view() -> None:
    """Slices (crops) are views: relu may not overwrite a dying tensor that a live slice
    still views, nor a slice of the caller's input."""
    from znni.model.graph import Graph, Node

    full = [(0, 1, 1), (0, 1, 1)]
    crop = {"slices": full + [(1, 2, 1), (0, 3, 1), (0, 4, 1)]}  # (1, 1, 1, 3, 4), contiguous
    nodes = (
        Node("xs", "slice", ("x",), ("xc",), crop),  # views the caller's x
        Node("t", "sigmoid", ("x",), ("a",)),  # the last reader of x
        Node("rx", "relu", ("xc",), ("xr",)),  # xc dies here: it is x's memory all the same
        Node("as", "slice", ("a",), ("ac",), crop),  # views a
        Node("ra", "relu", ("a",), ("ar",)),  # a dies here, but ac lives on
        Node("tr", "tanh", ("ar",), ("at",)),
        Node("cat", "concat", ("xr", "ac"), ("y",)),
    )
    small, big = (1, 1, 1, 3, 4), (1, 1, 2, 3, 4)
    shapes = {"x": big, "xc": small, "xr": small, "a": big, "ac": small, "ar": big,
              "at": big, "y": (1, 2, 1, 3, 4)}
    graph = Graph("views", "x", 1, (2, 3, 4), nodes, "y", 2, (1, 3, 4), "d", shapes)
    x = np.random.default_rng(1).standard_normal(big).astype(np.float32) - 0.5
    before = x.copy()
    y = run_graph(graph, x, make_backend("reference"))
    window = (slice(None), slice(None), slice(1, 2))
    assert np.array_equal(x, before)
    assert np.allclose(y[:, :1], np.maximum(before[window], 0))
    assert np.allclose(y[:, 1:], 1 / (1 + np.exp(-before[window])))


def test_peak_bytes_follow_the_executors_buffers() -> None:
    """Graph.peak_tensor_bytes counts buffers as run_graph holds them: in-place ops reuse
    a dying tensor's buffer, slices view their source and keep its buffer alive."""
    from znni.engine.compute.graph_forward import INPLACE
    from znni.model.graph import IN_PLACE_OPS, Graph, Node

    assert set(INPLACE) == set(IN_PLACE_OPS)
    half = {"slices": [(0, 1, 1), (0, 1, 1), (0, 2, 1), (0, 4, 1), (0, 4, 1)]}
    nodes = (
        Node("r", "relu", ("x",), ("a",)),  # a new buffer A: x is the caller's
        Node("s", "sigmoid", ("a",), ("b",)),  # in place: b is A
        Node("sl", "slice", ("b",), ("c",), half),  # a view of A
        Node("t", "tanh", ("b",), ("d",)),  # b dies, but c still views A: a new buffer D
        Node("sl2", "slice", ("d",), ("e",), half),
        Node("cat", "concat", ("c", "e"), ("y",)),  # A, D and y at once
    )
    whole, part = (1, 1, 4, 4, 4), (1, 1, 2, 4, 4)
    shapes = {"x": whole, "a": whole, "b": whole, "c": part, "d": whole, "e": part,
              "y": (1, 2, 2, 4, 4)}
    graph = Graph("buffers", "x", 1, (4, 4, 4), nodes, "y", 2, (2, 4, 4), "d", shapes)
    assert graph.peak_tensor_bytes() == 4 * 64 * 4  # x (held through the pass), A, D, y


def _conv3(rng, name, src, out, cin, cout, pads):  # noqa: ANN001, ANN202
    """A stride-one 3^3 conv node with random weights and bias, `pads` as ONNX orders them."""
    from znni.model.graph import Node

    w = (rng.standard_normal((cout, cin, 3, 3, 3)) / np.sqrt(cin * 27)).astype(np.float32)
    params = {"weight": w, "bias": rng.standard_normal(cout).astype(np.float32),
              "strides": (1, 1, 1), "pads": pads, "dilations": (1, 1, 1), "group": 1}
    return Node(name, "conv", (src,), (out,), params)


@pytest.mark.parametrize("plan", ["winograd", "direct", None])
def test_padded_convs_and_concats_read_in_place_equal_the_reference(plan, monkeypatch) -> None:
    """A decoder step (skip and upsampled concatenated, then a padded 3^3 conv): with
    Winograd the concat is never built and the pads never written (ChannelParts), with
    other primitives the padded concatenation is built once; all equal the reference."""
    from znni.model.graph import Graph, Node

    rng = np.random.default_rng(5)

    def conv(name, src, out, cin, cout, pads):  # noqa: ANN202
        return _conv3(rng, name, src, out, cin, cout, pads)

    nodes = (
        conv("a", "x", "ta", 2, 3, (1, 0, 1, 1, 2, 1)),  # anisotropic pads
        Node("ra", "relu", ("ta",), ("a",)),
        conv("b", "a", "b", 3, 2, (1,) * 6),
        Node("cat", "concat", ("a", "b"), ("c",)),
        conv("c", "c", "tc", 5, 4, (1, 1, 0, 1, 1, 0)),
        Node("rc", "relu", ("tc",), ("y",)),
    )
    win, mid, end = (7, 6, 9), (7, 6, 9), (7, 6, 7)
    shapes = {"x": (1, 2, *win), "ta": (1, 3, *mid), "a": (1, 3, *mid), "b": (1, 2, *mid),
              "c": (1, 5, *mid), "tc": (1, 4, *end), "y": (1, 4, *end)}
    graph = Graph("decoder", "x", 2, win, nodes, "y", 4, end, "d", shapes)
    x = rng.standard_normal((1, 2, *win)).astype(np.float32)
    want = run_graph(graph, x, make_backend("reference"))
    prims = None if plan is None else {"a": plan, "b": "direct", "c": plan}
    if plan == "winograd":  # conv c's concatenation and pads must never be built
        from znni.primitives.cpu import graph_ops

        def built(*args, **kw):  # noqa: ANN002, ANN003, ANN202
            raise AssertionError("the concat was built")

        monkeypatch.setattr(graph_ops, "concat_channels", built)
    got = run_graph(graph, x, make_backend("cpu", threads=2), prims)
    assert got.shape == want.shape == (1, 4, *end)
    assert close(got, want)


def test_peak_bytes_of_a_concat_read_in_parts() -> None:
    """A concat the Winograd conv after it reads part by part takes no buffer, and its
    inputs live on to that conv (ChannelParts); built, it is a buffer of its own."""
    from znni.model.graph import Graph, Node, concat_read_in_parts, reader_counts

    w = np.zeros((1, 2, 3, 3, 3), np.float32)
    conv = {"weight": w, "bias": None, "strides": (1, 1, 1), "pads": (0,) * 6,
            "dilations": (1, 1, 1), "group": 1}
    nodes = (
        Node("r", "relu", ("x",), ("a",)),  # a: 256 bytes; x (256) is held through the pass
        Node("s", "sigmoid", ("a",), ("b",)),  # a lives on: b is a new 256
        Node("cat", "concat", ("a", "b"), ("c",)),  # 512 bytes, or none
        Node("k", "conv", ("c",), ("y",), conv),  # 32 bytes
    )
    one = (1, 1, 4, 4, 4)
    shapes = {"x": one, "a": one, "b": one, "c": (1, 2, 4, 4, 4), "y": (1, 1, 2, 2, 2)}
    graph = Graph("parts", "x", 1, (4, 4, 4), nodes, "y", 1, (2, 2, 2), "d", shapes)
    readers = reader_counts(graph)
    assert concat_read_in_parts(graph, 2, readers, "winograd")
    assert not concat_read_in_parts(graph, 2, readers, "direct")
    assert graph.peak_tensor_bytes() == 256 + 256 + 256 + 512
    assert graph.peak_tensor_bytes(unbuilt=frozenset({"c"})) == 256 + 256 + 256 + 32


def test_openvino_convs_hand_on_channels_last_only_to_openvino_readers(monkeypatch) -> None:
    """a -> b, a -> c: a's output, read only by OpenVINO convs b and c, stays channels-last
    (two readers: no chain); b's and c's outputs are the parts of a concat that OpenVINO conv
    e reads, so they stay channels-last too; the graph's output comes back channels-first.
    The whole pass equals the reference (skipped without OpenVINO)."""
    pytest.importorskip("openvino")
    from znni.model.graph import Graph, Node, reader_counts
    from znni.model.openvino_layers import channels_last_convs
    from znni.primitives.cpu.backend import CpuBackend

    rng = np.random.default_rng(8)

    def conv(name, src, out, cin, cout, pads):  # noqa: ANN202
        return _conv3(rng, name, src, out, cin, cout, pads)

    nodes = (
        conv("a", "x", "ta", 2, 3, (1, 0, 1, 1, 2, 1)),  # anisotropic pads
        Node("ra", "relu", ("ta",), ("a",)),
        conv("b", "a", "tb", 3, 3, (1,) * 6),
        Node("rb", "relu", ("tb",), ("b",)),
        conv("c", "a", "c", 3, 2, (1,) * 6),
        Node("cat", "concat", ("b", "c"), ("d",)),
        conv("e", "d", "y", 5, 4, (1, 1, 0, 1, 1, 0)),
    )
    win, end = (7, 6, 9), (7, 6, 7)
    mid = {t: (1, c, *win) for t, c in
           (("ta", 3), ("a", 3), ("tb", 3), ("b", 3), ("c", 2), ("d", 5))}
    graph = Graph("chain", "x", 2, win, nodes, "y", 4, end, "d", {
        "x": (1, 2, *win), **mid, "y": (1, 4, *end)})
    prims = {n.name: "openvino" for n in nodes if n.op == "conv"}
    by_index = {i: prims.get(n.name) for i, n in enumerate(nodes)}
    assert channels_last_convs(graph, reader_counts(graph), by_index.get) == {0, 2, 4}
    calls = []
    real = CpuBackend.conv3d_parts

    def spy(self, parts, *args, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        calls.append((kw.get("channels_last", args[6] if len(args) > 6 else False),
                      all(p.flags.c_contiguous for p in parts)))
        return real(self, parts, *args, **kw)

    monkeypatch.setattr(CpuBackend, "conv3d_parts", spy)
    x = rng.standard_normal((2, 2, *win)).astype(np.float32)
    got = run_graph(graph, x, make_backend("cpu", threads=2), prims)
    assert [flag for flag, _ in calls] == [True, True, True, False]
    assert [plain for _, plain in calls] == [True, False, False, False]  # all but a: as they lie
    assert got.flags.c_contiguous
    assert close(got, run_graph(graph, x, make_backend("reference")))


@pytest.mark.parametrize("tail_reader", ["openvino", "winograd"])
def test_openvino_chains_run_in_one_call_and_equal_the_reference(tail_reader, monkeypatch) -> None:
    """x -> a (norm, leaky relu) -> b (relu) -> c, each the only reader of the one before,
    all OpenVINO: one call of three steps with anisotropic pads; c's output goes on to a
    concat with x, read by conv d on `tail_reader`. Equals the reference pass."""
    pytest.importorskip("openvino")
    from znni.model.graph import Graph, Node, reader_counts
    from znni.model.openvino_layers import openvino_chains
    from znni.primitives.cpu.backend import CpuBackend

    rng = np.random.default_rng(11)
    norm = {"scale": rng.random(3).astype(np.float32) + 0.5,
            "bias": rng.standard_normal(3).astype(np.float32), "epsilon": 1e-5}
    nodes = (
        _conv3(rng, "a", "x", "ta", 2, 3, (1, 0, 1, 1, 2, 1)),
        Node("na", "instance_norm", ("ta",), ("na",), norm),
        Node("ra", "leaky_relu", ("na",), ("a",), {"alpha": 0.1}),
        _conv3(rng, "b", "a", "tb", 3, 4, (1,) * 6),
        Node("rb", "relu", ("tb",), ("b",)),
        _conv3(rng, "c", "b", "c", 4, 2, (1, 1, 0, 1, 1, 2)),
        Node("cat", "concat", ("x", "c"), ("d",)),
        _conv3(rng, "d", "d", "y", 4, 3, (1,) * 6),
    )
    win = (7, 6, 9)
    mid = {t: (1, c, *win) for t, c in (("ta", 3), ("na", 3), ("a", 3), ("tb", 4), ("b", 4),
                                         ("c", 2), ("d", 4))}
    graph = Graph("chain3", "x", 2, win, nodes, "y", 3, win, "d",
                  {"x": (1, 2, *win), **mid, "y": (1, 3, *win)})
    prims = {"a": "openvino", "b": "openvino", "c": "openvino", "d": tail_reader}
    index = {i: prims.get(n.name) for i, n in enumerate(nodes)}
    assert openvino_chains(graph, reader_counts(graph), index.get) == {0: (0, 3, 5)}
    chained, real = [], CpuBackend.conv3d_chain

    def spy(self, parts, steps, *args):  # noqa: ANN001, ANN002, ANN202
        chained.append([(st.weight.shape, st.pads, st.norm is not None, st.act) for st in steps])
        return real(self, parts, steps, *args)

    monkeypatch.setattr(CpuBackend, "conv3d_chain", spy)
    x = rng.standard_normal((2, 2, *win)).astype(np.float32)
    got = run_graph(graph, x, make_backend("cpu", threads=2), prims)
    assert len(chained) == 1 and [s[0][:2] for s in chained[0]] == [(3, 2), (4, 3), (2, 4)]
    assert [s[1] for s in chained[0]] == [(1, 0, 1, 1, 2, 1), (1,) * 6, (1, 1, 0, 1, 1, 2)]
    assert [s[2] for s in chained[0]] == [True, False, False]
    assert [a.kind if a else None for *_, a in chained[0]] == ["leaky_relu", "relu", None]
    assert close(got, run_graph(graph, x, make_backend("reference")))



@pytest.mark.parametrize("pool_reader", ["openvino", "winograd"])
def test_channels_last_goes_through_pools_crops_and_upsampling(pool_reader, monkeypatch) -> None:
    """A valid U-Net level: a -> max pool -> b -> 2^3 transposed conv, a -> crop, both into
    concat -> c. With b on OpenVINO, a's and b's outputs stay channels-last through the pool,
    the crop and the upsampling (every reader takes them as they lie) and c reads its parts
    channels-last; with b on Winograd nothing does (the pool's reader would not). The pass
    equals the reference either way, on odd anisotropic sizes (skipped without OpenVINO)."""
    pytest.importorskip("openvino")
    from znni.model.graph import Graph, Node, reader_counts
    from znni.model.openvino_layers import channels_last_convs
    from znni.primitives.cpu.backend import CpuBackend

    rng = np.random.default_rng(9)
    up_w = (rng.standard_normal((4, 3, 2, 2, 2)) / 4).astype(np.float32)
    up = {"weight": up_w, "bias": rng.standard_normal(3).astype(np.float32),
          "strides": (2, 2, 2), "pads": (0,) * 6, "output_padding": (0, 0, 0),
          "dilations": (1, 1, 1), "group": 1}
    pool = {"kernel": (2, 2, 2), "strides": (2, 2, 2), "pads": (0,) * 6, "ceil_mode": False,
            "dilations": (1, 1, 1)}
    crop = {"slices": ((0, 2, 1), (0, 3, 1), (0, 10, 1), (0, 10, 1), (1, 13, 1))}
    nodes = (
        _conv3(rng, "a", "x", "ta", 2, 3, (0,) * 6),
        Node("ra", "relu", ("ta",), ("a",)),
        Node("pool", "maxpool", ("a",), ("p",), pool),
        _conv3(rng, "b", "p", "tb", 3, 4, (1,) * 6),
        Node("rb", "relu", ("tb",), ("b",)),
        Node("up", "conv_transpose", ("b",), ("u",), up),
        Node("crop", "slice", ("a",), ("s",), crop),
        Node("cat", "concat", ("s", "u"), ("d",)),
        _conv3(rng, "c", "d", "y", 6, 2, (0, 1, 0, 0, 1, 1)),
    )
    win, a_win = (13, 12, 15), (11, 10, 13)
    shapes = {"x": (1, 2, *win), "ta": (1, 3, *a_win), "a": (1, 3, *a_win),
              "p": (1, 3, 5, 5, 6), "tb": (1, 4, 5, 5, 6), "b": (1, 4, 5, 5, 6),
              "u": (1, 3, 10, 10, 12), "s": (1, 3, 10, 10, 12), "d": (1, 6, 10, 10, 12),
              "y": (1, 2, 8, 10, 11)}
    graph = Graph("level", "x", 2, win, nodes, "y", 2, (8, 10, 11), "d", shapes)
    prims = {"a": "openvino", "b": pool_reader, "c": "openvino"}
    by_index = {i: prims.get(n.name) for i, n in enumerate(nodes)}
    want = {0, 3} if pool_reader == "openvino" else set()
    assert channels_last_convs(graph, reader_counts(graph), by_index.get) == want
    layouts = []
    real = CpuBackend.conv3d_parts

    def spy(self, parts, *args, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        layouts.append([p.strides[1] == p.itemsize for p in parts])  # channels innermost
        return real(self, parts, *args, **kw)

    monkeypatch.setattr(CpuBackend, "conv3d_parts", spy)
    x = rng.standard_normal((2, 2, *win)).astype(np.float32)
    got = run_graph(graph, x, make_backend("cpu", threads=2), prims)
    if pool_reader == "openvino":  # b reads the pool's output, c the crop and upsampling
        assert layouts == [[False], [True], [True, True]]
    assert got.flags.c_contiguous
    assert close(got, run_graph(graph, x, make_backend("reference")))
