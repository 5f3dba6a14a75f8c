"""A windowed block on the GPU: windows batched on the device, blending on the device.

The device twin of the windowed worker's host path (workers/windowed.py with
windows.blend_box): the same windows in MONAI's order, the same window groups
(windows.window_group), the same float32 sums, so a block's output equals the host
path's (bit for bit on the stand-in at fp32). Batches stream in through
device_stream.InputStream; each window output is blended into float32 accumulators on
the device as soon as its batch has run, and only the block's finished output comes
back. Windows that straddle the block are kept on the device (a cache bounded in bytes,
counted) for the next blocks, as the host path keeps them in RAM.

An allocation failure anywhere in a block (a launch, or a stream that failed) frees
what the block made, empties the kept windows, halves the batch and runs the block
again; at one window it is an error that names the cap.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from math import prod
from typing import Any

import numpy as np

from znni.engine.compute.device_stream import DeviceBlocks, download
from znni.engine.compute.graph_device import run_graph_device
from znni.engine.compute.tta import FlipSpec, flip_back_into
from znni.engine.compute.windows import (
    BlendMode,
    WindowGrid,
    importance_map,
    overlap,
    window_group,
    window_input,
    window_inside,
    windows_touching,
)
from znni.model.graph import Graph
from znni.primitives.gpu.device import Device
from znni.primitives.gpu.graph_device import DeviceGraphOps
from znni.triple import Triple

F32 = np.float32


@dataclass
class _Group:
    """A batch's output on the device, filled by its launch; freed when its last window
    of this block has been blended."""

    starts: tuple[Triple, ...]
    outs: Any = None  # (B, Cout, *W) device array, set on the compute stream
    pending: int = 0  # this block's windows of the group not yet blended


class _Slot:
    """One kept window output: filled on the compute stream, evicted by the host. Evicting
    stops counting it (the array itself lives while a queued blend still reads it); a slot
    evicted before its launch ran is never filled."""

    def __init__(self) -> None:
        self.array: Any = None
        self.evicted = False
        self._lock = threading.Lock()

    def fill(self, device: Device, array: Any) -> None:
        with self._lock:
            if not self.evicted:
                self.array = device.adopt(array, "kept window")

    def evict(self, device: Device) -> None:
        with self._lock:
            self.evicted = True
            if self.array is not None and device.counted(self.array):
                device.free(self.array)


@dataclass
class _Kept:
    """Device outputs of straddling windows, LRU bounded in bytes (sizes are known on the
    host, which decides what is kept)."""

    max_bytes: int
    entries: OrderedDict[Triple, _Slot] = field(default_factory=OrderedDict)
    nbytes: int = 0


class DeviceWindows(DeviceBlocks):
    """Runs windowed blocks of one graph on `ops.device` (one per worker)."""

    def __init__(self, ops: DeviceGraphOps, graph: Graph, grid: WindowGrid, mode: BlendMode,
                 primitives: Mapping[str, str], batch: int, kept_bytes: int,
                 flips: FlipSpec | None = None) -> None:
        super().__init__(ops.device, batch, ops.dtype)
        self.ops, self.graph, self.grid, self.mode = ops, graph, grid, mode
        self.flips = flips  # test-time flips: a window's copies are consecutive batch items
        self.primitives = dict(primitives)
        self.kept = _Kept(int(kept_bytes))
        self.cout = graph.out_channels
        self.window_bytes = self.cout * prod(grid.window) * ops.dtype.itemsize
        self._imp: Any = None

    def block(self, x: np.ndarray, origin: Triple, lo: Triple, hi: Triple) -> np.ndarray:
        """(Cout, *(hi - lo)) float32 blended output of the volume box [lo, hi); `x` is the
        block's (C, RZ, RY, RX) float32 input read from `origin`."""
        what = f"one {self.grid.window} window of {self.graph.name!r}"
        return self.with_retries(lambda made: self._block(x, origin, lo, hi, made), what)

    def _block(self, x: np.ndarray, origin: Triple, lo: Triple, hi: Triple,
               made: list[Any]) -> np.ndarray:
        dev, grid = self.ops.device, self.grid
        shape = tuple(h - a for a, h in zip(lo, hi, strict=True))
        acc = dev.alloc((self.cout, *shape), F32, "blend sums")  # (Cout, BZ, BY, BX)
        made.append(acc)
        wsum = dev.alloc(shape, F32, "blend weights")
        made.append(wsum)
        imp = self._importance()
        comp = dev.stream("compute")

        def zero() -> None:
            acc.fill(0)
            wsum.fill(0)

        dev.launch(comp, zero, "blend zero")
        windows = windows_touching(grid, lo, hi)
        touching = set(windows)
        groups: dict[Triple, _Group] = {}
        for start in windows:
            source = self._source(start, groups, touching, x, origin, lo, hi, made)
            touching.discard(start)  # blended: no longer pending in any group
            dev.launch(comp, self._blend_step(acc, wsum, imp, source, start, lo, hi, groups),
                       "blend")
        if windows:
            dev.launch(comp, lambda: acc.__itruediv__(wsum), "blend divide")
        out = download(dev, acc)
        self.free_made(made)
        return out

    def _source(self, start: Triple, groups: dict[Triple, _Group], touching: set[Triple],
                x: np.ndarray, origin: Triple, lo: Triple, hi: Triple,
                made: list[Any]) -> Any:
        """Where window `start`'s output will be: its group's batch or a kept array."""
        if start in groups:
            return groups[start]
        kept = self.kept.entries.get(start)
        if kept is not None:
            self.kept.entries.move_to_end(start)
            return kept
        group = _Group(window_group(self.grid, start, self.batch))
        group.pending = sum(s in touching and s not in groups for s in group.starts)
        for s in group.starts:
            groups.setdefault(s, group)
        keep = [s for s in group.starts if not window_inside(self.grid, s, lo, hi)]
        self._run_group(group, keep, x, origin, made)
        return group

    def _run_group(self, group: _Group, keep: list[Triple], x: np.ndarray, origin: Triple,
                   made: list[Any]) -> None:
        """Queue the group's upload and its graph run; the outputs of `keep` are copied
        into kept arrays on the same launch."""
        if self.flips is not None:
            self._run_flipped(group, keep, x, origin, made, self.flips)
            return
        stream = self.inputs((self.graph.in_channels, *self.grid.window))
        slots = [self._keep_slot(s) for s in keep]
        ops, graph, prims = self.ops, self.graph, self.primitives
        dev, starts = ops.device, group.starts

        def fill(host: np.ndarray) -> None:
            for j, s in enumerate(starts):
                host[j] = window_input(x, origin, s, self.grid)

        def work(batch: Any) -> None:
            group.outs = run_graph_device(graph, batch, ops, prims)  # (B, Cout, *W)
            made.append(group.outs)
            for s, slot in zip(keep, slots, strict=True):
                if slot is not None:
                    slot.fill(dev, group.outs[starts.index(s)].copy())

        stream.submit(len(starts), fill, work, "windows")

    def _run_flipped(self, group: _Group, keep: list[Triple], x: np.ndarray, origin: Triple,
                     made: list[Any], flips: FlipSpec) -> None:
        """The group's windows times their flipped copies, `batch` items an upload; each
        output flipped back into its window's float32 mean (compute/tta.py), which the
        group's blends read once its last batch has run."""
        stream = self.inputs((self.graph.in_channels, *self.grid.window))
        ops, graph, prims, grid = self.ops, self.graph, self.primitives, self.grid
        dev, starts, variants = ops.device, group.starts, flips.variants()
        n = len(variants)
        means = dev.alloc((len(starts), self.cout, *grid.window), F32, "flip means")
        made.append(means)  # (B, Cout, *W)
        items = [(j, k) for j in range(len(starts)) for k in range(n)]
        slots = [self._keep_slot(s) for s in keep]
        for i in range(0, len(items), self.batch):
            part = items[i: i + self.batch]
            done = i + self.batch >= len(items)

            def fill(host: np.ndarray, part: list[tuple[int, int]] = part) -> None:
                for m, (j, k) in enumerate(part):
                    win = window_input(x, origin, starts[j], grid)  # (C, *W)
                    host[m] = np.flip(win, tuple(1 + v for v in variants[k]))

            def work(batch: Any, part: list[tuple[int, int]] = part, done: bool = done) -> None:
                ys = run_graph_device(graph, batch, ops, prims)  # (b, Cout, *W)
                made.append(ys)
                for m, (j, k) in enumerate(part):
                    flip_back_into(dev.xp, means[j], ys[m], variants[k], k == 0, k == n - 1, n)
                ops.free(ys)
                if done:
                    group.outs = means
                    for s, slot in zip(keep, slots, strict=True):
                        if slot is not None:
                            slot.fill(dev, means[starts.index(s)].copy())

            stream.submit(len(part), fill, work, "windows")

    def _blend_step(self, acc: Any, wsum: Any, imp: Any, source: Any, start: Triple,
                    lo: Triple, hi: Triple, groups: dict[Triple, _Group]) -> Any:
        win_sl, box_sl = overlap(self.grid, start, lo, hi)
        dev = self.ops.device

        def step() -> None:
            if isinstance(source, _Group):
                out = source.outs[source.starts.index(start)]
            else:
                out = source.array
            part = out[(slice(None), *win_sl)].astype(F32) * imp[win_sl]
            acc[(slice(None), *box_sl)] += part
            wsum[box_sl] += imp[win_sl]
            if isinstance(source, _Group):
                source.pending -= 1
                if source.pending == 0 and source.outs is not None:
                    dev.free(source.outs)
                    source.outs = None

        return step

    def _keep_slot(self, start: Triple) -> _Slot | None:
        """A place for a straddling window's kept output, evicting the least recently
        used; None when one window alone is over the cache's bound."""
        if self.window_bytes > self.kept.max_bytes:
            return None
        dev = self.ops.device
        while self.kept.entries and self.kept.nbytes + self.window_bytes > self.kept.max_bytes:
            _, gone = self.kept.entries.popitem(last=False)
            self.kept.nbytes -= self.window_bytes
            gone.evict(dev)
        slot = _Slot()
        self.kept.entries[start] = slot
        self.kept.nbytes += self.window_bytes
        return slot

    def _importance(self) -> Any:
        if self._imp is None:
            imp = importance_map(self.grid.window, self.mode)
            self._imp = self.ops.device.adopt(self.ops.device.xp.asarray(imp), "importance map")
        return self._imp

    def recover(self, made: list[Any]) -> None:
        """The shared recovery, and the kept windows emptied (memory is short)."""
        super().recover(made)
        for slot in self.kept.entries.values():
            slot.evict(self.device)
        self.kept.entries.clear()
        self.kept.nbytes = 0

    def close(self) -> None:
        super().close()
        if self._imp is not None:
            self.device.free(self._imp)
            self._imp = None
