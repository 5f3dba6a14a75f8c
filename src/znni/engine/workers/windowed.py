"""Windowed dense output for graph models (docs/design.md, "Planned"): MONAI-equal blending.

Windows of shape W sit on the whole volume's grid (`windows.WindowGrid`, MONAI's
scan); a block only groups the windows that touch its write box, so the result does
not depend on the block layout. A window that touches two blocks is blended into
both; a worker keeps such windows' outputs (bounded in bytes) for the next blocks,
so it computes each once while they fit (Dask workers each keep their own).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast, get_args

import numpy as np

from znni.engine.compute.device_windows import DeviceWindows
from znni.engine.compute.tta import FlipSpec
from znni.engine.compute.windows import (
    BlendMode,
    WindowGrid,
    blend_box,
    window_group,
    window_input,
    window_inside,
    windows_touching,
)
from znni.engine.context import StoreContext
from znni.engine.geometry import Block, Box, Triple
from znni.engine.io.volume import encode_output
from znni.engine.location import Location
from znni.engine.workers.base import GraphWorker, InferenceStage, trace_block
from znni.lru import BytesLRU
from znni.model.carried import CarriedFiles
from znni.model.onnx_model import OnnxModel
from znni.model.processing import apply_chain
from znni.primitives.base import Backend

BLEND_MODES = ("gaussian", "constant")
# A window that straddles a block boundary is blended into every block it touches; its
# output is kept (LRU, bounded in bytes) so the neighbouring blocks do not compute it
# again (at 256^3 with 64^3 windows and 128^3 blocks, 216 window runs instead of 125).
# segment() gives it an eighth of the memory budget, at least this.
WINDOW_CACHE_BYTES = 256 * 2**20


@dataclass(frozen=True)
class WindowedSpec(InferenceStage):
    """Everything a worker needs to compute any block of a windowed job (picklable): the
    sweep's stage for any other graph."""

    model: OnnxModel
    input_path: Location
    output_path: Location
    dtype: str
    grid: WindowGrid
    blend: str
    backend_name: str = "cpu"
    primitives: tuple[tuple[str, str], ...] = ()  # conv node -> the planner's primitive
    spectra_bytes: int = 0  # kernel spectra the fft-keep convs keep between windows
    # outputs of windows that reach beyond the block, kept for the next blocks they touch
    window_cache_bytes: int = WINDOW_CACHE_BYTES
    input_cache_bytes: int = 0  # decoded input chunks kept between blocks (0: none)
    # store options and caches (`engine/context.py`); a Dask worker gets the options only
    store: StoreContext = field(default_factory=StoreContext)
    batch: int = 1  # windows run as one batch (windows.window_group), the planner's choice
    precision: str = "fp32"  # tensors' storage between ops (primitives/precision.py)
    device_bytes: int = 0  # a GPU backend's memory cap (0: the device's own)
    compiled: str = ""  # "openvino-network": the planner compiles the whole window
    compiled_path: str = ""  # the network it compiles: "" the model's file; int8 its IR
    # int8's IR as bytes, for workers on other hosts (engine/cluster.py); None: the path
    compiled_files: CarriedFiles | None = None
    flips: FlipSpec | None = None  # test-time flips of every window (compute/tta.py)

    def build(self, backend: Backend | None = None,
              output_array: Any = None) -> WindowedWorker:
        """This kind's worker (`backend`: run everything on it; `output_array`: opened)."""
        return WindowedWorker(self, backend=backend, output_array=output_array)


