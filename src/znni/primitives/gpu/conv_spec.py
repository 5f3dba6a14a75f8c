"""What shapes one device convolution: its key for built-graph caches, its output size.

A `ConvSpec` holds everything that makes a cuDNN graph (or its stand-in) differ:
shapes, strides, pads, dilations, groups, direction, storage dtype, whether TF32
tensor-core math is allowed, and the fused bias and activation. It is the key of
`GraphCache`, the count-bounded LRU of built graphs that cudnn_conv.py (real cuDNN)
and cudnn_standin.py (the numpy stand-in) share, so both are keyed and bounded alike.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from znni.primitives.base import Activation
from znni.primitives.graph_args import six, triple
from znni.primitives.precision import check_precision, storage_dtype
from znni.primitives.shapes import conv_out_size, transpose_out_size

Shape = tuple[int, ...]
T = TypeVar("T")
DEFAULT_MAX_GRAPHS = 64  # a U-Net has ~20-40 distinct conv shapes per window size


@dataclass(frozen=True)
class ConvSpec:
    """One convolution as a library sees it; hashable, the graph cache's key."""

    x_shape: Shape  # (N, Cin, Z, Y, X)
    w_shape: Shape  # Conv: (Cout, Cin/g, k); ConvTranspose: (Cin, Cout/g, k)
    out_shape: Shape  # (N, Cout, Z', Y', X')
    strides: Shape
    pads: Shape  # ONNX order: z_b, y_b, x_b, z_e, y_e, x_e
    dilations: Shape
    groups: int
    transposed: bool
    io_dtype: str  # numpy dtype name of the stored tensors
    tf32: bool  # tensor-core (TF32) math allowed for float32 io
    has_bias: bool
    activation: tuple[str, float] | None  # (kind, slope), "linear" dropped

    @property
    def pre_pads(self) -> Shape:
        return self.pads[:3]

    @property
    def post_pads(self) -> Shape:
        return self.pads[3:]

    @property
    def out_channels(self) -> int:
        return self.out_shape[1]


def conv_spec(
    x_shape: Shape,
    params: Mapping[str, Any],
    *,
    activation: Activation | None,
    precision: str,
    transposed: bool,
) -> ConvSpec:
    """The spec of ONNX Conv / ConvTranspose `params` on an input of `x_shape`.

    ValueError for shapes that do not fit together (channels, groups, empty output).
    """
    check_precision(precision)
    w_shape = tuple(int(v) for v in params["weight"].shape)
    if len(x_shape) != 5 or len(w_shape) != 5:
        raise ValueError(f"conv needs 5-D input and weight, got {x_shape} and {w_shape}")
    g = int(params.get("group", 1))
    s = triple(params.get("strides", (1, 1, 1)), "strides", 1)
    d = triple(params.get("dilations", (1, 1, 1)), "dilations", 1)
    pads = six(params.get("pads", (0,) * 6))
    n, cin = x_shape[:2]
    if g < 1 or cin % g:
        raise ValueError(f"group {g} does not divide the {cin} input channels")
    if transposed:
        if w_shape[0] != cin:
            raise ValueError(f"ConvTranspose weight {w_shape} does not take {cin} channels")
        opad = triple(params.get("output_padding", (0, 0, 0)), "output_padding", 0)
        size = tuple(
            transpose_out_size(x_shape[2 + i], w_shape[2 + i], s[i], d[i], pads[i], pads[i + 3],
                               opad[i])
            for i in range(3)
        )
        cout = w_shape[1] * g
    else:
        if w_shape[1] * g != cin or w_shape[0] % g:
            raise ValueError(f"Conv weight {w_shape} with group {g} does not take {cin} channels")
        size = tuple(
            conv_out_size(x_shape[2 + i], w_shape[2 + i], s[i], d[i], pads[i], pads[i + 3])
            for i in range(3)
        )
        cout = w_shape[0]
    if min(size) < 1:
        raise ValueError(f"conv of input {x_shape} with weight {w_shape} has no output ({size})")
    act = None
    if activation is not None and activation.kind != "linear":
        act = (activation.kind, float(activation.slope))
    return ConvSpec(
        x_shape=tuple(int(v) for v in x_shape), w_shape=w_shape, out_shape=(n, cout, *size),
        strides=s, pads=pads, dilations=d, groups=g, transposed=bool(transposed),
        io_dtype=storage_dtype(precision).name, tf32=precision != "fp32",
        has_bias=params.get("bias") is not None, activation=act,
    )


def contiguous_strides(shape: Shape) -> list[int]:
    """Element strides of a C-contiguous (N, C, Z, Y, X) tensor."""
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= int(n)
    return out[::-1]


class GraphCache(Generic[T]):
    """Built graphs by `ConvSpec`, least recently used dropped past `max_graphs`.

    A spec the library cannot run is cached as None, so it is not rebuilt per call.
    """

    def __init__(self, max_graphs: int = DEFAULT_MAX_GRAPHS) -> None:
        if max_graphs < 1:
            raise ValueError(f"the graph cache must hold at least 1 graph, got {max_graphs}")
        self.max_graphs = int(max_graphs)
        self._items: OrderedDict[ConvSpec, T | None] = OrderedDict()
        self.builds = 0
        self.hits = 0
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, spec: ConvSpec) -> bool:
        return spec in self._items

    def get_or_build(self, spec: ConvSpec, build: Callable[[ConvSpec], T | None]) -> T | None:
        if spec in self._items:
            self._items.move_to_end(spec)
            self.hits += 1
            return self._items[spec]
        graph = build(spec)
        self.builds += 1
        self._items[spec] = graph
        while len(self._items) > self.max_graphs:
            self._items.popitem(last=False)
            self.evictions += 1
        return graph

    def clear(self) -> None:
        self._items.clear()
