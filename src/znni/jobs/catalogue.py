"""The networks a server offers: `NAME.json` (+ its weights) or `NAME.onnx` in the models
directory, or a bioimage.io model package `NAME.zip` or `NAME/` (a folder with its rdf.yaml),
listed with its name, description and citations.

An ONNX model's input transform (`scale`, `shift`) and chosen output (`output_name`)
are part of the model (they change its digest), so models are cached per
(name, output_name, scale, shift), a bounded number of them, each until its file, or an
external data file it names (new weights beside the same graph), changes.
"""

from __future__ import annotations

import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from znni.model.loading import load_model
from znni.model.network import Network
from znni.model.onnx_model import OnnxModel

log = logging.getLogger("znni.server")

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
SUFFIXES = (".json", ".onnx", ".zip")  # and NAME/ folders of bioimage.io packages
CACHE_ENTRIES = 64  # loaded models kept, over all names and ONNX option combinations

Model = Network | OnnxModel
_Entry = tuple[tuple[int, ...], Model, list[Path]]  # (file stamps, model, external files)


class UnknownNetworkError(ValueError):
    """Neither `NAME.json` nor `NAME.onnx` in the models directory."""


@dataclass(frozen=True)
class ModelOptions:
    """The options that make an ONNX file a particular model (ONNX models only)."""

    output_name: str | None = None
    scale: float | None = None
    shift: float | None = None

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> ModelOptions:
        """The options stored in a job's parameters (absent in older jobs: none)."""
        scale, shift = params.get("scale"), params.get("shift")
        return cls(
            output_name=params.get("output_name"),
            scale=float(scale) if scale is not None else None,
            shift=float(shift) if shift is not None else None,
        )

    def given(self) -> list[str]:
        return [k for k, v in asdict(self).items() if v is not None]

    def key(self) -> tuple[str | None, float, float]:
        """Equal for option sets that give the same model (unset scale is 1, shift 0)."""
        return (
            self.output_name,
            1.0 if self.scale is None else self.scale,
            0.0 if self.shift is None else self.shift,
        )


class NetworkCatalogue:
    """Loads networks by name, caching each until its spec, weights or ONNX file changes."""

    def __init__(self, models_dir: Path, entries: int = CACHE_ENTRIES) -> None:
        self.models_dir = models_dir
        self.entries = entries
        # (name, load options) -> (stamps of the files read, model, external data files)
        self._cache: OrderedDict[tuple[Hashable, ...], _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        files = {
            p.stem
            for suffix in SUFFIXES
            for p in self.models_dir.glob(f"*{suffix}")
            if p.is_file() and NAME_PATTERN.match(p.stem)
        }
        folders = {p.name for p in (self.models_dir.iterdir() if self.models_dir.is_dir()
                                    else ()) if _package_folder(p) and NAME_PATTERN.match(p.name)}
        return sorted(files | folders)

    def model_path(self, name: str) -> Path:
        """`NAME.json` or `NAME.onnx`; ValueError when there is neither, or both."""
        if not NAME_PATTERN.match(name):
            raise UnknownNetworkError(f"network name {name!r} is not a valid name")
        found = [p for p in (self.models_dir / f"{name}{s}" for s in SUFFIXES) if p.is_file()]
        if _package_folder(self.models_dir / name):
            found.append(self.models_dir / name)
        if not found:
            known = ", ".join(self.names()) or "none"
            raise UnknownNetworkError(f"unknown network {name!r}; available networks: {known}")
        if len(found) > 1:
            raise ValueError(
                f"network {name!r} is defined twice, by {found[0].name} and {found[1].name} in "
                "the models directory; remove one of them"
            )
        return found[0]

    def get(self, name: str, options: ModelOptions | None = None) -> Model:
        """The validated model; ValueError naming the problem when it cannot be loaded."""
        options = options or ModelOptions()
        path = self.model_path(name)
        onnx = path.suffix == ".onnx"
        package = path.suffix == ".zip" or path.is_dir()  # a bioimage.io package
        if package and options.given():
            raise ValueError(f"{', '.join(options.given())} apply to bare ONNX models only; "
                             f"network {name!r} is a bioimage.io package with its own "
                             "preprocessing")
        if not onnx and options.given():
            given = options.given()
            raise ValueError(
                f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} to ONNX models "
                f"only; network {name!r} is a JSON spec (one output, and its input transform "
                "set in its 'input' block)"
            )
        onnx = onnx or package
        stamp = _stamp(path) + (() if onnx else _stamp(path.with_suffix(".npz")))
        if path.is_dir():  # a package folder: its description and its files
            stamp = _stamps(sorted(p for p in path.iterdir() if p.is_file()))
        key = (name, *options.key()) if onnx else (name,)
        with self._lock:
            cached = self._cache.get(key)
        if cached is not None and cached[0] == stamp + _stamps(cached[2]):
            return cached[1]
        try:
            if onnx:
                model = load_model(path, **asdict(options))
            else:
                model = load_model(path)
        except (ValueError, FileNotFoundError) as e:
            raise ValueError(f"network {name!r} cannot be loaded: {_local(e, path.parent)}") from e
        except Exception as e:  # noqa: BLE001 - a model file znni cannot read must not be a 5xx
            log.warning("models: %s failed to load", path.name, exc_info=True)
            raise ValueError(
                f"network {name!r} cannot be loaded: {type(e).__name__}: {_local(e, path.parent)}"
            ) from e
        files = _data_files(path) if onnx and not package else []  # weights beside the graph
        with self._lock:
            self._cache[key] = (stamp + _stamps(files), model, files)
            self._cache.move_to_end(key)
            while len(self._cache) > self.entries:
                self._cache.popitem(last=False)
        return model

    def available(self) -> list[Model]:
        """Every loadable network; broken ones are logged and left out."""
        out = []
        for name in self.names():
            try:
                out.append(self.get(name))
            except ValueError as e:
                log.warning("models: skipping %s: %s", name, e)
        return out


