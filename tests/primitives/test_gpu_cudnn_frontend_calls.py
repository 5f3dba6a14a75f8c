"""CudnnConv's calls into the cuDNN frontend, against a recording fake of its Python API.

No GPU here: the fake `cudnn` module has the frontend's names and keywords as
python/pygraph/pygraph.cpp and python/cudnn/__init__.py (NVIDIA/cudnn-frontend 1.23)
declare them, and a fake array module gives device pointers. What this checks is our
side: the graph we describe (NCDHW strides, dgrad's output dims, pre/post pads, the
fused nodes), the plan filters per precision, the cache, and the pointers and
workspace we pass to `execute`, counted on the device.
"""

from __future__ import annotations

import itertools
import sys
from types import SimpleNamespace

import numpy as np
import pytest
from support.conv_cases import CASES, host_arrays, host_params

from znni.primitives.base import Activation
from znni.primitives.gpu.conv_spec import conv_spec
from znni.primitives.gpu.device import HostDevice

_ptrs = itertools.count(0x7000_0000, 0x1000)


class FakeArray:
    """Shape, dtype, nbytes and a device pointer: what CudnnConv reads of a CuPy array."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.nbytes = int(np.prod(self.shape)) * self.dtype.itemsize
        self.data = SimpleNamespace(ptr=next(_ptrs))

    def copy(self):
        return FakeArray(self.shape, self.dtype)


class FakeXp:
    float32 = np.float32
    cuda = SimpleNamespace(get_current_stream=lambda: SimpleNamespace(ptr=0xABC))

    @staticmethod
    def ascontiguousarray(a, dtype=None):
        if dtype is None or np.dtype(dtype) == a.dtype:
            return a
        return FakeArray(a.shape, dtype)

    asarray = ascontiguousarray


class FakeDevice(HostDevice):
    xp = FakeXp

    def _empty(self, shape, dtype):
        return FakeArray(shape, dtype)


class FakeTensor:
    def __init__(self, graph, **attrs):
        graph.count += 1
        self.uid, self.attrs = graph.count, dict(attrs)

    def set_dim(self, dim):
        self.attrs["dim"] = dim
        return self

    def set_stride(self, stride):
        self.attrs["stride"] = stride
        return self

    def set_output(self, flag):
        self.attrs["output"] = flag
        return self

    def set_data_type(self, dtype):
        self.attrs["data_type"] = dtype
        return self

    def get_uid(self):
        return self.uid


class FakeGraph:
    refuse = False

    def __init__(self, **kw):
        self.kw, self.calls, self.count = kw, [], 0

    def _node(self, op, **kw):
        self.calls.append((op, kw))
        return FakeTensor(self, op=op, **kw)

    def __getattr__(self, op):  # conv_fprop, conv_dgrad, bias, relu, ... -> a node
        if op in {"tensor", "conv_fprop", "conv_dgrad", "bias", "relu", "leaky_relu",
                  "sigmoid", "tanh", "elu"}:
            return lambda **kw: self._node(op, **kw)
        if op in {"validate", "build_operation_graph", "create_execution_plans",
                  "deselect_numeric_notes", "deselect_workspace_greater_than", "build_plans"}:
            return lambda *a: self.calls.append((op, a))
        raise AttributeError(op)

    def check_support(self):
        self.calls.append(("check_support", ()))
        if FakeGraph.refuse:
            raise FAKE.cudnnGraphNotSupportedError("no engine")

    def get_workspace_size(self):
        return 12345

    def execute(self, pack, workspace, handle=None):
        self.calls.append(("execute", (pack, workspace, handle)))


FAKE = SimpleNamespace(
    data_type=SimpleNamespace(FLOAT="f32", HALF="f16", BFLOAT16="bf16"),
    heur_mode=SimpleNamespace(A="A", FALLBACK="FALLBACK"),
    numerical_note=SimpleNamespace(TENSOR_CORE="TC", DOWN_CONVERT_INPUTS="DOWN",
                                   REDUCED_PRECISION_REDUCTION="RPR"),
    cudnnGraphNotSupportedError=type("cudnnGraphNotSupportedError", (RuntimeError,), {}),
    graphs=[],
    streams=[],
    create_handle=lambda: 77,
    destroy_handle=lambda h: None,
)
FAKE.pygraph = lambda **kw: FAKE.graphs.append(FakeGraph(**kw)) or FAKE.graphs[-1]
FAKE.set_stream = lambda handle, stream: FAKE.streams.append((handle, stream))


@pytest.fixture
def lib(monkeypatch):
    from znni.primitives.gpu.cudnn_conv import CudnnConv

    monkeypatch.setitem(sys.modules, "cudnn", FAKE)
    FAKE.graphs.clear()
    FAKE.streams.clear()
    FakeGraph.refuse = False
    dev = FakeDevice(2**30)
    yield CudnnConv(dev, max_graphs=4)
    dev.close()


def fake_inputs(dev, case, precision):
    a = host_arrays(case, precision)
    params = host_params(case, a)
    params["weight"] = FakeArray(a["weight"].shape, a["weight"].dtype)
    params["bias"] = FakeArray(a["bias"].shape, np.float32)
    return FakeArray(a["x"].shape, a["x"].dtype), params


def calls(graph, op):
    return [kw for name, kw in graph.calls if name == op]


def test_a_strict_fp32_conv_graph_is_ncdhw_with_fused_bias_and_relu(lib):
    case = CASES[1]
    x, params = fake_inputs(lib.device, case, "fp32")
    spec = conv_spec(x.shape, params, activation=Activation("relu"), precision="fp32",
                     transposed=False)
    y = lib.run(x, params, spec)
    g = FAKE.graphs[-1]
    assert g.kw["io_data_type"] == "f32" and g.kw["compute_data_type"] == "f32"
    conv = calls(g, "conv_fprop")[0]
    assert conv["pre_padding"] == [1, 1, 0] and conv["post_padding"] == [1, 0, 1]
    assert conv["stride"] == [2, 2, 2] and conv["dilation"] == [1, 1, 1]
    xt = calls(g, "tensor")[0]
    assert xt["dim"] == list(case.x) and xt["stride"] == [4 * 9 * 7 * 8, 9 * 7 * 8, 7 * 8, 8, 1]
    assert [op for op, _ in g.calls if op in ("bias", "relu")] == ["bias", "relu"]
    notes = calls(g, "deselect_numeric_notes")[0][0]
    assert set(notes) == {"TC", "DOWN", "RPR"}  # strict fp32: no TF32 engines
    pack, ws_ptr, handle = calls(g, "execute")[0]
    assert handle == 77 and all(isinstance(p, int) for p in pack.values())
    assert y.data.ptr in pack.values() and x.data.ptr in pack.values()
    assert isinstance(ws_ptr, int) and lib.last_workspace_bytes == 12345
    assert FAKE.streams == [(77, 0xABC)]
    assert lib.device.in_use_bytes == y.nbytes  # workspace and bias cast given back


def test_a_misaligned_view_is_copied_and_the_copy_counted_then_freed(lib):
    x, params = fake_inputs(lib.device, CASES[0], "fp16")
    x.data.ptr += 2  # e.g. a batch slice of an odd-sized fp16 tensor
    spec = conv_spec(x.shape, params, activation=None, precision="fp16", transposed=False)
    lib.device.reset_peak()
    y = lib.run(x, params, spec)
    pack = calls(FAKE.graphs[-1], "execute")[0][0]
    assert x.data.ptr not in pack.values()
    assert all(p % 16 == 0 for p in pack.values())
    assert lib.device.peak_bytes >= y.nbytes + x.nbytes + lib.last_workspace_bytes
    assert lib.device.in_use_bytes == y.nbytes


def test_inputs_the_caller_counts_are_not_counted_again(lib):
    dev = lib.device
    for precision in ("fp32", "fp16"):  # the fp16 bias is cast (a counted temporary)
        x, params = fake_inputs(dev, CASES[0], precision)
        for a in (x, params["weight"], params["bias"]):
            dev.adopt(a, "caller's")
        spec = conv_spec(x.shape, params, activation=None, precision=precision,
                         transposed=False)
        y = lib.run(x, params, spec)
        dev.free(y, x, params["weight"], params["bias"])  # each exactly once
        assert dev.in_use_bytes == 0


def test_tf32_and_fp16_keep_tensor_cores_but_not_reduced_precision_reductions(lib):
    for precision, io in (("tf32", "f32"), ("fp16", "f16"), ("bf16", "bf16")):
        x, params = fake_inputs(lib.device, CASES[0], precision)
        spec = conv_spec(x.shape, params, activation=None, precision=precision, transposed=False)
        lib.device.free(lib.run(x, params, spec))
        g = FAKE.graphs[-1]
        assert g.kw["io_data_type"] == io
        assert calls(g, "deselect_numeric_notes")[0][0] == ["RPR"]
    assert len(FAKE.streams) == 1  # the stream is bound once, not per call


def test_conv_transpose_is_a_dgrad_with_its_output_dims_set(lib):
    case = CASES[4]
    x, params = fake_inputs(lib.device, case, "fp32")
    spec = conv_spec(x.shape, params, activation=None, precision="fp32", transposed=True)
    y = lib.run(x, params, spec)
    g = FAKE.graphs[-1]
    dgrad = calls(g, "conv_dgrad")[0]
    assert dgrad["loss"].attrs["dim"] == list(case.x)
    assert dgrad["filter"].attrs["dim"] == list(case.w)
    assert dgrad["pre_padding"] == [1, 0, 0] and dgrad["post_padding"] == [0, 1, 0]
    dx = calls(g, "bias")[0]["input"]  # the dgrad's output, which cuDNN cannot infer
    assert dx.attrs["dim"] == list(spec.out_shape) == [1, 3, 9, 5, 7]
    assert dx.attrs["stride"] == [3 * 9 * 5 * 7, 9 * 5 * 7, 5 * 7, 7, 1]
    assert y.shape == spec.out_shape and not calls(g, "conv_fprop")


def test_graphs_are_built_once_per_spec_and_bounded(lib):
    for case in CASES[:4] + CASES[:1]:
        x, params = fake_inputs(lib.device, case, "fp32")
        spec = conv_spec(x.shape, params, activation=None, precision="fp32",
                         transposed=case.transposed)
        lib.device.free(lib.run(x, params, spec))
    assert len(FAKE.graphs) == 4 and lib.graphs.hits == 1
    x, params = fake_inputs(lib.device, CASES[5], "fp32")
    spec = conv_spec(x.shape, params, activation=None, precision="fp32", transposed=True)
    lib.device.free(lib.run(x, params, spec))
    assert len(lib.graphs) == 4 and lib.graphs.evictions == 1


def test_a_graph_without_a_plan_is_refused_once_and_counts_nothing(lib):
    FakeGraph.refuse = True
    x, params = fake_inputs(lib.device, CASES[2], "fp16")
    spec = conv_spec(x.shape, params, activation=None, precision="fp16", transposed=False)
    assert lib.run(x, params, spec) is None
    assert lib.run(x, params, spec) is None
    assert len(FAKE.graphs) == 2  # fused, then bare; both refusals cached
    assert "no engine" in lib.unsupported[spec]
    assert lib.device.in_use_bytes == 0


def test_a_refused_fused_graph_runs_bare_with_the_bias_left_out(lib):
    x, params = fake_inputs(lib.device, CASES[2], "fp32")
    spec = conv_spec(x.shape, params, activation=Activation("relu"), precision="fp32",
                     transposed=False)
    FakeGraph.refuse = True
    lib.graphs.get_or_build(spec, lib._build)  # the fused graph has no plan
    FakeGraph.refuse = False
    lib.device.xp = None  # the epilogue's element-wise ops are not faked: stop before them
    with pytest.raises(AttributeError):
        lib.run(x, params, spec)
    bare = FAKE.graphs[-1]
    assert not calls(bare, "bias") and not calls(bare, "relu")
    pack = calls(bare, "execute")[0][0]
    assert params["bias"].data.ptr not in pack.values() and len(pack) == 3
    assert lib.device.in_use_bytes == 0
