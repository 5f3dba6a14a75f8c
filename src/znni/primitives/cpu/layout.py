"""Which memory layout a (N, C, Z, Y, X) array lies in: OpenVINO layers compute and hand
on channels-last (primitives/cpu/openvino_conv), and the graph kernels that pass that
layout on (graph_ops pooling and conv_transpose) keep it."""

from __future__ import annotations

import numpy as np


def is_channels_last(a: np.ndarray) -> bool:
    """(N, C, Z, Y, X) `a` lying as a whole (N, Z, Y, X, C) array in memory (C > 1: one
    channel is both layouts)."""
    return (a.ndim == 5 and not a.flags.c_contiguous
            and a.transpose(0, 2, 3, 4, 1).flags.c_contiguous)


def channels_innermost(a: np.ndarray) -> bool:
    """A (N, C, Z, Y, X) view whose channels are its innermost axis in memory, whole or
    not (a crop of a channels-last tensor: a U-Net's skip)."""
    return a.ndim == 5 and a.shape[1] > 1 and abs(a.strides[1]) == a.itemsize < min(
        abs(v) for v in a.strides[2:])
