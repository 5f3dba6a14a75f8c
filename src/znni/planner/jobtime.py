"""The predicted time of a whole `znni segment` process over a planned block layout.

Stages (seconds), summed: start-up (interpreter, imports, opening the arrays), FFTW's
planning of every FFT layer shape this machine has not run before (its wisdom is then
saved, so a second run skips it), the first pass's pages, every block's patches (their
clipped shapes, planner.blocks), and the reads and writes the read-ahead and
write-behind threads do not hide behind the compute. Rates are this machine's where
measured (the plan's patch time), else the constants below (measured on the 2-core
CI VM, 2026-11-27); another machine's profile has no I/O rates, so they are used there
too, and its FFTW state is unknown (counted as warm). What FFTW must still plan is
asked of FFTW's own wisdom (cold_fft), not of a record of past runs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass
from math import prod
from typing import TYPE_CHECKING, Any

from znni.model.network import Network
from znni.planner.blocks import Edges, edges_blocks, layout_patches
from znni.planner.machine import DEFAULT_CPU_RATES
from znni.planner.plan import Plan
from znni.triple import as_triple

if TYPE_CHECKING:
    from znni.primitives.cpu.fft_workspaces import FftSettings

log = logging.getLogger(__name__)

# interpreter start, imports, plan and store set-up of `znni segment` outside its timed
# run: 0.7 s on the CI VM (10.2 s wall against 9.5 s reported, n337 w24 over 96^3)
STARTUP_S = 0.8
# FFTW_MEASURE plans each workspace's transforms by timing candidate algorithms on them,
# so its time follows the points they cover: b * padded points of the image transforms
# (kernel spectra folded in). The first constant, 37 ns, came from two n337/n726 runs
# (2026-11-27) and under-predicted every first run of the held-out draws of 2026-11-28
# (`znni bench planner job --held-out 5 --seed 52`, first run minus rerun over the points:
# 55, 66, 70, 101 and 226 ns): 70 ns is their median, and that set is now the tuning set
# (docs/benchmarks.md's held-out section reports the next seed's draws). The discount
# once given where wisdom of other shapes exists (15 ns) did not show in any first run
# measured since, and is gone. FFTW_ESTIMATE plans without timing. Planning speed is the
# CPU's (138-171 ns on the AVX2 AMD EPYC of 2026-11-29): the calibration now times it
# (cpu_measure.planning_step) and this constant stands only where none has.
COLD_S_PER_POINT = {"FFTW_ESTIMATE": 0.0,
                    "FFTW_MEASURE": DEFAULT_CPU_RATES["fftw_measure_s_per_point"]}
# the first pass's page faults in a whole run: 1.8 s over a 2.55 GiB pass (n337 w24 at
# 180^3, 7.3 s against 5.5 predicted, warm, CI VM), 0.66 ns/byte; the planner's own
# FIRST_PASS_S_PER_PEAK_BYTE (2 ns) is the top of a range it only compares plans with
FIRST_PASS_JOB_S_PER_BYTE = 0.7e-9
COLD_FFT_PRIMITIVES = ("fft-keep", "fft-recompute")
# zarr read + decode of local uint8 chunks (204 MB/s) and write of float32 chunks
# (276 MB/s), uint8 with the rounding rule (39 M values/s); CI VM, incompressible data
READ_BYTES_PER_S = 200e6
WRITE_VALUES_PER_S = {"float32": 69e6, "uint8": 39e6}


@dataclass(frozen=True)
class JobSeconds:
    startup_s: float
    fftw_planning_s: float
    first_pass_s: float
    patches_s: float
    io_s: float  # reads and writes not hidden behind the compute
    io_total_s: float  # every read and write
    peak_bytes: int  # the pass's peak, the input chunk cache and the blocks in flight
    total_s: float
    blocks: int
    patches: int
    computed_voxels: int  # output voxels the patches compute (clipped patches counted)
    ideal_voxels: int  # the same for whole patches over the region in one block
    cold_shapes: int  # FFT transform sets not in FFTW's wisdom, planned by the run (cold_fft)
    skipped_blocks: int = 0  # wholly outside the mask: written as the fill value, no compute
    planning_s: float = 0.0  # the planner's own search, as measured in this process

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def effort() -> str:
    """The FFTW effort the CPU backend plans with (primitives/cpu/backend.py)."""
    return os.environ.get("ZNNI_FFT_EFFORT", "FFTW_MEASURE")


def cold_fft(network: Network, input_size: Sequence[int], batch: int,
             primitives: Sequence[str | None] | None, settings: FftSettings | None = None,
             seen: set[Hashable] | None = None) -> tuple[int, int]:
    """(transform sets, points) FFTW would still measure for a pass over a patch of
    `input_size`: each FFT layer's workspaces (primitives/cpu/fft_workspaces) asked of
    FFTW's wisdom as saved now (another process's or venv's included). Points are the
    image transforms' b * padded points (the unit COLD_S_PER_POINT was fitted in; kernel
    spectra are folded into it). `seen`: workspaces already counted (a run plans each
    once), updated; a caller that passes it has read the saved wisdom (refresh_wisdom)."""
    from znni.primitives.cpu.backend import usable_cores
    from znni.primitives.cpu.fft_workspaces import FftSettings, layer_workspaces
    from znni.primitives.cpu.fftw_plans import in_wisdom, refresh_wisdom

    prims = tuple(primitives or ())
    threads, how = usable_cores(), effort()
    if seen is None and how != "FFTW_ESTIMATE":
        refresh_wisdom()
    settings, seen = settings or FftSettings(), set() if seen is None else seen
    sets = points = 0
    for layer in network.layer_shapes(as_triple(input_size), int(batch)):
        i = layer.index
        if layer.kind != "conv" or i >= len(prims) or prims[i] not in COLD_FFT_PRIMITIVES:
            continue
        x_shape = (layer.batch_in, layer.channels_in, *layer.size_in)
        w_shape = (layer.channels_out, layer.channels_in, *layer.kernel)
        for ws in layer_workspaces(prims[i] == "fft-keep", x_shape, w_shape, settings):
            if ws.key in seen:
                continue
            seen.add(ws.key)
            if not in_wisdom(ws.build, threads, how):
                sets += 1
                points += ws.points if ws.images else 0
    return sets, points


def job_seconds(
    plan: Plan, network: Network, edges: Edges, *, in_bytes: int, out_dtype: str,
    known_machine: bool = True, cache_bytes: int = 0, skipped: frozenset[int] = frozenset(),
    out_channels: int | None = None, planning_s: float = 0.0,
) -> JobSeconds:
    """The whole run's predicted seconds over `edges` (module docstring). `skipped`: the
    indices (in `edges_blocks` order) of blocks wholly outside the mask, which cost only
    their write of the fill value. `out_channels`: the stored output's (labels: 1; None:
    the network's). `planning_s`: the search that made `plan`, measured (a run of the
    same job searches the same candidates)."""
    patch, pool, fov = plan.output_size, network.pool_product, network.fov
    batch = max(1, int(plan.batch))
    full_in = prod(p + f - 1 for p, f in zip(patch, fov, strict=True))
    stored = out_channels or network.out_channels
    settings = _fft_settings(plan)
    per_block, cold, seen, held, cold_sets = [], 0.0, set[Hashable](), 0, 0
    per_point_s = cold_s_per_point() if known_machine else 0.0
    if known_machine and effort() != "FFTW_ESTIMATE":
        _refresh_wisdom()  # once per prediction, not per block
    for i, ((count, clipped), (lo, hi)) in enumerate(zip(layout_patches(edges, patch, pool),
                                                         edges_blocks(edges), strict=True)):
        count = 0 if i in skipped else count  # nothing read or computed
        size_in = tuple(c + f - 1 for c, f in zip(clipped, fov, strict=True))
        scale = prod(size_in) / full_in  # planner.blocks.axis_cost's model
        compute_s = -(-count // batch) * plan.predicted_patch_s * scale
        if count and known_machine:  # FFTW plans each workspace's transforms once
            sets, points = cold_fft(network, size_in, min(batch, count), plan.primitives,
                                    settings, seen)
            cold_sets += sets
            cold += per_point_s * points
        write = prod(h - a for a, h in zip(lo, hi, strict=True))
        read = prod(h - a + f - 1 for a, h, f in zip(lo, hi, fov, strict=True))
        read_s = read * network.in_channels * in_bytes / READ_BYTES_PER_S if count else 0.0
        write_s = write * stored / WRITE_VALUES_PER_S.get(out_dtype, 39e6)
        per_block.append((compute_s, read_s, write_s, count, prod(clipped) * count))
        held = max(held, _block_bytes(network, read, write, in_bytes))
    patches_s = sum(b[0] for b in per_block)
    io_s = _exposed_io(per_block)
    first_s = FIRST_PASS_JOB_S_PER_BYTE * plan.peak_bytes
    region = [e[-1] - e[0] for e in edges]
    ideal = prod(-(-r // p) * p for r, p in zip(region, patch, strict=True))
    total = STARTUP_S + planning_s + cold + first_s + patches_s + io_s
    io_total = sum(b[1] + b[2] for b in per_block)
    passes = sum(b[3] for b in per_block)
    pass_peak = one_patch_peak_bytes(plan, network) if passes == 1 else plan.peak_bytes
    peak = pass_peak + cache_bytes + (1 if len(per_block) == 1 else 2) * held
    return JobSeconds(STARTUP_S, cold, first_s, patches_s, io_s, io_total, peak, total,
                      len(per_block),
                      sum(b[3] for b in per_block), sum(b[4] for b in per_block), ideal,
                      cold_sets, sum(1 for b in per_block if not b[3]), planning_s)


def one_patch_peak_bytes(plan: Plan, network: Network) -> int:
    """`plan.peak_bytes` for a run of a single patch. The plan's peak is the second of two
    patches in a row (hostsim.replay_pass), which meets the FFT workspaces and kept spectra
    the first left cached (up to the workspace cache's bound) while its first layers run;
    one patch alone never does (n337 width 22, one 220x324x156 patch: traced allocations
    peaked at 2.19 GiB in the pass, the one-patch replay 2.20 GiB, the two-patch replay
    2.66 GiB). One replay gives both peaks, so only the carried-over cache is taken off.
    CPU plans only (a cpu-gpu plan's peak holds more than the replayed head)."""
    from znni.planner.hostsim import replay_pass
    from znni.primitives.cpu.backend import usable_cores

    if plan.algorithm != "cpu":
        return plan.peak_bytes
    shapes = network.layer_shapes(as_triple(plan.input_size), max(1, int(plan.batch)))
    replay = replay_pass(shapes, list(plan.primitives), threads=usable_cores(),
                         workspace_bytes=int(plan.workspace_cache_bytes))
    return plan.peak_bytes - (replay.peak_bytes - replay.first_peak_bytes)


def with_planning(job: dict[str, Any], planning_s: float) -> dict[str, Any]:
    """`job` (a JobSeconds dict) with the planner's search measured at `planning_s`."""
    total = job["total_s"] - job.get("planning_s", 0.0) + planning_s
    return {**job, "planning_s": planning_s, "total_s": total}


def with_settling(job: dict[str, Any], settling_s: float) -> dict[str, Any]:
    """`job` (graph_job_seconds' dict) with int8's or auto's settlement before the sweep
    (sampling the calibration windows, NNCF's quantization unless cached, the error on the
    held-out windows), as measured in this process at `settling_s`."""
    total = job["total_s"] - job.get("settling_s", 0.0) + settling_s
    return {**job, "settling_s": settling_s, "total_s": total}


def graph_job_seconds(
    region_s: float, region: Sequence[int], block: Sequence[int], margin: Sequence[int], *,
    in_channels: int, out_channels: int, in_bytes: int, out_dtype: str,
) -> dict[str, float | int]:
    """A graph model's whole run: start-up, its windows or tiles over the region (`region_s`,
    the graph planner's time with its first pass, engine.compute.graph_choice) and the reads
    and writes the read-ahead and write-behind do not hide (as _exposed_io). Blocks are
    `block` (clipped to the region), each read with `margin` voxels of context in all."""
    counts = [-(-int(r) // int(b)) for r, b in zip(region, block, strict=True)]
    n = prod(counts)
    out_block = [min(int(b), int(r)) for b, r in zip(block, region, strict=True)]
    read_bytes = (prod(b + m for b, m in zip(out_block, margin, strict=True)) * in_channels
                  * in_bytes)
    read_s = read_bytes / READ_BYTES_PER_S
    write_s = prod(out_block) * out_channels / WRITE_VALUES_PER_S.get(out_dtype, 39e6)
    per_block = [(region_s / n, read_s, write_s, 0, 0)] * n
    io_s = _exposed_io(per_block)
    write_bytes = prod(out_block) * out_channels * (1 if out_dtype == "uint8" else 4)
    return {"startup_s": STARTUP_S, "windows_s": region_s, "io_s": io_s,
            "io_total_s": n * (read_s + write_s), "blocks": n,
            "total_s": STARTUP_S + region_s + io_s,
            # one block's figures, for the cluster model (planner/cluster.py)
            "block_compute_s": region_s / n, "block_read_s": read_s, "block_write_s": write_s,
            "block_read_bytes": read_bytes, "block_write_bytes": write_bytes}


def _block_bytes(network: Network, read: int, write: int, in_bytes: int) -> int:
    """A block in flight: its input raw and as float32, its output and the encoded copy
    (engine.compute.layout.block_bytes)."""
    return (network.in_channels * read * (in_bytes + 4)
            + 2 * network.out_channels * write * 4)


def _fft_settings(plan: Plan) -> FftSettings:
    """The FFT settings of the CPU backend a run of `plan` builds (compute.execution_for)."""
    from znni.primitives.cpu.fft_workspaces import FftSettings

    if plan.spectra_cache_bytes:
        return FftSettings(spectra_budget=int(plan.spectra_cache_bytes))
    return FftSettings()


def _refresh_wisdom() -> None:
    from znni.primitives.cpu.fftw_plans import refresh_wisdom

    refresh_wisdom()


def cold_s_per_point() -> float:
    """FFTW's planning seconds per point of a new FFT layer's transforms on this machine:
    measured by its calibration (cpu_measure.planning_step) where the cache holds it, else
    COLD_S_PER_POINT."""
    how = effort()
    if how == "FFTW_MEASURE":
        from znni.planner.calibrate import cached_cpu_rate

        measured = cached_cpu_rate("fftw_measure_s_per_point", os.cpu_count() or 1)
        if measured is not None:
            return measured
    return COLD_S_PER_POINT.get(how, COLD_S_PER_POINT["FFTW_MEASURE"])


def _exposed_io(blocks: list[tuple[float, float, float, int, int]]) -> float:
    """The first block's read and the last one's write wait; in between, block i+1's read
    and block i-1's write overlap block i's compute (engine/sweep/local.run_local)."""
    if not blocks:
        return 0.0
    exposed = blocks[0][1] + blocks[-1][2]
    for i, (compute_s, _, _, _, _) in enumerate(blocks):
        nxt = blocks[i + 1][1] if i + 1 < len(blocks) else 0.0
        prev = blocks[i - 1][2] if i > 0 else 0.0
        exposed += max(0.0, max(nxt, prev) - compute_s)
    return exposed


def process_seconds() -> float | None:
    """Wall seconds since this process started (Linux /proc), None elsewhere."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime_s = float(f.read().split()[0])
        return uptime_s - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def predicted_line(plan: dict[str, Any] | None, voxels: int = 0,
                   measured_s: float | None = None) -> str | None:
    """The whole run predicted (planner/jobtime.py) against the whole process measured
    (`measured_s`, default the process's wall time so far), each with its rate over
    `voxels` output voxels; None for a plan without a job prediction."""
    job = (plan or {}).get("job_seconds")
    if not job:
        return None
    measured = process_seconds() if measured_s is None else measured_s
    predicted = max(job["total_s"], 1e-9)

    def timed(s: float) -> str:
        return f"{s:.1f} s" + (f" ({voxels / max(s, 1e-9):,.0f} output voxels/s)" if voxels else "")

    shown = "-" if measured is None else timed(measured)
    ratio = "" if measured is None else f", {measured / predicted:.2f}x"
    head = f"whole run: predicted {timed(predicted)}, measured {shown}{ratio}; "
    if "patches" not in job:  # a graph model's run (graph_job_seconds): windows, not patches
        settled = (f"; {job['settling_s']:.1f} s of it measured before the sweep (int8's "
                   "calibration, quantization and error)" if job.get("settling_s") else "")
        return head + f"{job['blocks']} block{'s' * (job['blocks'] != 1)}" + settled
    return (head + f"{job['blocks']} blocks, {job['patches']} patches, computed "
            f"{job['computed_voxels'] / max(job['ideal_voxels'], 1):.2f}x the ideal tiling's "
            "output voxels")
