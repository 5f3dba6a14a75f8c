"""One block, end to end: read its input with the border mode, run patches, stitch, write.

`BlockSpec` is the picklable description a Dask worker receives once;
`BlockWorker` holds the opened arrays and the backend (one per process).
Setting ZNNI_ENGINE_TRACE=FILE appends the key of every computed block to
FILE, so tests and operators can see exactly what a run recomputed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from znni.engine.borders import read_with_border
from znni.engine.geometry import Block, Box, Triple, patch_tiling
from znni.engine.volume import encode_output, open_input, write_box
from znni.planner.network import Network
from znni.primitives.base import Backend
from znni.primitives.dense import dense_forward

TRACE_ENV = "ZNNI_ENGINE_TRACE"


@dataclass(frozen=True)
class BlockSpec:
    """Everything needed to compute any block of a job (sent to each worker once)."""

    network: Network
    input_path: str
    output_path: str
    border: str
    dtype: str
    patch: Triple  # dense output per patch, a multiple of the pool product per axis
    primitives: tuple[str | None, ...] | None = None
    backend_name: str | None = None  # None: the default backend of this machine


def default_backend_name() -> str:
    """ZNNI_BACKEND if set, else the fast CPU backend when registered, else the reference."""
    from znni.primitives.backends import BACKEND_FACTORIES

    name = os.environ.get("ZNNI_BACKEND")
    if name:
        return name
    return "cpu" if "cpu" in BACKEND_FACTORIES else "reference"


class BlockWorker:
    """Reads, computes and writes blocks of one job in this process."""

    def __init__(self, spec: BlockSpec, backend: Backend | None = None,
                 output_array: Any | None = None) -> None:
        import zarr

        from znni.primitives.backends import make_backend

        self.spec = spec
        self.network = spec.network
        self.volume = open_input(spec.input_path, spec.network.in_channels)
        self.backend = backend or make_backend(spec.backend_name or default_backend_name())
        self.output = output_array if output_array is not None else zarr.open_array(
            spec.output_path, mode="r+"
        )

    def read(self, block: Block) -> np.ndarray:
        """Raw (C, *block.read.shape) input of the block, border mode applied."""
        return read_with_border(self.volume.read, block.read, self.volume.shape, self.spec.border)

    def compute(self, block: Block, raw: np.ndarray) -> np.ndarray:
        """Encoded (Cout, *block.write.shape) output of the block."""
        net = self.network
        x = raw.astype(np.float32)  # (C, RZ, RY, RX)
        if net.input_scale != 1.0:
            x *= np.float32(net.input_scale)
        if net.input_shift != 0.0:
            x += np.float32(net.input_shift)
        extent = block.compute.shape
        patch = (
            min(self.spec.patch[0], extent[0]),
            min(self.spec.patch[1], extent[1]),
            min(self.spec.patch[2], extent[2]),
        )
        halo = tuple(f - 1 for f in net.fov)
        out = np.empty((net.out_channels, *extent), dtype=np.float32)  # (Cout, CZ, CY, CX)
        for box in patch_tiling(extent, patch):
            grown = box.grow((0, 0, 0), (halo[0], halo[1], halo[2]))
            xp = x[(slice(None), *grown.slices())][None]  # (1, C, nz, ny, nx)
            y = dense_forward(net.ops, xp, self.backend, self.spec.primitives)
            out[(slice(None), *box.slices())] = y[0]
        keep = Box((0, 0, 0), block.write.shape)
        result = encode_output(out[(slice(None), *keep.slices())], self.spec.dtype)
        _trace(block)
        return result

    def write(self, block: Block, values: np.ndarray) -> None:
        write_box(self.output, block.write, values)

    def run(self, block: Block) -> None:
        self.write(block, self.compute(block, self.read(block)))


def _trace(block: Block) -> None:
    path = os.environ.get(TRACE_ENV)
    if path:
        with open(path, "a") as f:  # one short O_APPEND write: safe across processes
            f.write(f"{os.getpid()} {block.key}\n")
