"""What the ONNX import knows while it walks the graph, shared by the op converters."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, overload

import numpy as np

from znni.model.graph import Node

Shape = tuple[int, ...]


@dataclass
class Context:
    """What the import knows so far: data tensors' shapes, constants, nodes, aliases."""

    path: str
    shapes: dict[str, Shape]  # data tensors (N, C, Z, Y, X) -> shape
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    alias: dict[str, str] = field(default_factory=dict)  # onnx name -> our tensor
    grouped: dict[str, tuple[str, int]] = field(default_factory=dict)  # group-norm reshapes
    opset: int = 13
    # (outputs, feeds, run) -> the constant node's outputs, remembered per model
    # (onnx_cache.ParsedModel.evaluate); None: run each time
    evaluated: Callable[..., list[np.ndarray]] | None = None

    def where(self, node: Any) -> str:
        return f"ONNX model {self.path}: node {node.name or node.output[0]!r} ({node.op_type})"

    def data(self, node: Any, name: str) -> str:
        """Our tensor for a data input of `node`, or ValueError naming the node."""
        name = self.alias.get(name, name)
        if name not in self.shapes:
            raise ValueError(
                f"{self.where(node)} reads {name!r}, which is not a 5D data tensor "
                "znni can run (only the GroupNorm form of Reshape is supported)"
            )
        return name

    @overload
    def const(self, node: Any, index: int, required: Literal[True] = True) -> np.ndarray: ...
    @overload
    def const(self, node: Any, index: int, required: bool) -> np.ndarray | None: ...

    def const(self, node: Any, index: int, required: bool = True) -> np.ndarray | None:
        if index >= len(node.input) or not node.input[index]:
            if required:
                raise ValueError(f"{self.where(node)} has no input {index}")
            return None
        name = node.input[index]
        if name not in self.consts:
            raise ValueError(f"{self.where(node)}: input {name!r} must be a constant for znni")
        return self.consts[name]

    def add(
        self,
        node: Any,
        op: str,
        inputs: tuple[str, ...],
        shape: Shape,
        params: dict[str, Any] | None = None,
    ) -> None:
        out = node.output[0]
        self.nodes.append(Node(node.name or out, op, inputs, (out,), params or {}))
        self.shapes[out] = tuple(int(v) for v in shape)


def attrs(node: Any) -> dict[str, Any]:
    """The node's attributes as Python values (strings decoded)."""
    from onnx import helper

    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def spatial(ctx: Context, node: Any, values: Any, default: int, what: str) -> tuple[int, ...]:
    """A per-axis attribute for the three spatial axes (ONNX default when absent)."""
    v = tuple(int(x) for x in values) if values is not None else (default,) * 3
    if len(v) != 3:
        raise ValueError(f"{ctx.where(node)}: {what} {v} is not 3D")
    return v
