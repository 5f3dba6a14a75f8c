"""A torch-exported U-Net on the GPU backend's device: every node on the device (the
stand-in here; a real CUDA device in the @gpu tests) agrees with the CPU backend."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from support.naive import close

from znni.engine.compute.device_stream import download
from znni.engine.compute.graph_device import run_graph_device
from znni.engine.compute.graph_forward import run_graph
from znni.model.onnx_import import load_onnx
from znni.primitives.backends import make_backend
from znni.primitives.gpu.conv_dispatch import release_conv_caches
from znni.primitives.gpu.graph_device import DeviceGraphOps

WINDOW = (6, 16, 20)


def _unet_onnx(path: Path) -> Path:
    """A tiny U-Net: padded convs, a strided conv, instance norm, reflect pad, max pool,
    ConvTranspose, trilinear upsample, concat, softmax; exported with TorchScript."""
    torch = pytest.importorskip("torch")
    nn, f = torch.nn, torch.nn.functional

    class TinyUNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.e1 = nn.Sequential(
                nn.Conv3d(2, 4, 3, padding=1), nn.InstanceNorm3d(4, affine=True), nn.ReLU()
            )
            self.down = nn.Conv3d(4, 6, (1, 2, 2), stride=(1, 2, 2))
            self.e2 = nn.Sequential(nn.Conv3d(6, 6, (1, 3, 3)), nn.InstanceNorm3d(6), nn.ELU())
            self.up = nn.ConvTranspose3d(6, 4, (1, 2, 2), stride=(1, 2, 2))
            self.out = nn.Conv3d(12, 3, 1)

        def forward(self, x):
            a = self.e1(x)
            b = self.e2(f.pad(self.down(a), (1, 1, 1, 1, 0, 0), mode="reflect"))
            u = self.up(b)
            v = f.interpolate(f.max_pool3d(a, (1, 2, 2)), scale_factor=(1, 2, 2), mode="trilinear")
            return torch.softmax(self.out(torch.cat([a, u, v], 1)), 1)

    torch.manual_seed(0)
    model = TinyUNet().eval()
    x = torch.randn(1, 2, *WINDOW)
    torch.onnx.export(model, (x,), path, input_names=["x"], output_names=["y"], dynamo=False)
    return path


@pytest.fixture(scope="module")
def unet_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny U-Net, exported once for this module's tests."""
    return _unet_onnx(tmp_path_factory.mktemp("graph-gpu") / "unet.onnx")


def _compare(unet_onnx: Path, backend_name: str, primitive: str | None = None,
             **options) -> list[tuple[str, int]]:
    """The graph on `backend_name`'s device (every node there, run_graph_device) vs the
    CPU backend's run_graph; the device ops' (op, channel chunks) log."""
    graph = load_onnx(unet_onnx)
    ops = Counter(n.op for n in graph.nodes)
    assert {"pad", "instance_norm", "conv_transpose", "resize", "concat", "softmax"} <= set(ops)
    x = np.random.default_rng(3).standard_normal((2, 2, *WINDOW)).astype(np.float32)
    want = run_graph(graph, x, make_backend("cpu"))
    backend = make_backend(backend_name, **options)
    device = backend.device
    prims = {n.name: primitive for n in graph.nodes if primitive and n.op == "conv"}
    try:
        assert close(run_graph(graph, x, backend, prims), want)  # upload, run, download
        dev_ops = DeviceGraphOps(device)
        xd = dev_ops.to_device(x)
        y = run_graph_device(graph, xd, dev_ops, prims)
        assert close(download(device, y), want)
        dev_ops.free(xd, y)
        dev_ops.close()
        release_conv_caches(device)
        assert device.in_use_bytes == 0
        ran = {op for op, _ in dev_ops.log}
        assert {"pad", "instance_norm", "conv_transpose", "resize", "concat", "softmax"} <= ran
        return dev_ops.log
    finally:
        device.close()


@pytest.mark.parametrize("primitive", [None, "cudnn", "cufft", "gemm-loop"])
def test_unet_on_the_standin_gpu_equals_cpu(unet_onnx: Path, primitive) -> None:
    _compare(unet_onnx, "gpu-standin", primitive)


def test_unet_on_a_small_standin_cap_still_equals_cpu(unet_onnx: Path) -> None:
    log = _compare(unet_onnx, "gpu-standin", memory_cap_bytes=800000)
    assert max(n for _, n in log) >= 2  # some node ran in channel chunks


@pytest.mark.gpu
@pytest.mark.parametrize("primitive", ["cudnn", "cufft", "gemm-loop"])
def test_unet_on_the_gpu_equals_cpu(unet_onnx: Path, primitive) -> None:
    _compare(unet_onnx, "gpu", primitive)
