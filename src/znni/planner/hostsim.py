"""Exact host bytes of a dense pass on CpuBackend, by replaying its allocations.

CpuBackend (primitives/cpu) allocates each layer's output, checks FFT
workspaces out of an LRU of free workspaces bounded in bytes (kept between
layers and patches), and keeps kernel spectra in a second bounded LRU. The
peak therefore depends on the order of calls, so this module replays that
order with byte counts instead of arrays: same chunking rules, same keys,
same bounds. Mirrors fft_conv.fft_conv3d, direct_conv.direct_conv3d,
pooling.mpf and fragments.recombine.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from math import prod

from znni.model.network import LayerShape
from znni.planner.costs import (
    COMPLEX_BYTES,
    FLOAT_BYTES,
    RECOMPUTE_BYTES,
    SLAB_BYTES,
    WORK_BYTES,
)
from znni.planner.tiles import fft_tiles, recompute_width, tiled_layer
from znni.primitives.cpu.direct_conv import block_columns, block_shape, worker_bytes
from znni.primitives.cpu.heap import SEQUENTIAL_MMAP_THRESHOLD_BYTES
from znni.primitives.fft_sizes import padded_shape, spectrum_points

# glibc maps every allocation at or above the sequential pass's mmap threshold afresh
# (primitives/cpu/heap.py) and unmaps it on free, so each pass faults those pages in again
FRESH_ABOVE_BYTES = SEQUENTIAL_MMAP_THRESHOLD_BYTES


@dataclass(frozen=True)
class PassReplay:
    """A replayed pass: the peak, each layer's peak and each layer's bytes of fresh
    mappings (allocations of at least FRESH_ABOVE_BYTES), of the last patch."""

    peak_bytes: int
    layer_peaks: list[int]
    layer_fresh_bytes: list[int]
    first_peak_bytes: int = 0  # the peak when the first patch ended (a lone patch's)


class HostSim:
    """Live arrays + free workspaces (LRU, bounded) + kept spectra (LRU, bounded); tracks peak."""

    def __init__(self, workspace_bytes: int, spectra_bytes: int, base_bytes: int = 0,
                 fresh_above_bytes: int = FRESH_ABOVE_BYTES) -> None:
        self.ws_bound = workspace_bytes
        self.fresh_above = fresh_above_bytes
        self.fresh_bytes = 0  # allocated by fresh mmaps (see FRESH_ABOVE_BYTES)
        self.sp_bound = spectra_bytes
        self.live = base_bytes
        self.free: OrderedDict[Hashable, list[int]] = OrderedDict()
        self.spectra: OrderedDict[Hashable, int] = OrderedDict()
        self.free_bytes = 0
        self.spectra_bytes = 0
        self.peak = base_bytes

    def total(self) -> int:
        return self.live + self.free_bytes + self.spectra_bytes

    def alloc(self, nbytes: int) -> None:
        if nbytes >= self.fresh_above:
            self.fresh_bytes += nbytes
        self.live += nbytes
        self.peak = max(self.peak, self.total())

    def release(self, nbytes: int) -> None:
        self.live -= nbytes

    def checkout(self, key: Hashable, nbytes: int) -> None:
        lst = self.free.get(key)
        if lst:
            lst.pop()
            self.free_bytes -= nbytes
            if not lst:
                del self.free[key]
            self.live += nbytes
        else:
            self.alloc(nbytes)

    def checkin(self, key: Hashable, nbytes: int) -> None:
        self.live -= nbytes
        if nbytes > self.ws_bound:
            return
        self.free.setdefault(key, []).append(nbytes)
        self.free.move_to_end(key)
        self.free_bytes += nbytes
        while self.free_bytes > self.ws_bound:
            k0, lst = next(iter(self.free.items()))
            self.free_bytes -= lst.pop(0)
            if not lst:
                del self.free[k0]

    def kept_spectra(self, key: Hashable, nbytes: int, make: Callable[[], object]) -> bool:
        """SpectraCache.get_or_make; returns True when the spectra are transient (not kept)."""
        if key in self.spectra:
            self.spectra.move_to_end(key)
            return False
        if nbytes <= self.sp_bound:
            while self.spectra and self.spectra_bytes + nbytes > self.sp_bound:
                self.spectra_bytes -= self.spectra.popitem(last=False)[1]
        make()
        if nbytes <= self.sp_bound:
            self.release(nbytes)
            self.spectra[key] = nbytes
            self.spectra_bytes += nbytes
            return False
        return True


def _rfftn(sim: HostSim, images: int, size: tuple[int, ...],
           padded: tuple[int, int, int]) -> tuple[Hashable, int]:
    """pruned_rfftn workspace: a (b, nz, ny, Nx) float32 + d (b, Nz, Ny, Fx) complex64."""
    nbytes = images * (size[0] * size[1] * padded[2] * FLOAT_BYTES
                       + spectrum_points(padded) * COMPLEX_BYTES)
    key = ("rfftn", images, tuple(size), padded)
    sim.checkout(key, nbytes)
    return key, nbytes


def _kernel_spectra(sim: HostSim, sh: LayerShape, cout: int, padded: tuple[int, int, int]) -> int:
    """kernel_spectra: the (F, cout, Cin) result, made RECOMPUTE_BYTES of channels at a time."""
    cin, nf = sh.channels_in, spectrum_points(padded)
    out_bytes = nf * cout * cin * COMPLEX_BYTES
    sim.alloc(out_bytes)
    oc = max(1, min(cout, RECOMPUTE_BYTES // max(1, cin * nf * COMPLEX_BYTES)))
    for width in _chunk_sizes(cout, oc):
        scaled = width * cin * prod(sh.kernel) * FLOAT_BYTES  # weight * scale temporary
        sim.alloc(scaled)
        key, nbytes = _rfftn(sim, width * cin, sh.kernel, padded)
        sim.checkin(key, nbytes)
        sim.release(scaled)
    return out_bytes


def _freq_product(
    sim: HostSim, s: int, *, cin: int, cout: int, nf: int, threads: int, chunk_cout: int = 0
) -> None:
    """freq_product: each running task holds (fc, Cin, S) and (fc, Cout, S) complex copies;
    fc from fft_conv._chunk_f (about 1 MiB of inputs and outputs, at least 64)."""
    fc = max(64, 2**20 // ((cin + (chunk_cout or cout)) * s * COMPLEX_BYTES))
    tasks = min(threads, -(-nf // fc))
    nbytes = tasks * min(fc, nf) * (cin + cout) * s * COMPLEX_BYTES
    sim.alloc(nbytes)
    sim.release(nbytes)


def fft_conv(sim: HostSim, sh: LayerShape, keep: bool, threads: int) -> None:
    """CpuBackend._run_fft: overlap-save tiles when the backend's tiling model picks them
    (the output, one reused buffer of a transform chunk of input tiles, and fft_conv3d per
    chunk, whose result is scattered into the output and freed), else fft_conv3d on the
    whole input. Input is already live; output stays live."""
    m = fft_tiles(sh, "fft-keep" if keep else "fft-recompute", sim.sp_bound)
    tiled = tiled_layer(sh, m)
    if tiled is sh:
        _fft_conv3d(sim, sh, keep=keep, threads=threads)
        return
    nf = spectrum_points(padded_shape(tiled.size_in))
    cin, cout = sh.channels_in, sh.channels_out
    width = cout if keep else recompute_width(tiled)
    group = min(tiled.batch_in, max(1, WORK_BYTES // ((cin + width) * nf * COMPLEX_BYTES)))
    buf = group * cin * prod(tiled.size_in) * FLOAT_BYTES
    sim.alloc(sh.out_bytes)
    sim.alloc(buf)
    for part in _chunk_sizes(cout, width):
        # without kept spectra, each part of the output channels has its spectra made once
        kbytes = 0 if keep else _kernel_spectra(sim, tiled, part, padded_shape(tiled.size_in))
        for b in _chunk_sizes(tiled.batch_in, group):
            chunk = replace(tiled, batch_in=b, batch_out=b, channels_out=part)
            # its (b, part, t_out) result
            _fft_conv3d(sim, chunk, keep=keep, threads=threads, given=not keep)
            sim.release(chunk.out_bytes)
        sim.release(kbytes)
    sim.release(buf)


def _fft_conv3d(
    sim: HostSim, sh: LayerShape, *, keep: bool, threads: int, given: bool = False
) -> None:
    """fft_conv3d (with CpuBackend.kept_spectra first when `keep`; `given`: spectra the caller
    made and holds, used like kept ones). Input is already live."""
    padded = padded_shape(sh.size_in)
    nf = spectrum_points(padded)
    s, cin, cout = sh.batch_in, sh.channels_in, sh.channels_out
    transient = 0
    if keep:
        key = ("spectra", sh.index, padded)
        nbytes = nf * cin * cout * COMPLEX_BYTES
        if sim.kept_spectra(key, nbytes, lambda: _kernel_spectra(sim, sh, cout, padded)):
            transient = nbytes
    sim.alloc(sh.out_bytes)
    sc = max(1, min(s, WORK_BYTES // ((cin + cout) * nf * COMPLEX_BYTES)))
    oz, oy, _ = sh.size_out
    for b in _chunk_sizes(s, sc):
        fkey, fbytes = _rfftn(sim, b * cin, sh.size_in, padded)
        ikey = ("irfftn", b * cout, padded, sh.size_out)
        ibytes = b * cout * (nf * COMPLEX_BYTES + oz * oy * padded[2] * FLOAT_BYTES)
        sim.checkout(ikey, ibytes)
        if keep or given:
            _freq_product(sim, b, cin=cin, cout=cout, nf=nf, threads=threads)
        else:
            oc = max(1, min(cout, RECOMPUTE_BYTES // max(1, cin * nf * COMPLEX_BYTES)))
            for width in _chunk_sizes(cout, oc):
                kbytes = _kernel_spectra(sim, sh, width, padded)
                _freq_product(sim, b, cin=cin, cout=width, nf=nf, threads=threads,
                              chunk_cout=cout)
                sim.release(kbytes)
        sim.checkin(fkey, fbytes)
        sim.checkin(ikey, ibytes)
    sim.release(transient)


def _chunk_sizes(total: int, chunk: int) -> list[int]:
    """Sizes of the chunks a loop over `total` in steps of `chunk` sees, with runs of equal
    full chunks cut to two: a third identical chunk reuses the same workspaces, so it
    cannot raise the peak."""
    full, rest = divmod(total, chunk)
    return [chunk] * min(full, 2) + ([rest] if rest else [])


def direct_bytes(sh: LayerShape, threads: int, slab_bytes: int = SLAB_BYTES) -> int:
    """Peak bytes of direct_conv3d besides its input: the output plus, per busy worker, a
    column buffer (rows, L + (gemms-1)*X) (none for 1^3 kernels), a GEMM result (Cout, L)
    and, with several GEMMs, a second one to accumulate from.

    Closed form of primitives/cpu/direct_conv.direct_bytes (which lists every block; too slow
    inside the search): the largest block is the first, shaped by its `block_shape`.
    tests/planner/test_planner_tiling.py checks the two agree."""
    s, cin, cout = sh.batch_in, sh.channels_in, sh.channels_out
    _, ny, nx = sh.size_in
    oz, oy, ox = sh.size_out
    depth = cin * prod(sh.kernel)  # blocks are sized by the full depth, split or not
    zb, yb = block_shape(s, sh.size_out, sh.size_in, depth, slab_bytes, threads)
    cap = block_columns(zb, yb, ny, nx, ox)  # L of the largest block
    blocks = s * -(-oz // zb) * -(-oy // yb)
    per_worker = worker_bytes(cin, cout, sh.kernel, cap, nx)
    return sh.out_bytes + min(threads, blocks) * per_worker


def direct_conv(sim: HostSim, sh: LayerShape, threads: int) -> None:
    """direct_conv3d: the output stays live, the per-worker buffers are freed."""
    workers = direct_bytes(sh, threads) - sh.out_bytes
    sim.alloc(sh.out_bytes)
    sim.alloc(workers)
    sim.release(workers)


def mpf(sim: HostSim, sh: LayerShape) -> None:
    """pooling.mpf: the fragments array; its sliding-max temporaries are cache-sized blocks
    (pooling.BLOCK_BYTES, a few MiB over all threads), below this model's resolution."""
    sim.alloc(sh.out_bytes)


