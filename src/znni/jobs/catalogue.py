"""The networks a server offers: `NAME.json` (+ its weights) in the models directory."""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import asdict
from pathlib import Path

from znni.model.network import Network, load_network

log = logging.getLogger("znni.server")

NAME_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


class UnknownNetworkError(ValueError):
    """No `NAME.json` in the models directory."""


class NetworkCatalogue:
    """Loads networks by name, caching each until its spec or weights file changes."""

    def __init__(self, models_dir: Path) -> None:
        self.models_dir = models_dir
        self._cache: dict[str, tuple[tuple[int, ...], Network]] = {}
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        return sorted(
            p.stem
            for p in self.models_dir.glob("*.json")
            if p.is_file() and NAME_PATTERN.match(p.stem)
        )

    def spec_path(self, name: str) -> Path:
        if not NAME_PATTERN.match(name):
            raise UnknownNetworkError(f"network name {name!r} is not a valid name")
        path = self.models_dir / f"{name}.json"
        if not path.is_file():
            known = ", ".join(self.names()) or "none"
            raise UnknownNetworkError(f"unknown network {name!r}; available networks: {known}")
        return path

    def get(self, name: str) -> Network:
        """The validated network; ValueError naming the problem when it cannot be loaded."""
        path = self.spec_path(name)
        stamp = _stamp(path) + _stamp(path.with_suffix(".npz"))
        with self._lock:
            cached = self._cache.get(name)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        try:
            network = load_network(path)
        except ValueError as e:
            raise ValueError(f"network {name!r} cannot be loaded: {_local(e, path.parent)}") from e
        with self._lock:
            self._cache[name] = (stamp, network)
        return network

    def available(self) -> list[Network]:
        """Every loadable network; broken ones are logged and left out."""
        out = []
        for name in self.names():
            try:
                out.append(self.get(name))
            except ValueError as e:
                log.warning("models: skipping %s: %s", name, e)
        return out


def describe(name: str, network: Network) -> dict:
    """What a client needs to know to submit: channels, field of view, layers."""
    return {
        "name": name,
        "in_channels": network.in_channels,
        "out_channels": network.out_channels,
        "fov": network.fov,
        "pool_product": network.pool_product,
        "layers": [_layer_dict(asdict(layer)) for layer in network.layers],
        "digest": network.digest,
    }


def _layer_dict(layer: dict) -> dict:
    if layer["kind"] != "leaky_relu":
        layer.pop("slope", None)
    return {k: v for k, v in layer.items() if v is not None}


def _stamp(path: Path) -> tuple[int, ...]:
    try:
        st = path.stat()
    except OSError:
        return (0, 0)
    return (st.st_mtime_ns, st.st_size)


def _local(error: Exception, directory: Path) -> str:
    return str(error).replace(str(directory).rstrip("/") + "/", "")
