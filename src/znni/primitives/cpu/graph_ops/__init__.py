"""CPU kernels for networks given as graphs (ONNX-exported 3D U-Nets).

Each op follows its ONNX operator (and the matching torch function) exactly,
on float32 (N, C, Z, Y, X) numpy arrays; pads are in ONNX order
(z_begin, y_begin, x_begin, z_end, y_end, x_end). Bad attributes raise ValueError.
"""

from znni.primitives.cpu.graph_ops.concat import concat_channels
from znni.primitives.cpu.graph_ops.conv_general import conv3d
from znni.primitives.cpu.graph_ops.conv_transpose import conv_transpose3d
from znni.primitives.cpu.graph_ops.elementwise import (
    clip,
    elu,
    leaky_relu,
    prelu,
    selu,
    softmax_channels,
)
from znni.primitives.cpu.graph_ops.normalization import (
    batch_norm,
    fold_batch_norm_into_conv,
    group_norm,
    instance_norm,
)
from znni.primitives.cpu.graph_ops.padding import pad3d, pad_constant
from znni.primitives.cpu.graph_ops.pooling_general import avg_pool3d, max_pool3d
from znni.primitives.cpu.graph_ops.resize import resize3d

__all__ = [
    "avg_pool3d",
    "batch_norm",
    "clip",
    "concat_channels",
    "conv3d",
    "conv_transpose3d",
    "elu",
    "fold_batch_norm_into_conv",
    "group_norm",
    "instance_norm",
    "leaky_relu",
    "max_pool3d",
    "pad3d",
    "pad_constant",
    "prelu",
    "resize3d",
    "selu",
    "softmax_channels",
]
