"""`segment(job)`: run a network densely over a Zarr volume, block by block, resumably.

`check_and_plan` does every check `segment` does before writing anything (and
plans the run, as `segment` would), so a bad job fails with one ValueError and
leaves the disk untouched (an object-store OUT is proven writable by a probe object
that is put and deleted at once).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from znni.engine.cluster import carried_ir, for_workers, sized_for_cluster
from znni.engine.compute.compiled_forward import prefetch_compile
from znni.engine.compute.execution import (
    CPU_ONLY_PRECISIONS,
    execution_for,
    graph_backend_name,
    graph_device_cap,
    graph_pass_device,
)
from znni.engine.compute.graph_choice import GraphChoice, choose, plan_window
from znni.engine.compute.graph_plan import default_block_shape, run_summary, with_settling_time
from znni.engine.compute.layout import (
    PLAN_FRACTION,
    input_cache_bytes,
    memory_budget_bytes,
    plan_with_layout,
    with_job_time,
    with_layout,
)
from znni.engine.compute.statistics import prepare_package
from znni.engine.compute.tta import FlipSpec, flip_count, tta_parts
from znni.engine.compute.windows import WindowGrid
from znni.engine.geometry import Block, Box, Halo, Triple, split_blocks
from znni.engine.io.faults import raise_setup_fault
from znni.engine.io.formats import InputVolume
from znni.engine.io.ledger import (
    BlockLedger,
    fingerprint,
    fingerprint_parts,
    mismatch_sentence,
    read_ledger,
)
from znni.engine.io.lock import OutputLock, hold_output
from znni.engine.io.stores import check_output_location
from znni.engine.io.volume import check_existing_output, open_input, output_chunks
from znni.engine.job import ProgressEvent, SegmentJob, SegmentReport
from znni.engine.options import check_options
from znni.engine.output.form import OutputForm, output_form
from znni.engine.output.provenance import note_bad_chunks
from znni.engine.output.target import OutputTarget, open_target, output_plan
from znni.engine.precision_run import Settled, settle_for_job
from znni.engine.sweep.local import ReadAhead
from znni.engine.sweep.progress import StageTimer
from znni.engine.sweep.run import start_ledger, sweep
from znni.engine.units import resolve_roi
from znni.engine.workers.base import VolumeWorker
from znni.engine.workers.exact_graph import ExactGraphSpec
from znni.engine.workers.finish import FinishSpec, FinishWorker, KindSpec, finish_spec
from znni.engine.workers.mpf import BlockSpec
from znni.engine.workers.windowed import WINDOW_CACHE_BYTES, WindowedSpec
from znni.model.network import Network
from znni.model.onnx_model import OnnxModel
from znni.primitives.base import Backend
from znni.triple import as_triple

if TYPE_CHECKING:
    from znni.planner.plan import Plan



@dataclass(frozen=True, kw_only=True)
class PreparedRun:
    """A checked job with its plan and geometry decided; nothing written yet."""

    job: SegmentJob
    volume: InputVolume
    region: Box
    out_shape: tuple[int, int, int, int]
    chunks: Triple
    parts: dict[str, Any]
    resume: bool  # the output's ledger belongs to this job: skip its finished blocks
    done: frozenset[str]
    patch: Triple
    block_shape: Triple
    primitives: tuple[str | None, ...] | None
    plan: Plan | None  # the planner's plan this run follows (None: windowed)
    window: Triple | None = None  # graph models: the window W (windowed) or tile (exact)
    choice: GraphChoice | None = None  # graph models: the planned window and its plan
    form: OutputForm | None = None  # stored channels and dtype, labels, mask, --skip-empty
    settled: Settled | None = None  # int8 and auto: what runs, measured (precision_run.py)


def check_and_plan(job: SegmentJob, plan: Plan | None = None) -> Plan | None:
    """The plan `segment(job, plan=plan)` follows (given none: the planner's best for the
    job's region; None for a windowed model); raises ValueError for anything that would
    make it fail. Writes nothing."""
    return prepare_run(job, plan).plan


def prepare_run(job: SegmentJob, plan: Plan | None = None) -> PreparedRun:
    """Open and check the input, the output and its ledger, plan, choose blocks (each store
    answer asked once: the job's context remembers them, `io/memo.py`)."""
    with job.store.remembering() as ctx:  # batch workers sized first (engine/cluster.py)
        job = sized_for_cluster(job)
        cpu = job.precision in CPU_ONLY_PRECISIONS and job.device == "auto"  # int8, auto
        return _prepare_run(replace(job, store=ctx, device="cpu" if cpu else job.device), plan)


def _prepare_run(job: SegmentJob, plan: Plan | None) -> PreparedRun:
    check_options(job)  # engine/options.py
    net = job.network
    ctx = job.store
    volume = open_input(job.input_path, net.in_channels, ctx=ctx)
    lo_hi = resolve_roi(job.roi, volume.shape)
    region = Box(as_triple(a for a, _ in lo_hi), as_triple(b for _, b in lo_hi))
    if job.output_path.resolved() == job.input_path.resolved():
        raise ValueError(f"output {job.output_path} is the input array; choose another path")
    check_output_location(job.output_path, ctx=ctx)
    form = output_form(job, volume.shape)  # labels, mask, --skip-empty (output/form.py)
    out_shape = (form.channels, *volume.shape)
    existing = check_existing_output(job.output_path, out_shape, form.dtype, job.labels, ctx=ctx)
    output_plan(job, volume, out_shape)  # format and pyramid levels, checked
    chunks = output_chunks(job.chunks, existing, volume.shape, form.channels, form.dtype,
                           str(job.output_path))
    parts = fingerprint_parts(
        net.digest, job.input_path, tuple(int(s) for s in volume.array.shape),
        str(volume.dtype), region.key(), job.border, job.dtype, **form.parts(),
    ) | tta_parts(job.tta)  # test-time flips change the output: a resume must agree on them
    header, done = read_ledger(job.output_path, ctx=ctx) if existing else (None, set())
    job, parts = prepare_package(job, volume, region, header, parts)  # bioimage.io
    net = job.network
    budget = memory_budget_bytes(job.memory_limit_bytes)
    window, choice, settled = None, None, None
    if isinstance(net, OnnxModel):  # int8, auto: quantized and measured before any write
        choice, settled = _graph_choice(job, net, header, budget, region, volume, form)
        window = choice.window
        parts = _graph_parts(parts, choice, job, net.mode)
    resume = header is not None and header.get("fingerprint") == fingerprint(parts)
    if header is not None and not resume and not job.overwrite:
        raise ValueError(mismatch_sentence(job.output_path, header, parts))
    resume = resume and not job.overwrite
    checked: dict[str, Any] = {
        "job": job, "volume": volume, "region": region, "out_shape": out_shape, "chunks": chunks,
        "parts": parts, "resume": resume, "done": frozenset(done) if resume else frozenset(),
        "form": form}
    recorded = _ledger_block(header) if resume else None  # a resumed run keeps its blocks
    if window is not None and isinstance(net, OnnxModel):
        block = recorded or job.block or default_block_shape(net, window, chunks, region)
        return PreparedRun(**checked, patch=window, block_shape=block, primitives=None,
                           plan=None, window=window, choice=choice, settled=settled)
    net = _sequential(net)  # a graph model always has its window by now
    step = recorded or job.block  # --block: its plain grid; remainders merged otherwise
    if plan is None:  # patch, batch and blocks together (compute/layout.py)
        plan = plan_with_layout(net, job.device, chunks, region, budget,
                                volume.dtype.itemsize, form.dtype, step, job.block is None,
                                flips=flip_count(job.tta), skip=form.outside,
                                out_channels=form.channels)  # labels: as stored
    patch, primitives = _patch_from_plan(net, plan)
    plan = with_job_time(with_layout(plan, net, chunks, region, budget, volume.dtype.itemsize,
                                     step, merge=job.block is None),
                         net, volume.dtype.itemsize, form.dtype, budget_bytes=budget,
                         skip=form.outside,  # blocks outside the mask are not computed
                         out_channels=form.channels)
    assert plan.block_shape is not None  # the engine cuts plan.block_edges
    return PreparedRun(**checked, patch=patch, block_shape=plan.block_shape,
                       primitives=primitives, plan=plan)


def _prepare_ahead(job: SegmentJob, plan: Plan | None) -> PreparedRun:
    """prepare_run, with the compile a given window most likely runs started first, so
    the volume's opening and the plan hide it, and kept only where the plan chose it
    (compute/compiled_forward.prefetch_compile)."""
    early = prefetch_compile(job) if plan is None else None
    prep = None
    try:
        prep = prepare_run(job, plan)
        return prep
    finally:
        if early is not None:
            early.settle(prep.choice.plan if prep is not None and prep.choice else None)


def _ledger_block(header: dict[str, Any] | None) -> Triple | None:
    """The block shape an output's ledger recorded (None without one)."""
    if header is None or "block_shape" not in header:
        return None
    return as_triple(header["block_shape"], "the ledger's block_shape")


def _graph_choice(job: SegmentJob, model: OnnxModel, header: dict[str, Any] | None,
                  budget: int, region: Box, volume: InputVolume, form: OutputForm
                  ) -> tuple[GraphChoice, Settled | None]:
    """The window and its plan at the job's precision; int8 and auto settled on the job's
    own windows first (engine/precision_run.py: ValueError above --max-error)."""
    if job.precision not in CPU_ONLY_PRECISIONS:
        return _window_for(job, model, header, budget, region, job.precision), None
    return settle_for_job(
        job.precision, model, lambda p: _window_for(job, model, header, budget, region, p),
        volume.read, region, mask=form.mask, where=str(job.input_path),
        max_error=job.max_error, labels=form.labels)


def _window_for(
    job: SegmentJob, model: OnnxModel, header: dict[str, Any] | None, budget: int, region: Box,
    precision: str,
) -> GraphChoice:
    """--window, else the window the output's ledger recorded for this model (windowed), else
    the planner's best within the budget at `precision`; planned and checked before anything
    is written."""
    recorded = (header or {}).get("parts", {})
    pass_budget = int(budget * PLAN_FRACTION)
    if job.window is not None:
        window: Triple = job.window
    elif model.mode == "windowed" and recorded.get("mode") == "windowed" \
            and recorded.get("network") == model.digest:
        window = as_triple(recorded["window"], "the ledger's window")
    else:
        where = graph_pass_device(job.device, precision, job.memory_limit_bytes)
        return choose(model, pass_budget, region.shape, job.overlap, **where,
                      flips=flip_count(job.tta))
    return plan_window(model, window, pass_budget, region.shape, job.overlap,
                       **graph_pass_device(job.device, precision, job.memory_limit_bytes),
                       flips=flip_count(job.tta))


def _graph_parts(parts: dict[str, Any], choice: GraphChoice, job: SegmentJob,
                 mode: str) -> dict[str, Any]:
    """A graph run's fingerprint parts: its mode (windowed: window, overlap, blend) and an
    int8 run's precision (its output differs from fp32's: no mixed resume)."""
    kind = {"mode": "windowed", "window": list(choice.window), "overlap": job.overlap,
            "blend": job.blend} if mode == "windowed" else {"mode": "exact"}
    return {**parts, **kind, **({"precision": "int8"} if choice.precision == "int8" else {})}


def _sequential(net: Network | OnnxModel) -> Network:
    if not isinstance(net, Network):
        raise TypeError(f"network {type(net).__name__} is neither a sequential Network nor "
                        "an ONNX model with a window")
    return net


def _patch_from_plan(net: Network, plan: Plan) -> tuple[Triple, tuple[str | None, ...] | None]:
    """The plan's patch output and per-op primitives, checked against the network."""
    out = as_triple(plan.output_size, "the plan's output size")
    if any(o % p for o, p in zip(out, net.pool_product, strict=True)):
        raise ValueError(
            f"plan output size {out} is not a multiple of the pool product {net.pool_product}"
        )
    primitives = tuple(plan.primitives) if plan.primitives is not None else None
    if primitives is not None and len(primitives) != len(net.ops):
        raise ValueError(f"plan has {len(primitives)} primitives for {len(net.ops)} network ops")
    return out, primitives


def segment(
    job: SegmentJob,
    *,
    quiet: bool = True,
    progress: Callable[[ProgressEvent], None] | None = None,
    cancel: threading.Event | None = None,
    backend: Backend | None = None,
    plan: Plan | None = None,
    on_plan: Callable[[dict[str, Any]], None] | None = None,
) -> SegmentReport:
    """Compute and write every unfinished block (module docstring); `on_plan` gets the plan.
    The block sweep itself is `engine/sweep/run.sweep`, with the job's worker spec as its
    stage."""
    timer = StageTimer()
    with job.store.remembering() as ctx:  # the setup asks each store question once
        prep = _prepare_ahead(replace(job, store=ctx), plan)
        assert prep.form is not None  # prepare_run decides it
        plan = prep.plan
        plan_dict = plan.to_dict() if plan is not None else run_summary(
            prep.job, prep.choice, prep.volume.shape, prep.block_shape, prep.region.shape,
            prep.volume.dtype.itemsize, (prep.form.channels, prep.form.dtype))
        if prep.settled is not None:  # int8 and auto: the measured errors, the choice
            plan_dict.update(prep.settled.records)
            plan_dict = with_settling_time(plan_dict, prep.settled.seconds)
        run = _set_up(prep.job, prep, plan_dict, backend, timer)
    (on_plan or _ignore)(dict(plan_dict))  # the server stores a graph run's summary
    worker = run.worker
    result = sweep(
        run.stage, run.blocks, ledger=run.ledger, done=prep.done, lock=run.lock,
        landing=run.target,  # OME pyramid: a block is recorded after its levels
        scheduler=prep.job.scheduler, worker=worker, reads=run.reads,
        bad_chunks=None if worker is None else worker.volume.bad_chunks.take_new,
        cancel=cancel, progress=progress, quiet=quiet, timer=timer)
    if worker is not None:
        plan_dict.update(getattr(worker, "device_report", dict)())
    filled = note_bad_chunks(run.ledger, run.target, prep.volume, job)  # this job's runs' list
    voxels, elapsed = result.voxels_this_run, result.elapsed_s
    return SegmentReport(job.output_path, result.blocks_total, result.blocks_computed, voxels,
                         elapsed, voxels / max(elapsed, 1e-9), result.stage_seconds, plan_dict,
                         tuple(filled), result.blocks_skipped)


def _ignore(_: Any) -> None:
    """No `on_plan` given."""


@dataclass(frozen=True)
class _SetUp:
    """A run ready to sweep: the output and its ledger and lock, the blocks, the stage, and
    for a local run its worker and reader (None on Dask)."""

    target: OutputTarget
    ledger: BlockLedger
    lock: OutputLock
    blocks: list[Block]
    stage: KindSpec | FinishSpec
    worker: VolumeWorker | FinishWorker | None
    reads: ReadAhead | None


def _set_up(
    job: SegmentJob, prep: PreparedRun, plan_dict: dict[str, Any], backend: Backend | None,
    timer: StageTimer,
) -> _SetUp:
    """The output, its ledger and lock, the blocks and their stage (`workers/`: the job's
    spec), with the local worker and its reader. A local run starts reading its first
    unfinished block before it creates the output and starts the ledger, a dozen requests in
    a row on an object store."""
    lock = hold_output(job.output_path, job.wait_for_output, ctx=job.store)  # before its ledger
    worker, reads = None, None
    if job.scheduler is None:
        blocks, spec = _blocks_and_spec(job, prep)
        stage = finish_spec(spec, prep.form, job.store)  # labels, mask: workers/finish.py
        worker = stage.build(backend=backend)
        worker.volume.bad_chunks.policy = job.on_bad_chunk
        reads = ReadAhead(worker, timer)
        first = next((b for b in blocks if b.key not in prep.done), None)
        if first is not None:
            reads.start(first)
    try:
        target = open_target(job, prep.volume, prep.out_shape, prep.chunks, prep.region,
                             plan_dict)
        ledger = start_ledger(job.output_path, ctx=job.store, parts=prep.parts,
                              block_shape=prep.block_shape, resume=prep.resume)
    except BaseException as e:  # a full disk, a refusal: named (engine/io/faults.py)
        if reads is not None:
            reads.close()
        lock.release()
        raise_setup_fault(e, job.output_path)
        raise
    if worker is not None:
        worker.output = target.level0
    else:  # Dask: what a worker on another host needs travels as values (engine/cluster.py)
        sent, form = for_workers(target.worker_job(job), prep.form)
        blocks, spec = _blocks_and_spec(sent, prep)
        stage = finish_spec(spec, form, job.store)  # labels, mask: workers/finish.py
    return _SetUp(target, ledger, lock, blocks, stage, worker, reads)


def _blocks_and_spec(job: SegmentJob, prep: PreparedRun) -> tuple[list[Block], KindSpec]:
    """The job's blocks and the picklable description a worker computes them from (its
    caller wraps labels, the mask and --skip-empty around it: `workers/finish.py`)."""
    net = job.network
    budget = memory_budget_bytes(job.memory_limit_bytes)
    cached = input_cache_bytes(budget)  # input chunks kept between blocks
    if isinstance(net, OnnxModel):
        assert prep.window is not None and prep.choice is not None
        none = (0, 0, 0)
        blocks = split_blocks(prep.region, prep.block_shape, prep.chunks, Halo(none, none),
                              (1, 1, 1))
        plan = prep.choice.plan
        compiled_path = prep.settled.compiled_path or "" if prep.settled else ""
        planned: dict[str, Any] = {
            "backend_name": graph_backend_name(job.device),
            "primitives": tuple(sorted(plan.primitives.items())),
            "spectra_bytes": plan.spectra_bytes, "input_cache_bytes": cached,
            "store": job.store, "precision": plan.precision, "compiled": plan.compiled,
            "compiled_path": compiled_path, "compiled_files": carried_ir(net, compiled_path),
            "device_bytes": graph_device_cap(job.device, job.memory_limit_bytes),
            "flips": FlipSpec.parse(job.tta)}
        if net.mode == "exact":
            return blocks, ExactGraphSpec(net, job.input_path, job.output_path, job.border,
                                          job.dtype, prep.window, **planned,
                                          batch=plan.batch)
        grid = WindowGrid.for_volume(prep.volume.shape, prep.window, job.overlap)
        # straddling windows kept: an eighth of the budget (the pass plans within 3/4)
        kept = max(WINDOW_CACHE_BYTES, budget // 8)
        return blocks, WindowedSpec(net, job.input_path, job.output_path, job.dtype, grid,
                                    job.blend, **planned, window_cache_bytes=kept,
                                    batch=plan.batch)
    assert prep.plan is not None
    blocks = split_blocks(prep.region, prep.block_shape, prep.chunks, Halo.for_fov(net.fov),
                          net.pool_product, prep.plan.block_edges)  # the plan's layout
    spec = BlockSpec(
        net, job.input_path, job.output_path, job.border, job.dtype, prep.patch,
        prep.primitives, execution_for(prep.plan, job.device), max(1, int(prep.plan.batch)),
        cached, store=job.store, flips=FlipSpec.parse(job.tta),
    )
    return blocks, spec
