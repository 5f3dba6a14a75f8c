"""One network op on a device: its shapes, its memory model, its parameters and its kernel.

The memory model (`workspace_bytes`, `param_bytes`, shapes) is what the
backend sizes sub-batches with; the kernels count their real temporaries
against it (workspace.py), so the model is checked on every CI run.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any

import numpy as np

from znni.primitives.activations import apply_activation
from znni.primitives.base import Activation, Conv, Op, Pool
from znni.primitives.fft_sizes import spectrum_points
from znni.primitives.fragments import fragment_size, fragments_reference
from znni.primitives.gpu.conv import conv_output_size, direct_conv, direct_workspace_bytes
from znni.primitives.gpu.device import Device, nbytes_of
from znni.primitives.gpu.fft_conv import (
    COMPLEX_BYTES,
    fft_conv,
    fft_shape,
    fft_workspace_bytes,
    kernel_spectra,
)
from znni.primitives.gpu.workspace import Workspace
from znni.triple import as_triple

Shape = tuple[int, ...]

# Plan names (planner: "gpu-direct", "gpu-fft"; CPU names map to their GPU peers) -> kernel.
CONV_PRIMITIVES = {
    "gpu-direct": "direct",
    "direct": "direct",
    "cudnn": "direct",
    "gemm": "gemm",
    "gpu-fft": "fft-recompute",
    "fft-recompute": "fft-recompute",
    "fft-keep": "fft-keep",
    "gpu-fft-keep": "fft-keep",
}
FFT_MIN_KERNEL_VOXELS = 216  # ZNNi: cuDNN for small kernels, FFT from about 6^3 up


def resolve_primitive(name: str | None, kernel: tuple[int, int, int]) -> str:
    """The device kernel for a plan's primitive name; None picks by kernel size."""
    if name is None:
        return "fft-recompute" if prod(kernel) >= FFT_MIN_KERNEL_VOXELS else "direct"
    if name not in CONV_PRIMITIVES:
        raise ValueError(
            f"unknown GPU conv primitive {name!r}; expected one of {', '.join(CONV_PRIMITIVES)}"
        )
    return CONV_PRIMITIVES[name]


def alternative(primitive: str) -> str:
    """The other family, tried when a primitive does not fit even one sample."""
    return "direct" if primitive.startswith("fft") else "fft-recompute"


@dataclass(frozen=True, eq=False)
class DeviceOp:
    """A fused op (conv + activation, pool, activation) ready to run on a device."""

    index: int
    op: Op
    act: Activation | None = None
    primitive: str | None = None  # resolved conv kernel: direct, gemm, fft-keep, fft-recompute

    @property
    def tag(self) -> str:
        kind = (
            "conv3d" if isinstance(self.op, Conv) else "mpf" if isinstance(self.op, Pool) else "act"
        )
        return f"{kind}@{self.index}"

    @property
    def batch_factor(self) -> int:
        return prod(self.op.window) if isinstance(self.op, Pool) else 1

    def out_shape(self, shape: Shape) -> Shape:
        s, c = shape[:2]
        n = shape[2:]
        if isinstance(self.op, Conv):
            return (s, self.op.out_channels, *conv_output_size(as_triple(n), self.op.kernel))
        if isinstance(self.op, Pool):
            m = tuple(fragment_size(a, p) for a, p in zip(n, self.op.window, strict=True))
            return (s * prod(self.op.window), c, *m)
        return shape

    def workspace_bytes(self, shape: Shape, batch_bytes: int, cout: int | None = None) -> int:
        """Temporaries beyond input, output and parameters, for `cout` output channels."""
        s, c = shape[:2]
        if isinstance(self.op, Conv):
            n = as_triple(shape[2:])
            cout = self.op.out_channels if cout is None else cout
            if self.primitive in ("direct", "gemm"):
                return direct_workspace_bytes(s, c, cout, n, self.op.kernel)
            keep = self.primitive == "fft-keep"
            return fft_workspace_bytes(s, c, cout, n, keep, batch_bytes)
        if isinstance(self.op, Pool):  # the fragments array, one strided window copy, one max
            out = nbytes_of(self.out_shape(shape))
            return 2 * out + nbytes_of(shape)
        return 2 * nbytes_of(shape)  # a copy and one temporary (leaky_relu, elu)

    def param_bytes(self, shape: Shape, cout: int | None = None) -> int:
        """Weights, bias and kept spectra on the device for `cout` output channels."""
        if not isinstance(self.op, Conv):
            return 0
        cout = self.op.out_channels if cout is None else cout
        cin = self.op.in_channels
        total = (cout * cin * prod(self.op.kernel) + cout) * 4
        if self.primitive == "fft-keep":
            total += spectrum_points(fft_shape(as_triple(shape[2:]))) * cout * cin * COMPLEX_BYTES
        return total


