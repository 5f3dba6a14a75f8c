"""Per-device stages of a plan: which primitive each layer takes, its seconds and bytes.

A stage is a run of consecutive ops on one device. The CPU stage picks, per
layer, the fastest of direct / fft-recompute that fits, then upgrades the
layers with the best seconds saved per byte to fft-keep while the kept
spectra still fit. GPU stages split the batch of fragments (or, when
streamed from host RAM, the output channels) into chunks until a layer fits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import ceil

from znni.model.network import LayerShape
from znni.planner.costs import GPU_CONV_PRIMITIVES, layer_seconds, transfer_seconds
from znni.planner.machine import MachineProfile
from znni.planner.memory import layer_memory, pass_peak_bytes, workspace_cache_bytes


@dataclass(frozen=True)
class Stage:
    device: str  # "cpu" or "gpu"
    shapes: tuple[LayerShape, ...]
    primitives: tuple[str | None, ...]
    layer_seconds: tuple[float, ...]
    layer_bytes: tuple[int, ...]
    sub_batches: int = 1

    @property
    def seconds(self) -> float:
        return sum(self.layer_seconds)

    @property
    def device_peak_bytes(self) -> int:
        return max(self.layer_bytes, default=0)


def fused(shapes: list[LayerShape] | tuple[LayerShape, ...], i: int) -> bool:
    """An activation right after a conv runs inside the conv (dense_forward fuses them)."""
    return i > 0 and shapes[i].kind not in ("conv", "maxpool") and shapes[i - 1].kind == "conv"


def cpu_stage(shapes: list[LayerShape], machine: MachineProfile, budget: int) -> Stage | None:
    """Fastest CPU primitives whose pass fits in `budget` bytes (baseline excluded)."""
    if budget <= 0:
        return None
    threads = machine.cores
    held = shapes[0].in_bytes  # the caller keeps the patch input alive
    prims: list[str | None] = []
    times: list[float] = []
    for i, sh in enumerate(shapes):
        if sh.kind != "conv":
            prims.append(None)
            times.append(0.0 if fused(shapes, i) else layer_seconds(sh, None, machine))
            continue
        options = [
            (layer_seconds(sh, p, machine), p)
            for p in ("fft-recompute", "direct")
            if layer_memory(sh, p, threads).live_bytes + (held if i else 0) <= budget
        ]
        if not options:
            return None
        t, p = min(options)
        prims.append(p)
        times.append(t)
    upgrade_to_keep(shapes, machine, budget, prims=prims, times=times)
    ws = workspace_cache_bytes(budget)
    _, per_layer = pass_peak_bytes(shapes, prims, threads=threads, workspace_bytes=ws)
    while max(per_layer) > budget:  # the tiled FFT path can outgrow the quick estimate
        if not _fall_back(shapes, machine, prims=prims, times=times, per_layer=per_layer,
                          budget=budget):
            return None
        _, per_layer = pass_peak_bytes(shapes, prims, threads=threads, workspace_bytes=ws)
    kept = sum(layer_memory(sh, p).kept_bytes for sh, p in zip(shapes, prims, strict=True))
    for i, (sh, prim) in enumerate(zip(shapes, prims, strict=True)):
        if prim == "fft-keep":  # the real cache bound decides its tiling
            times[i] = layer_seconds(sh, prim, machine, spectra_budget=kept)
    return Stage("cpu", tuple(shapes), tuple(prims), tuple(times), tuple(per_layer))


FALLBACK = {"fft-keep": "fft-recompute", "fft-recompute": "direct"}


def _fall_back(
    shapes: list[LayerShape],
    machine: MachineProfile,
    *,
    prims: list[str | None],
    times: list[float],
    per_layer: list[int],
    budget: int,
) -> bool:
    """Move the conv layer with the largest peak over `budget` to its next leaner primitive
    (fft-keep -> fft-recompute -> direct); False when none is left."""
    over = sorted((b, i) for i, b in enumerate(per_layer) if b > budget and prims[i] in FALLBACK)
    if not over:
        return False
    i = over[-1][1]
    prim = prims[i]
    assert prim is not None  # `over` holds only layers whose primitive has a fallback
    prims[i] = FALLBACK[prim]
    times[i] = layer_seconds(shapes[i], prims[i], machine)
    return True


def upgrade_to_keep(
    shapes: list[LayerShape],
    machine: MachineProfile,
    budget: int,
    *,
    prims: list[str | None],
    times: list[float],
) -> None:
    """Keep kernel spectra where it saves the most seconds per byte, while the pass fits."""
    gains = []
    for i, sh in enumerate(shapes):
        if sh.kind != "conv":
            continue
        t_keep = layer_seconds(sh, "fft-keep", machine)
        kept = layer_memory(sh, "fft-keep").kept_bytes
        if t_keep < times[i]:
            gains.append(((times[i] - t_keep) / max(1, kept), i, t_keep))
    for _, i, t_keep in sorted(gains, reverse=True):
        old = prims[i]
        prims[i] = "fft-keep"
        peak, _ = pass_peak_bytes(shapes, prims, threads=machine.cores,
                                  workspace_bytes=workspace_cache_bytes(budget))
        if peak <= budget:
            times[i] = t_keep
        else:
            prims[i] = old


def gpu_stage(shapes: list[LayerShape], machine: MachineProfile, gpu_bytes: int) -> Stage | None:
    """All `shapes` on the GPU, the batch of fragments split into the fewest chunks that fit."""
    batch = shapes[0].batch_in
    for k in (d for d in range(1, batch + 1) if batch % d == 0):
        chunk = [replace(s, batch_in=s.batch_in // k, batch_out=s.batch_out // k) for s in shapes]
        held = chunk[0].in_bytes
        prims: list[str | None] = []
        times: list[float] = []
        sizes: list[int] = []
        for i, sh in enumerate(chunk):
            if sh.kind != "conv":
                prims.append(None)
                times.append(0.0 if fused(chunk, i) else k * layer_seconds(sh, "gpu", machine))
                sizes.append(held + layer_memory(sh, None).live_bytes)
                continue
            best = _fastest_gpu(sh, machine, gpu_bytes - held)
            if best is None:
                break
            prims.append(best[1])
            times.append(k * best[0])
            sizes.append(held + best[2])
        else:
            if max(sizes) <= gpu_bytes:
                return Stage("gpu", tuple(shapes), tuple(prims), tuple(times), tuple(sizes), k)
    return None


def _fastest_gpu(
    sh: LayerShape, machine: MachineProfile, budget: int
) -> tuple[float, str, int] | None:
    options = []
    for p in GPU_CONV_PRIMITIVES:
        live = layer_memory(sh, p).live_bytes
        if live <= budget:
            options.append((layer_seconds(sh, p, machine), p, live))
    return min(options) if options else None


def streamed_stage(
    shapes: list[LayerShape], machine: MachineProfile, gpu_bytes: int
) -> Stage | None:
    """GPU + host RAM: one layer at a time, chunks streamed host <-> GPU on two streams,
    so a layer takes the longer of its compute and its copies (ZNNi "GPU + host RAM")."""
    gpu = machine.gpu
    assert gpu is not None
    prims: list[str | None] = []
    times: list[float] = []
    sizes: list[int] = []
    for i, sh in enumerate(shapes):
        if fused(shapes, i):
            prims.append(None)
            times.append(0.0)
            sizes.append(0)
            continue
        found: tuple[str | None, float, int] | None = None  # (primitive, seconds, bytes)
        k = 1
        while found is None and k <= max(sh.batch_in, sh.channels_out):
            chunk = _chunk(sh, k)
            if sh.kind == "conv":
                best = _fastest_gpu(chunk, machine, gpu_bytes)
                if best is not None:
                    found = (best[1], k * best[0], best[2])
            else:
                live = layer_memory(chunk, None).live_bytes
                if live <= gpu_bytes:
                    found = (None, k * layer_seconds(chunk, "gpu", machine), live)
            k *= 2
        if found is None:
            return None
        copy_s = transfer_seconds(sh.in_bytes + sh.out_bytes, gpu)
        prims.append(found[0])
        times.append(max(found[1], copy_s))
        sizes.append(found[2])
    return Stage("gpu", tuple(shapes), tuple(prims), tuple(times), tuple(sizes))


def _chunk(sh: LayerShape, k: int) -> LayerShape:
    """1/k of a layer: a slice of the batch when it divides, else of the output channels."""
    if sh.batch_in % k == 0:
        return replace(sh, batch_in=sh.batch_in // k, batch_out=sh.batch_out // k)
    g = ceil(sh.channels_out / k)
    return replace(sh, channels_out=g) if sh.kind == "conv" else sh