class WindowedWorker(GraphWorker):
    """Reads, computes and writes blocks of a windowed job in this process."""

    spec: WindowedSpec

    def __init__(
        self, spec: WindowedSpec, backend: Backend | None = None, output_array: Any = None
    ) -> None:
        super().__init__(spec, spec.grid.window, backend, output_array)
        self._kept = BytesLRU(spec.window_cache_bytes)  # an LRU bounded in bytes
        self.on_device = None if self.device_ops is None else DeviceWindows(
            self.device_ops, self.graph, spec.grid, blend_mode(spec.blend), self.primitives,
            spec.batch, spec.window_cache_bytes, spec.flips)

    def read_box(self, block: Block) -> Box:
        """The input (volume coordinates) that the windows touching the block, and the
        windows batched with them, cover."""
        grid = self.spec.grid
        starts = [g for s in windows_touching(grid, block.write.lo, block.write.hi)
                  for g in window_group(grid, s, self.spec.batch)]
        pad, vol, win = grid.pad_before, grid.volume_shape, grid.window
        lo = [max(0, min(s[i] for s in starts) - pad[i]) for i in range(3)]
        hi = [min(vol[i], max(s[i] for s in starts) + win[i] - pad[i]) for i in range(3)]
        return Box((lo[0], lo[1], lo[2]), (hi[0], hi[1], hi[2]))

    def read(self, block: Block) -> np.ndarray:
        return self.volume.read(self.read_box(block))  # (C, RZ, RY, RX)

    def compute(self, block: Block, raw: np.ndarray) -> np.ndarray:
        """Encoded (Cout, *block.write.shape) blended output of the block."""
        model, grid = self.spec.model, self.spec.grid
        x = model.network_input(raw)  # (C, RZ, RY, RX): float32, scaled, preprocessed
        origin = self.read_box(block).lo
        if self.on_device is not None:  # windows batched, run and blended on the GPU
            out = self.on_device.block(x, origin, block.write.lo, block.write.hi)
            if model.postprocessing:  # on the blended output, as bioimageio.core does
                out = apply_chain(model.postprocessing, np.asarray(out, np.float32))
            trace_block(block)
            return encode_output(out, self.spec.dtype)
        ready: dict[Triple, np.ndarray] = {}  # batched with an earlier window of this block
        touching: set[Triple] = set()  # the block's windows, listed at its first group

        def run_window(start: Triple) -> np.ndarray:
            out = ready.pop(start, None)
            if out is None:
                out = self._kept.get(start)
            if out is None:
                if not touching:
                    touching.update(windows_touching(grid, block.write.lo, block.write.hi))
                out = self._run_group(x, origin, block, start, ready, touching)
            return out

        mode = blend_mode(self.spec.blend)
        out = blend_box(grid, block.write.lo, block.write.hi, run_window, mode, model.out_channels)
        if model.postprocessing:  # on the blended output, as bioimageio.core does
            out = apply_chain(model.postprocessing, out)
        trace_block(block)
        return encode_output(out, self.spec.dtype)

    def _run_group(self, x: np.ndarray, origin: Triple, block: Block, start: Triple,
                   ready: dict[Triple, np.ndarray], touching: set[Triple]) -> np.ndarray:
        """Run `start`'s window group as one batch; the others' outputs go to `ready`
        when this block (whose windows are `touching`) blends them, and are kept when
        another block will."""
        grid = self.spec.grid
        group = window_group(grid, start, self.spec.batch)
        batch = np.stack([window_input(x, origin, s, grid) for s in group])  # (B, C, *W)
        outs = self.predict(batch)  # (B, Cout, *W), averaged over the flips if any
        for s, out in zip(group, outs, strict=True):
            if not window_inside(grid, s, block.write.lo, block.write.hi):
                self._keep(s, out if len(group) == 1 else out.copy())  # not the whole batch
            if s != start and s in touching:
                ready[s] = out
        return outs[group.index(start)]

    def _keep(self, start: Triple, out: np.ndarray) -> None:
        """Keep a straddling window's output, evicting the least recently used."""
        self._kept.put(start, out)


def blend_mode(blend: str) -> BlendMode:
    """`blend` as a blend mode; ValueError naming the modes otherwise."""
    for mode in get_args(BlendMode):
        if blend == mode:
            return cast(BlendMode, mode)
    raise ValueError(f"blend mode {blend!r} is not one of {', '.join(BLEND_MODES)}")


def check_window_options(overlap: float, blend: str) -> None:
    if not 0.0 <= overlap < 1.0:
        raise ValueError(f"overlap {overlap} must be in [0, 1)")
    if blend not in BLEND_MODES:
        raise ValueError(f"blend mode {blend!r} is not one of {', '.join(BLEND_MODES)}")
