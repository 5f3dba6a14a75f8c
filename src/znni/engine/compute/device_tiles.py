"""An exact-graph block on the GPU: tiles batched on the device, placed on the device.

The device twin of the exact-graph worker's host loop (workers/exact_graph.py): the
same tiles on the F grid, each tile's output written into the block's extent on the
device (overlapping tile outputs are identical, as there), and only the part of the
extent inside the block's write box comes back. Tiles of one block run in batches
streamed in through device_stream.InputStream; an allocation failure halves the batch
and runs the block again (device_stream.DeviceBlocks).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import product
from typing import Any

import numpy as np

from znni.engine.compute.device_stream import DeviceBlocks, download
from znni.engine.compute.graph_device import run_graph_device
from znni.engine.compute.tta import FlipSpec, flip_back_into
from znni.model.graph import Graph
from znni.primitives.gpu.graph_device import DeviceGraphOps
from znni.triple import Triple

F32 = np.float32


class DeviceTiles(DeviceBlocks):
    """Runs exact-graph blocks of one graph (input `tile`, output `out`) on the device."""

    def __init__(self, ops: DeviceGraphOps, graph: Graph, tile: Triple, out: Triple,
                 primitives: Mapping[str, str], batch: int, flips: FlipSpec | None = None) -> None:
        super().__init__(ops.device, batch, ops.dtype)
        self.ops, self.graph, self.tile, self.out = ops, graph, tile, out
        self.flips = flips  # test-time flips: a tile's copies are consecutive batch items
        self.primitives = dict(primitives)

    def block(self, x: np.ndarray, starts: Sequence[Sequence[int]],
              keep: tuple[slice, ...]) -> np.ndarray:
        """(Cout, *kept) float32: tiles at `starts` (per axis, the first at x's origin
        plus its context) over the block's input `x` (C, RZ, RY, RX), cut to `keep`."""
        what = f"one {self.tile} tile of {self.graph.name!r}"
        return self.with_retries(lambda made: self._block(x, starts, keep, made), what)

    def _block(self, x: np.ndarray, starts: Sequence[Sequence[int]], keep: tuple[slice, ...],
               made: list[Any]) -> np.ndarray:
        dev, out, tile = self.device, self.out, self.tile
        origin = [s[0] for s in starts]
        extent = tuple(starts[a][-1] + out[a] - origin[a] for a in range(3))
        y = dev.alloc((self.graph.out_channels, *extent), F32, "tile outputs")  # (Cout, *E)
        made.append(y)
        rels = [tuple(p[a] - origin[a] for a in range(3)) for p in product(*starts)]
        variants = self.flips.variants() if self.flips is not None else ((),)
        items = [(r, k) for r in rels for k in range(len(variants))]  # a tile's copies together
        mean = None if self.flips is None else dev.alloc((self.graph.out_channels, *out), F32,
                                                        "flip mean")  # (Cout, *out)
        if mean is not None:
            made.append(mean)
        stream = self.inputs((self.graph.in_channels, *tile))
        for i in range(0, len(items), self.batch):
            batch = items[i: i + self.batch]

            def fill(host: np.ndarray, batch: list[tuple[tuple[int, ...], int]] = batch) -> None:
                for j, (r, k) in enumerate(batch):
                    src = tuple(slice(r[a], r[a] + tile[a]) for a in range(3))
                    host[j] = np.flip(x[(slice(None), *src)], tuple(1 + v for v in variants[k]))

            stream.submit(len(batch), fill, self._placer(y, batch, mean, variants, made), "tiles")
        part = y[(slice(None), *keep)]
        kept = dev.alloc(tuple(part.shape), F32, "block output")  # (Cout, *write)
        made.append(kept)
        dev.launch(dev.stream("compute"), lambda: kept.__setitem__(Ellipsis, part), "keep")
        values = download(dev, kept)
        self.free_made(made)
        return values

    def _placer(self, y: Any, batch: list[tuple[tuple[int, ...], int]], mean: Any,
                variants: tuple[tuple[int, ...], ...], made: list[Any]) -> Any:
        """The batch's launch: each tile's output placed in `y`; with flips, each copy's
        flipped back into the tile's `mean`, placed after its last copy."""
        ops, graph, prims, out = self.ops, self.graph, self.primitives, self.out
        n = len(variants)

        def work(inputs: Any) -> None:
            outs = run_graph_device(graph, inputs, ops, prims)  # (B, Cout, *out)
            made.append(outs)
            for j, (r, k) in enumerate(batch):
                dst = tuple(slice(r[a], r[a] + out[a]) for a in range(3))
                if mean is None:
                    y[(slice(None), *dst)] = outs[j]
                    continue
                flip_back_into(ops.device.xp, mean, outs[j], variants[k], k == 0, k == n - 1, n)
                if k == n - 1:
                    y[(slice(None), *dst)] = mean
            ops.free(outs)

        return work
