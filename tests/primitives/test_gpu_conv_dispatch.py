"""device_conv on the numpy stand-in device: every primitive against naive references,
precision, fused activations, workspace and cache accounting, allocation failures."""

from __future__ import annotations

import numpy as np
import pytest
from support.conv_cases import (
    CASE_IDS,
    CASES,
    TOL,
    Case,
    host_arrays,
    host_params,
    normwise_error,
    reference,
)

from znni.primitives.base import Activation
from znni.primitives.gpu.conv_dispatch import (
    GPU_CONV_PRIMITIVES,
    conv_state,
    cudnn_available,
    device_conv,
    release_conv_caches,
)
from znni.primitives.gpu.conv_spec import conv_spec
from znni.primitives.gpu.cudnn_standin import CudnnStandin, standin_workspace_bytes
from znni.primitives.gpu.cufft_conv import KeptSpectra, plan_cache_bytes
from znni.primitives.gpu.device import DeviceOutOfMemory, HostDevice

PRECISIONS = ["fp32", "tf32", "fp16", "bf16"]


@pytest.fixture
def device():
    dev = HostDevice(2**28)
    yield dev
    dev.close()


def run(device, primitive, case: Case, precision="fp32", activation=None, key="node@p", seed=0):
    a = host_arrays(case, precision, seed)
    params = host_params(case, a)
    return device_conv(device, primitive, a["x"], params, activation=activation,
                       precision=precision, transposed=case.transposed, key=key)


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("primitive", GPU_CONV_PRIMITIVES)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_every_primitive_matches_the_naive_conv(device, case, primitive, precision):
    y = run(device, primitive, case, precision)
    ref = reference(case, precision)
    assert y.shape == ref.shape
    assert y.dtype == host_arrays(case, precision)["x"].dtype  # the storage dtype
    assert normwise_error(y, ref) <= TOL[precision]
    device.free(y)  # counted by the device: free() refuses arrays it does not count


@pytest.mark.parametrize("primitive", ["cudnn", "cufft", "gemm-loop"])
@pytest.mark.parametrize("kind", ["relu", "leaky_relu", "sigmoid", "tanh", "elu", "linear"])
def test_fused_activation_after_bias(device, kind, primitive):
    case = CASES[0]
    act = Activation(kind, 0.2)
    y = run(device, primitive, case, "fp32", activation=act)
    assert normwise_error(y, reference(case, "fp32", (kind, 0.2))) <= TOL["fp32"]


def test_what_ran_is_named_as_what_it_is(device):
    state = conv_state(device)
    assert cudnn_available(device)
    run(device, "cudnn", CASES[0])
    run(device, "cufft", CASES[1])  # stride 2: not an FFT conv -> cudnn (the stand-in)
    run(device, "gemm-loop", CASES[0])
    assert state.ran == {"cudnn-standin": 2, "gemm-loop": 1}
    assert state.fallbacks == ["cufft -> cudnn: FFT convs take stride 1, dilation 1, one "
                               "group, not transposed"]


def test_a_graph_cudnn_cannot_run_falls_back_to_the_gemm_loop(device):
    lib = CudnnStandin(device)
    lib.unsupported = lambda spec: spec.transposed
    conv_state(device).set_library(lib)
    case = CASES[4]
    y = run(device, "cudnn", case)
    assert normwise_error(y, reference(case, "fp32")) <= TOL["fp32"]
    state = conv_state(device)
    assert state.ran == {"gemm-loop": 1}
    assert state.fallbacks[0].startswith("cudnn-standin -> gemm-loop: no plan for ConvTranspose")
    run(device, "cudnn", case)
    assert lib.graphs.builds == 2 and lib.graphs.hits == 2  # fused and bare refusals cached


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_without_a_fused_plan_the_bare_conv_runs_then_bias_and_activation(device, precision):
    lib = CudnnStandin(device)
    lib.unsupported = lambda spec: spec.has_bias or spec.activation is not None
    conv_state(device).set_library(lib)
    case = CASES[3]
    base = device.in_use_bytes
    y = run(device, "cudnn", case, precision, activation=Activation("leaky_relu", 0.2))
    assert not lib.fused_epilogue
    assert conv_state(device).ran == {"cudnn-standin": 1}
    ref = reference(case, precision, ("leaky_relu", 0.2))
    assert normwise_error(y, ref) <= TOL[precision]
    device.free(y)
    assert device.in_use_bytes == base


