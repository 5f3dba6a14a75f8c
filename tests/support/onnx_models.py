"""ONNX test models, each built and exported once per session (the `onnx_models` fixture in
tests/conftest.py): every test that names a model gets the same module and a copy of the
same exported file, so the export (torch's TorchScript exporter) runs once, not per test."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

Window = tuple[int, int, int]


def _unets() -> tuple[Any, Any]:
    """MONAI's BasicUNet, then a UNet with batch norm of non-trivial statistics (seed 0)."""
    import torch
    from monai.networks.nets import BasicUNet, UNet

    torch.manual_seed(0)
    basic = BasicUNet(spatial_dims=3, in_channels=1, out_channels=2, features=(4, 4, 8, 8, 16, 4))
    unet = UNet(spatial_dims=3, in_channels=1, out_channels=3, channels=(4, 8, 8),
                strides=(2, 2), num_res_units=1, norm="batch")
    for m in unet.modules():
        if isinstance(m, torch.nn.BatchNorm3d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    return basic, unet


def _chain(out_channels: int) -> Any:
    """Conv3d(1, out_channels, 3) then ReLU (seed 0): an exact-mode ONNX network."""
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv3d(1, out_channels, 3), torch.nn.ReLU())


def valid_unet() -> Any:
    """funkelab-style valid U-Net (seed 1): valid convs, an anisotropic pool, a transposed
    conv, a centre crop; an exact-mode ONNX network with size factor (1, 2, 2)."""
    import torch

    nn = torch.nn

    class ValidUNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1, self.c2 = nn.Conv3d(1, 4, (1, 3, 3)), nn.Conv3d(4, 4, 3)
            self.c3, self.c4 = nn.Conv3d(4, 6, 3), nn.Conv3d(6, 6, (1, 3, 3))
            self.up = nn.ConvTranspose3d(6, 4, (1, 2, 2), stride=(1, 2, 2))
            self.c5, self.out = nn.Conv3d(8, 4, 3), nn.Conv3d(4, 2, 1)

        def forward(self, x):
            a = torch.relu(self.c2(torch.relu(self.c1(x))))
            b = torch.relu(self.c4(torch.relu(self.c3(nn.functional.max_pool3d(a, (1, 2, 2))))))
            u = self.up(b)
            o = [(s - t) // 2 for s, t in zip(a.shape[2:], u.shape[2:])]
            crop = a[:, :, o[0]:o[0] + u.shape[2], o[1]:o[1] + u.shape[3],
                     o[2]:o[2] + u.shape[4]]
            return torch.sigmoid(self.out(torch.relu(self.c5(torch.cat([crop, u], 1)))))

    torch.manual_seed(1)
    return ValidUNet().eval()


# name -> (the module's builder, the window it is exported at, with dynamic spatial axes)
MODELS: dict[str, tuple[Callable[[], Any], Window]] = {
    "basicunet": (lambda: _unets()[0], (16, 32, 32)),
    "unet": (lambda: _unets()[1], (8, 16, 12)),
    "validunet": (valid_unet, (12, 24, 24)),
    "chain": (lambda: _chain(2), (8, 8, 8)),
    "chain3": (lambda: _chain(3), (8, 8, 8)),
}


def export(model: Any, path: Path, window: Window) -> Path:
    """`model` in eval mode as ONNX at `path`: input "x" of (1, 1, *window), spatial axes
    dynamic, TorchScript exporter."""
    import torch

    torch.onnx.export(
        model.eval(), (torch.zeros(1, 1, *window),), path, input_names=["x"], dynamo=False,
        dynamic_axes={"x": {2: "z", 3: "y", 4: "x"}},
    )
    return path


class OnnxModels:
    """The session's models by name (`MODELS`), built and exported on first use into
    `folder`. Tests read the modules and copy the files; they change neither."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._modules: dict[str, Any] = {}
        self._paths: dict[str, Path] = {}

    def module(self, name: str) -> Any:
        if name not in self._modules:
            self._modules[name] = MODELS[name][0]().eval()
        return self._modules[name]

    def window(self, name: str) -> Window:
        return MODELS[name][1]

    def path(self, name: str) -> Path:
        """The exported file (shared: copy it before handing it to code that may write)."""
        if name not in self._paths:
            self._paths[name] = export(self.module(name), self.folder / f"{name}.onnx",
                                       self.window(name))
        return self._paths[name]

    def copy(self, name: str, dest: Path) -> Path:
        """A copy of the exported model at `dest`."""
        shutil.copyfile(self.path(name), dest)
        return dest


def external_conv(folder: Path, seed: int = 3) -> Path:
    """`folder/m.onnx`: one padded Conv 1->2, 3^3 (a windowed model, dynamic spatial axes),
    its weights in `w.data` beside it as torch's dynamo export keeps them; built with onnx's
    helpers, no torch."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
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