def replay_pass(
    shapes: list[LayerShape],
    primitives: list[str | None],
    *,
    threads: int,
    base_bytes: int = 0,
    workspace_bytes: int = 2**30,
    spectra_bytes: int | None = None,
    patches: int = 2,
) -> PassReplay:
    """`patches` dense_forward calls in a row, replayed.

    The caller holds each patch input for the whole pass; the dense output is
    recombined by one copy. spectra_bytes: the backend's spectra cache bound
    (default: exactly the kept spectra of every fft-keep layer).
    """
    if spectra_bytes is None:
        spectra_bytes = sum(
            spectrum_points(padded_shape(sh.size_in)) * sh.channels_in * sh.channels_out
            * COMPLEX_BYTES
            for sh, p in zip(shapes, primitives, strict=True)
            if p == "fft-keep"
        )
    sim = HostSim(workspace_bytes, spectra_bytes, base_bytes)
    per_layer: list[int] = []
    fresh: list[int] = []
    first = 0
    for _ in range(patches):
        sim.alloc(shapes[0].in_bytes)
        per_layer, fresh = [], []
        for i, (sh, prim) in enumerate(zip(shapes, primitives, strict=True)):
            sim.peak, overall = sim.total(), sim.peak
            fresh0 = sim.fresh_bytes
            produced = sh.kind in ("conv", "maxpool")
            if sh.kind == "conv":
                if prim == "direct":
                    direct_conv(sim, sh, threads)
                else:
                    fft_conv(sim, sh, prim == "fft-keep", threads)
            elif sh.kind == "maxpool":
                mpf(sim, sh)
            if produced and i > 0:
                sim.release(sh.in_bytes)  # the previous layer's output is dropped
            per_layer.append(sim.peak)
            fresh.append(sim.fresh_bytes - fresh0)
            sim.peak = max(sim.peak, overall)
        final = shapes[-1].out_bytes
        sim.alloc(final)  # recombine's transposed copy
        sim.release(final + shapes[-1].out_bytes + shapes[0].in_bytes)
        first = first or sim.peak
    return PassReplay(sim.peak, per_layer, fresh, first)
