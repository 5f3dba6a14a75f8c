"""One block, end to end: read its input with the border mode, run patches, stitch, write.

`BlockSpec` is the picklable description a Dask worker receives once;
`BlockWorker` holds the opened arrays and the backend (one per process).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from znni.engine.compute.cpu_gpu import run_patches_cpu_gpu
from znni.engine.compute.execution import Execution, build_backends, default_split_op, execution_for
from znni.engine.compute.graph_device import conv_run_report
from znni.engine.compute.tta import FlipSpec, flipped_items, unflipped_means
from znni.engine.context import StoreContext
from znni.engine.geometry import Block, Box, Triple, patch_tiling
from znni.engine.io.borders import read_with_border
from znni.engine.io.volume import encode_output
from znni.engine.location import Location
from znni.engine.workers.base import InferenceStage, VolumeWorker, trace_block
from znni.model.network import Network
from znni.primitives.base import Backend
from znni.primitives.cpu.heap import SEQUENTIAL_MMAP_THRESHOLD_BYTES, keep_freed_memory
from znni.primitives.dense import dense_forward


@dataclass(frozen=True)
class BlockSpec(InferenceStage):
    """Everything needed to compute any block of a job (sent to each worker once): the
    sweep's stage for a sequential network."""

    network: Network
    input_path: Location
    output_path: Location
    border: str
    dtype: str
    patch: Triple  # dense output per patch, a multiple of the pool product per axis
    primitives: tuple[str | None, ...] | None = None
    execution: Execution | None = None  # None: CPU only, this machine's default backend
    batch: int = 1  # patches stacked into one dense pass (the plan's S)
    input_cache_bytes: int = 0  # decoded input chunks kept between blocks (0: none)
    # store options and caches (`engine/context.py`); a Dask worker gets the options only
    store: StoreContext = field(default_factory=StoreContext)
    # test-time flips (compute/tta.py): each patch's flipped copies stream through the batch
    flips: FlipSpec | None = None

    def build(self, backend: Backend | None = None,
              output_array: Any | None = None) -> BlockWorker:
        """This kind's worker (`backend`: run everything on it; `output_array`: opened)."""
        return BlockWorker(self, backend=backend, output_array=output_array)


def default_backend_name() -> str:
    """ZNNI_BACKEND if set, else the fast CPU backend."""
    return execution_for(None, "cpu").cpu_backend


class BlockWorker(VolumeWorker):
    """Reads, computes and writes blocks of a sequential (MPF) job in this process."""

    spec: BlockSpec

    def __init__(self, spec: BlockSpec, backend: Backend | None = None,
                 output_array: Any | None = None) -> None:
        super().__init__(spec, spec.network.in_channels, output_array)
        self.network = spec.network
        execution = spec.execution or execution_for(None, "cpu")
        self.execution = execution
        self.gpu_backend: Backend | None = None
        if backend is not None:  # an explicit backend runs everything (tests, benchmarks)
            self.backend = backend
            self.execution = Execution("cpu", backend.name)
        else:
            keep_freed_memory(SEQUENTIAL_MMAP_THRESHOLD_BYTES)  # before the backend's call
            self.backend, self.gpu_backend = build_backends(execution)

    def device_report(self) -> dict[str, Any]:
        """On a GPU: the convs that really ran there, by name (graph workers say the same)."""
        device = getattr(self.gpu_backend, "device", None)
        return {} if device is None else conv_run_report(device)

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
        boxes = list(patch_tiling(extent, patch))
        grown = [box.grow((0, 0, 0), (halo[0], halo[1], halo[2])) for box in boxes]
        patches: Iterator[np.ndarray] = (  # (1, C, nz, ny, nx)
            x[(slice(None), *g.slices())][None] for g in grown)
        flips = self.spec.flips
        if flips is not None:  # exact: a flipped patch's dense output is its windows' flipped
            patches = flipped_items(patches, flips)
        stacks = _stacked(patches, self.spec.batch)  # (S, C, nz, ny, nx) each
        outputs: Iterator[np.ndarray] = (
            ys[i] for ys in self._forward(stacks) for i in range(ys.shape[0]))
        if flips is not None:
            outputs = unflipped_means(outputs, flips)
        for box, y in zip(boxes, outputs, strict=True):  # y: (Cout, pz, py, px)
            out[(slice(None), *box.slices())] = y
        keep = Box((0, 0, 0), block.write.shape)
        result = encode_output(out[(slice(None), *keep.slices())], self.spec.dtype)
        trace_block(block)
        return result

    def _forward(self, patches: Iterator[np.ndarray]) -> Iterator[np.ndarray]:
        """Dense outputs of the patch batches, in order, on the execution's device(s)."""
        net, prims, mode = self.network, self.spec.primitives, self.execution.mode
        if mode == "cpu-gpu" and self.gpu_backend is not None:
            split_op = self.execution.split_op
            split_op = default_split_op(net) if split_op is None else split_op
            yield from run_patches_cpu_gpu(
                net.ops, patches, self.backend, self.gpu_backend, split_op, prims
            )
            return
        backend = self.gpu_backend if mode == "gpu" and self.gpu_backend else self.backend
        for xp in patches:
            yield dense_forward(net.ops, xp, backend, prims)


def _stacked(patches: Iterator[np.ndarray], batch: int) -> Iterator[np.ndarray]:
    """Group (1, C, nz, ny, nx) patches of one size into (S, C, nz, ny, nx) batches of <= batch."""
    group: list[np.ndarray] = []
    for x in patches:
        group.append(x)
        if len(group) == batch:
            yield np.concatenate(group)
            group = []
    if group:
        yield np.concatenate(group)