def model_mode(network: Model) -> str:
    """"exact" (window-independent output) or "windowed" (overlapping blended windows)."""
    if isinstance(network, OnnxModel):
        return str(getattr(network, "mode", "windowed"))
    return "exact"


def describe(name: str, network: Model) -> dict[str, Any]:
    """What a client needs to know to submit: mode, channels, and the field of view and
    layers (sequential networks) or the window grid (ONNX graph models)."""
    if isinstance(network, OnnxModel):
        mode = model_mode(network)
        return {
            "name": name,
            "mode": mode,
            "in_channels": network.in_channels,
            "out_channels": network.out_channels,
            "size_factor": network.size_factor,
            "min_window": network.min_window,
            "fixed_window": network.fixed_window,
            "context": getattr(network, "context", None) if mode == "exact" else None,
            "digest": network.digest,
            **_package(network),
        }
    return {
        "name": name,
        "mode": "exact",
        "in_channels": network.in_channels,
        "out_channels": network.out_channels,
        "fov": network.fov,
        "pool_product": network.pool_product,
        "layers": [_layer_dict(asdict(layer)) for layer in network.layers],
        "digest": network.digest,
    }


def _package(network: OnnxModel) -> dict[str, Any]:
    """A bioimage.io package's name, description, citations and channel names."""
    info = getattr(network, "package", None)
    if info is None:
        return {}
    keys = ("name", "description", "cite", "format_version")
    return {"package": {**{k: info[k] for k in keys},
                        "channel_names": list(network.channel_names)}}


def _layer_dict(layer: dict[str, Any]) -> dict[str, Any]:
    if layer["kind"] != "leaky_relu":
        layer.pop("slope", None)
    return {k: v for k, v in layer.items() if v is not None}


def _package_folder(path: Path) -> bool:
    """A folder holding a bioimage.io package's rdf.yaml (or bioimageio.yaml)."""
    return path.is_dir() and any((path / n).is_file() for n in ("rdf.yaml", "bioimageio.yaml"))


def _data_files(path: Path) -> list[Path]:
    from znni.model.onnx_import import external_data_files

    try:
        return external_data_files(path)
    except (ValueError, FileNotFoundError):  # replaced meanwhile: the next get reloads
        return [path]


def _stamps(paths: list[Path]) -> tuple[int, ...]:
    return tuple(v for p in paths for v in _stamp(p))


def _stamp(path: Path) -> tuple[int, ...]:
    try:
        st = path.stat()
    except OSError:
        return (0, 0)
    return (st.st_mtime_ns, st.st_size)


def _local(error: Exception, directory: Path) -> str:
    return str(error).replace(str(directory).rstrip("/") + "/", "")