def test_without_the_cudnn_frontend_cudnn_runs_the_gemm_loop_and_says_so(monkeypatch):
    import sys

    from znni.primitives.gpu import conv_dispatch

    class NotTheStandin:  # the device is not recognised as the stand-in: import cudnn
        pass

    monkeypatch.setattr(conv_dispatch, "HostDevice", NotTheStandin)
    monkeypatch.setitem(sys.modules, "cudnn", None)  # import cudnn raises ImportError
    dev = HostDevice(2**28)
    assert not cudnn_available(dev)
    run(dev, "cudnn", CASES[0])
    state = conv_state(dev)
    assert state.ran == {"gemm-loop": 1}
    assert "cuDNN frontend is not installed" in state.fallbacks[0]
    assert "znni[gpu-cuda13]" in state.fallbacks[0]


def test_the_cudnn_workspace_is_allocated_from_the_device_and_counted(device):
    case = CASES[1]
    a = host_arrays(case, "fp16")
    spec = conv_spec(case.x, host_params(case, a), activation=None, precision="fp16",
                     transposed=False)
    ws = standin_workspace_bytes(spec)
    assert ws > 0
    device.reset_peak()
    before = device.in_use_bytes
    y = run(device, "cudnn", case, "fp16")
    lib = conv_state(device).library(device)
    assert lib.last_workspace_bytes == ws
    assert device.peak_bytes - before >= ws + y.nbytes
    assert device.in_use_bytes - before == y.nbytes  # the workspace is given back


def test_the_graph_cache_is_bounded_in_count_and_keyed_by_everything_that_shapes_it(device):
    lib = CudnnStandin(device, max_graphs=2)
    conv_state(device).set_library(lib)
    for case in CASES[:3]:
        run(device, "cudnn", case)
    assert len(lib.graphs) == 2 and lib.graphs.evictions == 1
    run(device, "cudnn", CASES[2])
    assert lib.graphs.hits == 1
    run(device, "cudnn", CASES[2], "fp16")  # another io dtype: another graph
    run(device, "cudnn", CASES[2], activation=Activation("relu"))  # another fusion
    run(device, "cudnn", CASES[2], "tf32")  # TF32 allowed: another graph
    assert lib.graphs.builds == 6 and len(lib.graphs) == 2


def test_kept_spectra_are_reused_bounded_in_bytes_and_counted(device):
    state = conv_state(device)
    case = CASES[0]
    run(device, "cufft-keep", case, key="a")
    one = state.spectra.counted_bytes
    assert one > 0 and len(state.spectra.lru) == 1
    run(device, "cufft-keep", case, key="a")
    assert state.spectra.counted_bytes == one  # taken from the cache, not recomputed
    state.spectra = KeptSpectra(device, int(one * 1.5))  # room for one set only
    base = device.in_use_bytes
    for key in ("a", "b", "c"):
        y = run(device, "cufft-keep", case, key=key)
        device.free(y)
    assert len(state.spectra.lru) == 1 and state.spectra.counted_bytes == one
    assert device.in_use_bytes == base + one
    run(device, "cufft-keep", case, key="")  # no identity: nothing kept
    assert len(state.spectra.lru) == 1


def test_release_conv_caches_gives_every_byte_back(device):
    base = device.in_use_bytes
    y = run(device, "cufft-keep", CASES[0])
    device.free(y)
    assert device.in_use_bytes == base + conv_state(device).spectra.counted_bytes + \
        plan_cache_bytes(device)
    release_conv_caches(device)
    assert device.in_use_bytes == base


