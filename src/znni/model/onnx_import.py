"""Reading an ONNX model (as `torch.onnx.export` writes it) into a `Graph` for one window.

The file is parsed with the `onnx` package. Every node that does not depend on
the input's *values* (initializers, Constant, Shape of a tensor whose shape we
know, and the shape arithmetic built on them: Gather, Concat, Unsqueeze, Cast,
Range, ConstantOfShape, ...) is evaluated with onnx's reference evaluator for
the window being run; what remains is the data path, converted node by node by
`onnx_ops`. The graph is resolved for a batch of one window (N = 1).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, cast

import numpy as np

from znni.model.graph import Graph, Node
from znni.model.onnx_cache import parsed_model
from znni.model.onnx_context import Context
from znni.model.onnx_ops import CONVERTERS, SUPPORTED_OPS, fold_batch_norms

FOLDABLE_WITHOUT_VALUES = ("Shape", "Size")


def load_onnx(
    path: str | Path,
    window: tuple[int, int, int] | None = None,
    output_name: str | None = None,
) -> Graph:
    """The model's graph for input windows of `window` (z, y, x) voxels.

    `window` None takes the model's fixed spatial input shape; a model with dynamic
    spatial axes needs one. Raises ValueError with one sentence for anything refused.
    """
    import onnx

    parsed = parsed_model(Path(path), _read_and_digest)
    model = parsed.model
    graph = model.graph
    inputs = _data_inputs(model, path)
    (inp,) = inputs
    channels, window = _input_window(inp, window, path)
    ctx = Context(path=str(path), shapes={inp.name: (1, channels, *window)},
                  evaluated=parsed.evaluate)
    ctx.consts.update({t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer})
    opset = _opset(model)
    ctx.opset = opset
    for node in graph.node:
        _visit(ctx, node, opset)
    out = _output(graph, output_name, ctx, path)
    nodes = fold_batch_norms(ctx.nodes, out)
    shape = ctx.shapes[out]
    kept = _prune(nodes, out)
    tensors = {inp.name} | {t for n in kept for t in (*n.inputs, *n.outputs)}
    return Graph(
        name=Path(path).stem,
        input=inp.name,
        in_channels=channels,
        window=window,
        nodes=tuple(kept),
        output=out,
        out_channels=int(shape[1]),
        out_window=(int(shape[2]), int(shape[3]), int(shape[4])),
        digest=parsed.digest,
        shapes={t: ctx.shapes[t] for t in tensors},
    )


def _read_and_digest(path: Path) -> tuple[Any, list[Path], str]:
    """The checked model, its external data files and its digest (onnx_cache)."""
    model, files = _read_model(path)
    return model, files, model_digest(path, files)


def _read_model(path: Path) -> tuple[Any, list[Path]]:
    """The model with its weights, and the external data files they came from (torch's
    dynamo export writes one beside the .onnx), checked by onnx's checker."""
    import onnx
    from onnx.external_data_helper import load_external_data_for_model

    model = _read_graph(path)
    files = external_files(model, path)
    for f in files:
        if not f.is_file():
            raise ValueError(f"ONNX model {path} keeps weights in {f}, which does not exist")
    try:
        load_external_data_for_model(model, str(path.parent))
        onnx.checker.check_model(model)
    except Exception as e:  # noqa: BLE001 - protobuf and checker raise many types
        raise ValueError(f"{path} is not a valid ONNX model ({_first_line(e)})") from None
    return model, files


def _read_graph(path: Path) -> Any:
    """The model file alone: external weights not loaded."""
    import onnx

    if not path.is_file():
        raise FileNotFoundError(f"ONNX model {path} does not exist")
    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - protobuf raises many types
        raise ValueError(f"{path} is not a valid ONNX model ({_first_line(e)})") from None


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def external_files(model: Any, path: Path) -> list[Path]:
    """The external data files the model's tensors name (before they are loaded), sorted."""
    from onnx import TensorProto

    tensors = list(model.graph.initializer) + [
        a.t for n in model.graph.node for a in n.attribute if a.HasField("t")
    ]
    files = set()
    for t in tensors:
        if t.data_location == TensorProto.EXTERNAL:
            where = {e.key: e.value for e in t.external_data}.get("location")
            if not where:
                raise ValueError(f"ONNX model {path}: tensor {t.name!r} is stored externally "
                                 "but names no location")
            files.add(path.parent / where)
    return sorted(files)


def external_data_files(path: Path) -> list[Path]:
    """The external data files the model at `path` names (its weights not read)."""
    return external_files(_read_graph(path), path)


def model_digest(path: Path, files: list[Path]) -> str:
    """sha256 of the model file and, in order, of each external data file it names: new
    weights in a `.onnx.data` beside an unchanged graph are a different model."""
    h = hashlib.sha256(path.read_bytes())
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _data_inputs(model: Any, path: str | Path) -> list[Any]:
    init = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in init]
    if len(inputs) != 1:
        names = ", ".join(i.name for i in inputs) or "none"
        raise ValueError(
            f"ONNX model {path} has {len(inputs)} inputs ({names}); znni runs "
            "models with exactly one 5D input (N, C, Z, Y, X)"
        )
    return inputs