@dataclass
class Params:
    """A conv's parameters on the device, for output channels [o0, o1)."""

    w: Any
    b: Any
    spectra: Any | None
    fshape: tuple[int, int, int] | None

    def arrays(self) -> list[Any]:
        return [a for a in (self.w, self.b, self.spectra) if a is not None]


def upload_params(
    device: Device, dop: DeviceOp, shape: Shape, o0: int = 0, o1: int | None = None
) -> Params | None:
    """Copy a conv's weights (output channels o0:o1) to the device; None for other ops.

    Kept spectra are allocated here and filled by `fill_spectra` on the compute stream.
    """
    if not isinstance(dop.op, Conv):
        return None
    o1 = dop.op.out_channels if o1 is None else o1
    w_host = np.ascontiguousarray(dop.op.weight[o0:o1], dtype=np.float32)
    b_host = np.ascontiguousarray(dop.op.bias[o0:o1], dtype=np.float32)
    params = Params(
        device.alloc(w_host.shape, what="weights"), device.alloc(b_host.shape), None, None
    )
    copy = device.stream("copy")
    for dst, src in ((params.w, w_host), (params.b, b_host)):
        pinned = device.pinned(src.shape)
        np.copyto(pinned, src)
        device.copy_to_device(dst, pinned, copy, f"{dop.tag} weights")
    device.host_wait(device.record(copy))
    if dop.primitive == "fft-keep":
        params.fshape = fft_shape(as_triple(shape[2:]))
        nf = spectrum_points(params.fshape)
        params.spectra = device.alloc((nf, w_host.shape[1], o1 - o0), np.complex64, "spectra")
    return params


def fill_spectra(device: Device, params: Params, batch_bytes: int, ws: Workspace) -> None:
    """Compute kept kernel spectra into their device buffer (runs on the compute stream)."""
    if params.spectra is not None and params.fshape is not None:
        kernel_spectra(device.xp, params.w, params.fshape, batch_bytes, ws, out=params.spectra)


def apply_op(
    device: Device,
    dop: DeviceOp,
    params: Params | None,
    t: Any,
    out: Any,
    ws: Workspace,
    batch_bytes: int,
) -> None:
    """out[...] = dop(t) on the device (conv with fused bias and activation, MPF, activation)."""
    xp = device.xp
    if isinstance(dop.op, Conv):
        assert params is not None  # upload_params gives every conv its parameters
        if dop.primitive == "direct" and device.native_conv3d(t, params.w, params.b, out):
            ran = "cudnn"
        elif dop.primitive in ("direct", "gemm"):
            direct_conv(xp, t, params.w, params.b, out, ws)
            ran = "gemm-loop"
        else:
            fft_conv(xp, t, params.w, params.b, out, ws, batch_bytes, params.spectra)
            ran = "cufft-keep" if params.spectra is not None else "cufft"
        _count(device, ran)
        if dop.act is not None:
            apply_activation(out, dop.act, xp)
    elif isinstance(dop.op, Pool):
        frags = ws.take(fragments_reference(t, dop.op.window, xp))  # (S*P, C, m)
        out[...] = frags
        ws.give(frags)
    else:
        out[...] = t
        apply_activation(out, dop.op, xp)


def _count(device: Device, ran: str) -> None:
    """Count a conv under the name of what really ran (conv_dispatch's per-device tally,
    which reports read), so a GEMM loop is never reported as cuDNN."""
    from znni.primitives.gpu.conv_dispatch import conv_state

    conv_state(device).ran[ran] += 1