@pytest.mark.parametrize("primitive", GPU_CONV_PRIMITIVES)
def test_a_cap_too_small_raises_device_out_of_memory_leaving_nothing_counted(primitive):
    case = CASES[0]
    a = host_arrays(case, "fp32")
    spec = conv_spec(case.x, host_params(case, a), activation=None, precision="fp32",
                     transposed=False)
    out_bytes = int(np.prod(spec.out_shape)) * 4
    dev = HostDevice(out_bytes * 3)  # the output alone fits; its workspace does not
    with pytest.raises(DeviceOutOfMemory):
        run(dev, primitive, case)
    assert dev.in_use_bytes == conv_state(dev).plans.reserved_bytes


def test_an_allocation_failure_inside_cudnn_becomes_device_out_of_memory(device):
    lib = CudnnStandin(device)
    conv_state(device).set_library(lib)
    lib.fail_executes = 1
    before = device.in_use_bytes
    with pytest.raises(DeviceOutOfMemory, match="injected"):
        run(device, "cudnn", CASES[3], "bf16")
    assert device.in_use_bytes == before
    y = run(device, "cudnn", CASES[3], "bf16")  # the next call succeeds
    assert normwise_error(y, reference(CASES[3], "bf16")) <= TOL["bf16"]


def _peak_need(primitive: str, case: Case, cap: int) -> int:
    """Device bytes one call needs beyond what is already counted (measured)."""
    dev = HostDevice(cap)
    dev.free(run(dev, primitive, case))  # the plan-cache bound is reserved once
    dev.reset_peak()
    before = dev.in_use_bytes
    dev.free(run(dev, primitive, case))
    return dev.peak_bytes - before


def test_kept_spectra_are_given_back_when_memory_runs_short():
    case, cap = CASES[0], 2**22
    need = _peak_need("cufft", case, cap)
    dev = HostDevice(cap)
    dev.free(run(dev, "cufft-keep", case, key="a"))
    kept = conv_state(dev).spectra.counted_bytes
    assert kept > 0
    free = dev.memory_cap_bytes - dev.in_use_bytes
    hog = dev.alloc((free - need + kept // 2,), np.uint8)  # fits only without the spectra
    y = run(dev, "cufft", case)
    assert conv_state(dev).spectra.counted_bytes == 0
    assert normwise_error(y, reference(case, "fp32")) <= TOL["fp32"]
    dev.free(hog, y)


def test_bad_input_is_refused_with_the_offending_values(device):
    case = CASES[0]
    a = host_arrays(case, "fp32")
    with pytest.raises(ValueError, match="unknown GPU conv primitive 'cudnn-v7'"):
        device_conv(device, "cudnn-v7", a["x"], host_params(case, a))
    with pytest.raises(TypeError, match="stores float16, got input float32"):
        device_conv(device, "cudnn", a["x"], host_params(case, a), precision="fp16")
    with pytest.raises(ValueError, match="precision 'fp8'"):
        device_conv(device, "cudnn", a["x"], host_params(case, a), precision="fp8")
    p = host_params(case, a) | {"group": 2}
    with pytest.raises(ValueError, match="group 2 does not divide the 3 input channels"):
        device_conv(device, "cudnn", a["x"], p)


def test_closing_the_conv_state_gives_back_its_memory(device):
    from znni.primitives.gpu.conv_dispatch import close_conv_state

    base = device.in_use_bytes
    device.free(run(device, "cufft-keep", CASES[0]))
    assert device.in_use_bytes > base
    close_conv_state(device)
    assert device.in_use_bytes == base
    close_conv_state(device)  # twice is harmless


def test_the_precision_switches_cublas_tf32_for_the_device(device):
    run(device, "gemm-loop", CASES[0], "tf32")
    assert device.tf32
    run(device, "gemm-loop", CASES[0], "fp32")
    assert not device.tf32
