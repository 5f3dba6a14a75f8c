"""A network's conv parameters kept on the device between calls of the GPU backend.

A dense run calls the backend once per patch batch; uploading every conv's weights (and
transforming its kept spectra) each time is host-to-device traffic and FFT work per
batch that ZNNi's GPU algorithms do once. `KeptParams` keeps them keyed by the op, the
output channels and the FFT shape they were made for, counted on the device. Before a
call allocates anything it `retain`s only the entries that call uses (the others are
given back), so the memory fit of the call (which counts its parameters) stays exact.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from znni.primitives.gpu.device import Device
from znni.primitives.gpu.layers import DeviceOp, Params, upload_params

Shape = tuple[int, ...]


@dataclass
class _Entry:
    op: Any  # the network's op, held so its id is not reused while kept
    params: Params
    filled: bool  # kept spectra computed (the first call's prologue queues that)


class KeptParams:
    """Conv parameters on `device` by (op, primitive, channels, FFT shape)."""

    def __init__(self, device: Device) -> None:
        self.device = device
        self._entries: dict[Hashable, _Entry] = {}
        self.uploads = 0  # parameter uploads made (tests: once per op per run)

    @staticmethod
    def key(dop: DeviceOp, shape: Shape, o0: int, o1: int | None) -> Hashable:
        fshape = tuple(shape[2:]) if dop.primitive == "fft-keep" else None
        return (id(dop.op), dop.primitive, o0, o1, fshape)

    @property
    def nbytes(self) -> int:
        """Device bytes held: free for a call's fit, which counts its own parameters."""
        return sum(int(a.nbytes) for e in self._entries.values() for a in e.params.arrays())

    def retain(self, keys: Iterable[Hashable]) -> None:
        """Give back every entry but `keys` (before a call allocates)."""
        wanted = set(keys)
        for k in [k for k in self._entries if k not in wanted]:
            self.device.free(*self._entries.pop(k).params.arrays())

    def get(self, dop: DeviceOp, shape: Shape, o0: int = 0,
            o1: int | None = None) -> tuple[Params | None, bool]:
        """(the op's parameters on the device, whether their kept spectra still need
        filling); (None, False) for ops without parameters."""
        key = self.key(dop, shape, o0, o1)
        entry = self._entries.get(key)
        if entry is None:
            params = upload_params(self.device, dop, shape, o0, o1)
            if params is None:
                return None, False
            self.uploads += 1
            entry = self._entries[key] = _Entry(dop.op, params, params.spectra is None)
        fill = not entry.filled
        entry.filled = True  # the caller queues the fill before any use, on one stream
        return entry.params, fill

    def clear(self) -> None:
        self.retain(())
