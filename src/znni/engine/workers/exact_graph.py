"""Exact dense output for window-independent graph models (valid U-Nets).

A valid network with total downsampling F is translation-equivariant for shifts
that are multiples of F, so its output can be tiled on the F grid aligned to the
volume origin: a tile whose output starts at p (a multiple of F) reads the input
from p - context_lo on, with the border mode beyond the volume. The result equals
one run of the network over the whole volume extended by its context (context_lo
= context // 2 before, as the dense semantics place a sequential network's
output), whatever the blocks and tiles. Tiles overlap by less than F where their
output is not a multiple of F; overlapping outputs are identical.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from znni.engine.compute.device_tiles import DeviceTiles
from znni.engine.compute.tiles import context_lo, tile_output, tile_starts
from znni.engine.compute.tta import FlipSpec
from znni.engine.context import StoreContext
from znni.engine.geometry import Block, Box, Triple
from znni.engine.io.borders import read_with_border
from znni.engine.io.volume import encode_output
from znni.engine.location import Location
from znni.engine.workers.base import GraphWorker, InferenceStage, trace_block
from znni.model.carried import CarriedFiles
from znni.model.onnx_model import OnnxModel
from znni.model.processing import apply_chain
from znni.primitives.base import Backend


@dataclass(frozen=True)
class ExactGraphSpec(InferenceStage):
    """Everything a worker needs to compute any block of an exact graph job (picklable): the
    sweep's stage for a valid graph."""

    model: OnnxModel
    input_path: Location
    output_path: Location
    border: str
    dtype: str
    tile: Triple  # input size of one tile
    backend_name: str = "cpu"
    primitives: tuple[tuple[str, str], ...] = ()  # conv node -> the planner's primitive
    spectra_bytes: int = 0  # kernel spectra the fft-keep convs keep between tiles
    input_cache_bytes: int = 0  # decoded input chunks kept between blocks (0: none)
    # store options and caches (`engine/context.py`); a Dask worker gets the options only
    store: StoreContext = field(default_factory=StoreContext)
    batch: int = 1  # tiles run as one batch on a GPU
    precision: str = "fp32"  # tensors' storage between ops (primitives/precision.py)
    device_bytes: int = 0  # a GPU backend's memory cap (0: the device's own)
    compiled: str = ""  # "openvino-network": the planner compiles the whole window
    compiled_path: str = ""  # the network it compiles: "" the model's file; int8 its IR
    # int8's IR as bytes, for workers on other hosts (engine/cluster.py); None: the path
    compiled_files: CarriedFiles | None = None
    flips: FlipSpec | None = None  # test-time flips of every tile (compute/tta.py)

    def build(self, backend: Backend | None = None,
              output_array: Any = None) -> ExactGraphWorker:
        """This kind's worker (`backend`: run everything on it; `output_array`: opened)."""
        return ExactGraphWorker(self, backend=backend, output_array=output_array)


class ExactGraphWorker(GraphWorker):
    """Reads, computes and writes blocks of an exact graph job in this process."""

    spec: ExactGraphSpec

    def __init__(
        self, spec: ExactGraphSpec, backend: Backend | None = None, output_array: Any = None
    ) -> None:
        super().__init__(spec, spec.tile, backend, output_array)
        self.out = tile_output(spec.model, spec.tile)
        self.on_device = None if self.device_ops is None else DeviceTiles(
            self.device_ops, self.graph, spec.tile, self.out, self.primitives, spec.batch,
            spec.flips)

    def _starts(self, block: Block) -> list[list[int]]:
        f = self.spec.model.size_factor
        w = block.write
        return [tile_starts(w.lo[a], w.hi[a], f[a], self.out[a]) for a in range(3)]

    def read_box(self, block: Block) -> Box:
        """The input the block's tiles read (may reach outside the volume)."""
        starts, lo_c = self._starts(block), context_lo(self.spec.model)
        lo = [starts[a][0] - lo_c[a] for a in range(3)]
        hi = [starts[a][-1] + self.spec.tile[a] - lo_c[a] for a in range(3)]
        return Box((lo[0], lo[1], lo[2]), (hi[0], hi[1], hi[2]))

    def read(self, block: Block) -> np.ndarray:
        return read_with_border(
            self.volume.read, self.read_box(block), self.volume.shape, self.spec.border
        )

    def compute(self, block: Block, raw: np.ndarray) -> np.ndarray:
        """Encoded (Cout, *block.write.shape) output of the block."""
        model, tile, out = self.spec.model, self.spec.tile, self.out
        x = model.network_input(raw)  # (C, RZ, RY, RX) from tile 0's input, preprocessed
        starts = self._starts(block)
        origin = [s[0] for s in starts]
        if self.on_device is not None:  # tiles batched and placed on the GPU
            keep = tuple(slice(block.write.lo[a] - origin[a], block.write.hi[a] - origin[a])
                         for a in range(3))
            trace_block(block)
            y = self.on_device.block(x, starts, keep)
            if model.postprocessing:
                y = apply_chain(model.postprocessing, np.asarray(y, np.float32))
            return encode_output(y, self.spec.dtype)
        extent = [starts[a][-1] + out[a] - origin[a] for a in range(3)]
        y = np.empty((model.out_channels, *extent), np.float32)  # (Cout, EZ, EY, EX)
        for pz in starts[0]:
            for py in starts[1]:
                for px in starts[2]:
                    rel = (pz - origin[0], py - origin[1], px - origin[2])
                    src = tuple(slice(r, r + t) for r, t in zip(rel, tile, strict=True))
                    dst = tuple(slice(r, r + o) for r, o in zip(rel, out, strict=True))
                    window = x[(slice(None), *src)][None]  # (1, C, TZ, TY, TX)
                    y[(slice(None), *dst)] = self._run(window)
        keep = tuple(
            slice(block.write.lo[a] - origin[a], block.write.hi[a] - origin[a]) for a in range(3)
        )
        trace_block(block)
        y = y[(slice(None), *keep)]
        if model.postprocessing:  # a bioimage.io package's
            y = apply_chain(model.postprocessing, y)
        return encode_output(y, self.spec.dtype)

    def _run(self, window: np.ndarray) -> np.ndarray:
        """(1, C, *tile) -> (Cout, *tile output) with the planned primitives (averaged over
        the flips, if any)."""
        return self.predict(window)[0]
