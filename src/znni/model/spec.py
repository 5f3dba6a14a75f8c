"""Parsing and validating the network spec JSON (docs/design.md, "Network spec and weights")."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from znni.primitives.base import ACTIVATION_KINDS
from znni.triple import Triple, as_triple

LAYER_KINDS = ("conv", "maxpool", *ACTIVATION_KINDS)
LAYER_KEYS = {
    "conv": {"kind", "out_channels", "kernel"},
    "maxpool": {"kind", "window"},
    "leaky_relu": {"kind", "slope"},
}
TOP_KEYS = {"name", "in_channels", "weights", "input", "layers"}


@dataclass(frozen=True)
class LayerSpec:
    kind: str
    out_channels: int | None = None
    kernel: Triple | None = None
    window: Triple | None = None
    slope: float = 0.01


@dataclass(frozen=True)
class NetworkSpec:
    name: str
    in_channels: int
    weights: str | None
    scale: float
    shift: float
    layers: tuple[LayerSpec, ...]

    def canonical_json(self) -> str:
        """What identifies the computation (not the file name of the weights)."""
        body = asdict(self)
        body.pop("weights")
        return json.dumps(body, sort_keys=True)


def read_spec_file(path: Path) -> Any:
    if path.is_dir():
        raise ValueError(
            f"network {path} is a directory; give a JSON network spec or an .onnx model file"
        )
    if not path.is_file():
        raise ValueError(f"network spec {path} does not exist")
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"network spec {path} is not valid JSON ({e})") from e


def parse_spec(raw: Any, path: Path) -> NetworkSpec:
    where = f"network spec {path}"
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a JSON object, found {type(raw).__name__}")
    unknown = sorted(set(raw) - TOP_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key {unknown[0]!r}; expected {sorted(TOP_KEYS)}")
    in_channels = _positive_int(raw.get("in_channels", 1), f"{where}: key 'in_channels'")
    weights = raw.get("weights")
    if weights is not None and not isinstance(weights, str):
        raise ValueError(f"{where}: key 'weights' must be a path string, found {weights!r}")
    scale, shift = _input_transform(raw.get("input", {}), where)
    layers_raw = raw.get("layers")
    if not isinstance(layers_raw, list) or not layers_raw:
        raise ValueError(f"{where}: key 'layers' must be a non-empty list, found {layers_raw!r}")
    layers = tuple(_layer(entry, i, where) for i, entry in enumerate(layers_raw))
    if not any(layer.kind == "conv" for layer in layers):
        raise ValueError(f"{where}: the network has no conv layer, so no output channels")
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}: key 'name' must be a non-empty string, found {name!r}")
    return NetworkSpec(name, in_channels, weights, scale, shift, layers)


def _input_transform(entry: Any, where: str) -> tuple[float, float]:
    if not isinstance(entry, dict) or set(entry) - {"scale", "shift"}:
        raise ValueError(f"{where}: key 'input' must be {{'scale': number, 'shift': number}}")
    out = []
    for key, default in (("scale", 1.0), ("shift", 0.0)):
        value = entry.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{where}: key 'input.{key}' must be a number, found {value!r}")
        out.append(float(value))
    return out[0], out[1]


def _layer(entry: Any, i: int, where: str) -> LayerSpec:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: layer {i} must be an object, found {entry!r}")
    kind = entry.get("kind")
    if kind not in LAYER_KINDS:
        raise ValueError(
            f"{where}: layer {i} key 'kind' is {kind!r}; expected one of {', '.join(LAYER_KINDS)}"
        )
    allowed = LAYER_KEYS.get(kind, {"kind"})
    unknown = sorted(set(entry) - allowed)
    if unknown:
        raise ValueError(
            f"{where}: layer {i} ({kind}) has unknown key {unknown[0]!r}; "
            f"expected keys {sorted(allowed)}"
        )
    at = f"{where}: layer {i} ({kind})"
    if kind == "conv":
        out = _positive_int(entry.get("out_channels"), f"{at} key 'out_channels'")
        return LayerSpec(kind, out_channels=out, kernel=_triple(entry.get("kernel"), at, "kernel"))
    if kind == "maxpool":
        return LayerSpec(kind, window=_triple(entry.get("window"), at, "window"))
    if kind == "leaky_relu":
        slope = entry.get("slope", 0.01)
        if isinstance(slope, bool) or not isinstance(slope, int | float):
            raise ValueError(f"{at} key 'slope' must be a number, found {slope!r}")
        return LayerSpec(kind, slope=float(slope))
    return LayerSpec(kind)


def _positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive integer, found {value!r}")
    return value


def _triple(value: Any, at: str, key: str) -> Triple:
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value] * 3
    if (
        not isinstance(value, list)
        or len(value) != 3
        or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value)
    ):
        raise ValueError(f"{at} key {key!r} must be 3 positive integers [z, y, x], found {value!r}")
    return as_triple(value, key)