def _input_window(
    inp: Any, window: tuple[int, int, int] | None, path: str | Path
) -> tuple[int, tuple[int, int, int]]:
    """(channels, window) from the input's declared shape and the requested window."""
    dims = inp.type.tensor_type.shape.dim
    if len(dims) != 5:
        raise ValueError(
            f"ONNX model {path} input {inp.name!r} has {len(dims)} dimensions; "
            "znni runs 3D models with a 5D input (N, C, Z, Y, X)"
        )
    fixed = [d.dim_value if d.HasField("dim_value") else None for d in dims]
    channels = fixed[1]
    if channels is None:
        raise ValueError(f"ONNX model {path} input {inp.name!r} has no fixed channel count")
    spatial = fixed[2:]
    if window is None:
        declared = [v for v in spatial if v is not None]
        if len(declared) != len(spatial):
            raise ValueError(
                f"ONNX model {path} has dynamic spatial input axes; "
                "give the window size with --window z,y,x"
            )
        return int(channels), (int(declared[0]), int(declared[1]), int(declared[2]))
    for axis, (v, w) in enumerate(zip(spatial, window, strict=True)):
        if v is not None and v != w:
            raise ValueError(
                f"ONNX model {path} was exported for a fixed input of "
                f"{tuple(spatial)} voxels; window {window} differs on axis "
                f"{'zyx'[axis]}"
            )
    return int(channels), (int(window[0]), int(window[1]), int(window[2]))


def _opset(model: Any) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    return 1


def _visit(ctx: Context, node: Any, opset: int) -> None:
    """Fold the node if it does not depend on input values, else convert it."""
    names = [i for i in node.input if i]
    if node.op_type in FOLDABLE_WITHOUT_VALUES and names[0] in ctx.shapes:
        ctx.consts[node.output[0]] = _shape_value(node, ctx.shapes[names[0]])
        return
    if node.op_type == "Constant" and _constant(ctx, node):
        return
    if all(n in ctx.consts for n in names):
        _evaluate(ctx, node, opset)
        return
    convert = CONVERTERS.get(node.op_type)
    if convert is None or node.domain not in ("", "ai.onnx"):
        raise ValueError(
            f"ONNX model {ctx.path}: node {node.name or node.output[0]!r} is a "
            f"{node.op_type!r}, which znni does not run on the data path; supported: "
            f"{', '.join(SUPPORTED_OPS)}"
        )
    convert(ctx, node)


def _shape_value(node: Any, shape: tuple[int, ...]) -> np.ndarray:
    if node.op_type == "Size":
        return np.array(int(np.prod(shape)), np.int64)
    attrs = {a.name: a.i for a in node.attribute}
    start, end = attrs.get("start", 0), attrs.get("end", len(shape))
    return np.array(shape[start:end] if "end" in attrs else shape[start:], np.int64)


def _constant(ctx: Context, node: Any) -> bool:
    """A Constant node's tensor `value`, read with onnx's numpy_helper: a U-Net's shape
    arithmetic has hundreds, and a reference evaluator per node took half of a load
    (about 6 of 12 ms per window size for the valid U-Net, which the tile choice loads
    for each candidate). False for the other attribute forms, left to the evaluator."""
    import onnx

    attrs = list(node.attribute)
    if len(attrs) != 1 or attrs[0].name != "value":
        return False
    ctx.consts[node.output[0]] = onnx.numpy_helper.to_array(attrs[0].t)
    return True


def _evaluate(ctx: Context, node: Any, opset: int) -> None:
    from onnx.reference import ReferenceEvaluator

    feeds = {n: ctx.consts[n] for n in node.input if n}

    def run() -> list[np.ndarray]:
        outs = ReferenceEvaluator(node, opsets={"": opset}).run(None, feeds)
        return cast(list[np.ndarray], outs)  # output_names None: the list of all outputs

    try:
        outs = run() if ctx.evaluated is None else ctx.evaluated(tuple(node.output), feeds, run)
    except Exception as e:  # noqa: BLE001 - the evaluator raises many types
        raise ValueError(
            f"ONNX model {ctx.path}: could not evaluate constant node "
            f"{node.name or node.output[0]!r} ({node.op_type}): {e}"
        ) from None
    for name, value in zip(node.output, outs, strict=False):
        ctx.consts[name] = np.asarray(value)


def _output(graph: Any, output_name: str | None, ctx: Context, path: str | Path) -> str:
    names = [o.name for o in graph.output]
    name = output_name or names[0]
    if name not in names:
        raise ValueError(
            f"ONNX model {path} has no output {name!r}; its outputs are {', '.join(names)}"
        )
    name = ctx.alias.get(name, name)
    if name not in ctx.shapes:
        raise ValueError(f"ONNX model {path} output {name!r} does not depend on the input")
    if len(ctx.shapes[name]) != 5:
        raise ValueError(f"ONNX model {path} output {name!r} is not 5D (N, C, Z, Y, X)")
    return name


def _prune(nodes: list[Node], output: str) -> list[Node]:
    """Only the nodes the output depends on (an exported graph may compute unused outputs)."""
    needed = {output}
    kept: list[Node] = []
    for node in reversed(nodes):
        if any(o in needed for o in node.outputs):
            kept.append(node)
            needed.update(node.inputs)
    return kept[::-1]
