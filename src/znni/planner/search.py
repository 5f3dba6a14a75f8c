"""Exhaustive search for the plan with the most predicted output voxels per second.

`make_plan` is the planner's entry point. Following ZNNi: over MPF-valid
input sizes x batch S x split op (ZNNi's theta), each
layer takes the fastest primitive that fits the memory left, for each device
algorithm: CPU-only, GPU-only, GPU + host RAM (early layers streamed in
chunks), CPU-GPU (CPU runs ops[:p], the GPU ops[p:] on sub-batches of
fragments, pipelined with a queue of one patch).
"""

from __future__ import annotations

from dataclasses import replace
from math import prod

from znni.model.network import LayerShape, Network
from znni.planner.costs import FIRST_PASS_S_PER_PEAK_BYTE
from znni.planner.costs import transfer_seconds as xfer_s
from znni.planner.detect import detect_machine
from znni.planner.hostsim import PassReplay, replay_pass
from znni.planner.machine import MachineProfile
from znni.planner.memory import (
    layer_memory,
    weights_bytes,
    workspace_cache_bytes,
)
from znni.planner.plan import (
    DEVICE_ALGORITHMS,
    Algorithm,
    AlgorithmSummary,
    DeviceChoice,
    LayerPlan,
    Plan,
)
from znni.planner.stages import Stage, cpu_stage, gpu_stage, streamed_stage
from znni.triple import Triple, as_triple

HOST_FRACTION = 0.85  # of available RAM, when no explicit limit is given
GPU_FRACTION = 0.9  # of device memory (allocator slack, CUDA context)
BATCHES = (1, 2, 4)
MAX_OUTPUT = 1024  # largest dense output per axis considered
GIVE_UP_AFTER = 3  # consecutive sizes where nothing fits


def make_plan(
    network: Network,
    *,
    machine: MachineProfile | None = None,
    calibrate: bool | None = False,
    device: DeviceChoice = "auto",
    memory_limit_bytes: int | None = None,
    max_output: Triple | None = None,
) -> Plan:
    """The configuration with the highest predicted output voxels/s that fits in memory
    (over `max_output` tiled by its patches, where given: region_voxels_per_second).

    machine: None detects this machine, with the rates `calibrate` asks for (as
    `detect.detect_machine`: True measures them when none are cached, None takes cached
    ones if any, False the defaults); the caller says which, since measuring takes
    minutes. A given machine keeps its own rates: calibrate=True with one is an error.
    device: 'auto' | 'cpu' | 'gpu' | 'cpu-gpu'. memory_limit_bytes: host budget
    (default: the profile's available memory). max_output: the region to compute;
    no patch is planned larger than it (rounded up to the pool product).
    Raises ValueError when nothing fits.
    """
    if device not in DEVICE_ALGORITHMS:
        raise ValueError(f"device {device!r} is not one of {', '.join(DEVICE_ALGORITHMS)}")
    if memory_limit_bytes is not None and memory_limit_bytes <= 0:
        raise ValueError(f"memory limit must be positive, got {memory_limit_bytes}")
    if machine is None:
        machine = detect_machine(calibrate=calibrate)
    elif calibrate:
        raise ValueError(f"calibrate={calibrate!r} measures this machine's rates; the given "
                         f"machine profile {machine.name!r} keeps its own")
    return search(network, machine, DEVICE_ALGORITHMS[device],
                  memory_limit_bytes=memory_limit_bytes, max_output=max_output)


def search(
    network: Network,
    machine: MachineProfile,
    algorithms: tuple[Algorithm, ...],
    *,
    memory_limit_bytes: int | None,
    max_output: Triple | None = None,
) -> Plan:
    """The best plan over `algorithms` with every algorithm's summary as its alternatives;
    ValueError naming each algorithm's reason when none fits."""
    host = memory_limit_bytes or int(machine.memory_bytes * HOST_FRACTION)
    gpu = int(machine.gpu.memory_bytes * GPU_FRACTION) if machine.gpu else 0
    summaries: list[AlgorithmSummary] = []
    best: Plan | None = None
    for alg in algorithms:
        if alg != "cpu" and machine.gpu is None:
            summaries.append(AlgorithmSummary(alg, False, reason="no GPU in the machine profile"))
            continue
        plan = best_of_algorithm(network, machine, alg, host_bytes=host, gpu_bytes=gpu,
                                 max_output=max_output)
        if plan is None:
            summaries.append(AlgorithmSummary(alg, False, reason="nothing fits in memory"))
            continue
        summaries.append(summarise(plan))
        if best is None or (region_voxels_per_second(plan, max_output)
                            > region_voxels_per_second(best, max_output)):
            best = plan
    if best is None:
        reasons = "; ".join(f"{s.algorithm}: {s.reason}" for s in summaries)
        raise ValueError(
            f"no configuration of network {network.name!r} fits in {host:,} bytes of host "
            f"memory on machine {machine.name!r} ({reasons})"
        )
    return replace(best, alternatives=tuple(summaries))


def summarise(plan: Plan) -> AlgorithmSummary:
    """The row `znni plan` prints for the best plan of one algorithm."""
    return AlgorithmSummary(
        algorithm=plan.algorithm,
        feasible=True,
        input_size=plan.input_size,
        output_size=plan.output_size,
        batch=plan.batch,
        split_op=plan.split_op,
        predicted_voxels_per_second=plan.predicted_voxels_per_second,
        peak_bytes=plan.peak_bytes,
        gpu_peak_bytes=plan.gpu_peak_bytes,
    )


def candidate_sizes(
    network: Network, max_output: tuple[int, int, int] | None = None
) -> list[tuple[int, int, int]]:
    """Valid MPF input sizes, smallest first: output j*P per axis (near-cubic), each axis
    capped at `max_output` rounded up to the pool product."""
    pool = network.pool_product
    pmax = max(pool)
    cap = max_output or (MAX_OUTPUT,) * 3
    cap = as_triple(max(p, -(-min(c, MAX_OUTPUT) // p) * p) for c, p in zip(cap, pool, strict=True))
    sizes: list[tuple[int, int, int]] = []
    for j in range(1, MAX_OUTPUT // pmax + 1):
        out = as_triple(min(j * pmax, c) for c in cap)
        size = network.input_size_for(out)
        if network.is_valid_input_size(size) and size not in sizes:
            sizes.append(size)
        if all(o >= c for o, c in zip(out, cap, strict=True)):
            break
    return sizes


def best_of_algorithm(
    network: Network,
    machine: MachineProfile,
    alg: Algorithm,
    *,
    host_bytes: int,
    gpu_bytes: int,
    max_output: Triple | None = None,
) -> Plan | None:
    """The best plan of one algorithm over sizes x batches (x split points)."""
    best: Plan | None = None
    misses = 0
    for size in candidate_sizes(network, max_output):
        found = False
        for batch in BATCHES:
            if batch > _patches_needed(network, size, max_output):
                break  # a batch larger than the region's patch count only wastes work
            shapes = network.layer_shapes(size, batch)
            for plan in evaluate(network, machine, alg, shapes, host_bytes=host_bytes,
                                 gpu_bytes=gpu_bytes):
                found = True
                if best is None or better(plan, best, max_output):
                    best = plan
        misses = 0 if found else misses + 1
        if misses >= GIVE_UP_AFTER:
            break
    return best


def _patches_needed(
    network: Network, size: tuple[int, int, int], max_output: tuple[int, int, int] | None
) -> int:
    """Patches of input `size` that cover `max_output` (unbounded without a region)."""
    if max_output is None:
        return max(BATCHES)
    out = network.output_size(size)
    return prod(-(-r // o) for r, o in zip(max_output, out, strict=True))


def region_voxels_per_second(plan: Plan, region: Triple | None) -> float:
    """Output voxels/s over `region` covered by whole patches, in whole batches (the
    engine's tiling: engine.geometry.patch_tiling), plus the first pass's pages: a patch
    just smaller than the region needs two per axis, a batch larger than the patches left
    still takes a whole batch's time, and one pass over the whole region pays for all of
    its memory at once. Without a region, the plan's own rate (the volume is unbounded)."""
    if region is None:
        return plan.predicted_voxels_per_second
    patches = prod(-(-r // o) for r, o in zip(region, plan.output_size, strict=True))
    batches = -(-patches // plan.batch)
    seconds = batches * plan.predicted_patch_s + FIRST_PASS_S_PER_PEAK_BYTE * plan.peak_bytes
    return prod(region) / seconds


def better(plan: Plan, best: Plan, region: Triple | None = None) -> bool:
    """Faster over the region by more than 1%; within 1%, the smaller batch: a prediction
    that close is a tie (the time model is not that exact), and the smaller batch needs
    less memory."""
    a, b = region_voxels_per_second(plan, region), region_voxels_per_second(best, region)
    if plan.batch != best.batch and abs(a - b) <= 0.01 * b:
        return plan.batch < best.batch
    return a > b


def split_points(shapes: list[LayerShape]) -> list[int]:
    """p such that ops[:p] and ops[p:] are both non-empty and p does not separate a conv
    from the activation fused into it."""
    return [
        p
        for p in range(1, len(shapes))
        if not (shapes[p - 1].kind == "conv" and shapes[p].kind not in ("conv", "maxpool"))
    ]


def evaluate(
    network: Network,
    machine: MachineProfile,
    alg: Algorithm,
    shapes: list[LayerShape],
    *,
    host_bytes: int,
    gpu_bytes: int,
) -> list[Plan]:
    """Every feasible plan of `alg` for one size and batch (one per split point)."""
    fixed = machine.base_rss_bytes + weights_bytes(shapes)
    out_voxels = shapes[-1].batch_out * _voxels(shapes[-1])
    final = shapes[-1].out_bytes
    plans: list[Plan] = []
    if alg == "cpu":
        budget = host_bytes - fixed - 2 * final
        stage = cpu_stage(shapes, machine, budget)
        if stage is not None:
            replay = replay_pass(shapes, list(stage.primitives), threads=machine.cores,
                                 base_bytes=fixed, workspace_bytes=workspace_cache_bytes(budget))
            stage, peak = with_fresh_pages(stage, replay, machine), replay.peak_bytes
            if peak <= host_bytes:
                plans.append(build(network, machine, alg, shapes, split_op=None,
                                   stages=[stage], patch_s=stage.seconds, peak=peak,
                                   gpu_peak=0, out_voxels=out_voxels, host_bytes=host_bytes,
                                   gpu_bytes=gpu_bytes))
        return plans
    gpu = machine.gpu
    assert gpu is not None  # checked by search()
    if alg == "gpu":
        stage = gpu_stage(shapes, machine, gpu_bytes)
        if stage is not None:
            t = stage.seconds + xfer_s(shapes[0].in_bytes + final, gpu)
            peak = fixed + shapes[0].in_bytes + 2 * final
            if peak <= host_bytes:
                plans.append(build(network, machine, alg, shapes, split_op=None,
                                   stages=[stage], patch_s=t, peak=peak,
                                   gpu_peak=stage.device_peak_bytes, out_voxels=out_voxels,
                                   host_bytes=host_bytes, gpu_bytes=gpu_bytes))
        return plans
    for p in split_points(shapes):
        plan = evaluate_split(network, machine, alg, shapes, p=p, host_bytes=host_bytes,
                              gpu_bytes=gpu_bytes, fixed=fixed)
        if plan is not None:
            plans.append(plan)
    return plans


def evaluate_split(
    network: Network,
    machine: MachineProfile,
    alg: Algorithm,
    shapes: list[LayerShape],
    *,
    p: int,
    host_bytes: int,
    gpu_bytes: int,
    fixed: int,
) -> Plan | None:
    """gpu-ram or cpu-gpu with ops[:p] streamed / on the CPU and ops[p:] on the GPU."""
    gpu = machine.gpu
    assert gpu is not None
    head, tail = shapes[:p], shapes[p:]
    final = shapes[-1].out_bytes
    handoff = head[-1].out_bytes
    back = gpu_stage(tail, machine, gpu_bytes)
    if back is None:
        return None
    back_s = back.seconds + xfer_s(handoff + final, gpu)
    if alg == "cpu-gpu":
        # the queue of one holds a second copy of the hand-off tensor; output recombined on host
        extra = handoff + 2 * final
        budget = host_bytes - fixed - extra
        front = cpu_stage(head, machine, budget)
        if front is None:
            return None
        replay = replay_pass(head, list(front.primitives), threads=machine.cores,
                             base_bytes=fixed, workspace_bytes=workspace_cache_bytes(budget))
        front = with_fresh_pages(front, replay, machine)
        peak = replay.peak_bytes + extra
        patch_s = max(front.seconds, back_s)  # pipelined: the slower stage sets the pace
    else:
        front = streamed_stage(head, machine, gpu_bytes)
        if front is None:
            return None
        peak = fixed + shapes[0].in_bytes + max(s.in_bytes + s.out_bytes for s in head) + 2 * final
        patch_s = front.seconds + back_s
    if peak > host_bytes:
        return None
    out_voxels = shapes[-1].batch_out * _voxels(shapes[-1])
    gpu_peak = max(st.device_peak_bytes for st in (front, back) if st.device == "gpu")
    return build(network, machine, alg, shapes, split_op=p, stages=[front, back],
                 patch_s=patch_s, peak=peak, gpu_peak=gpu_peak, out_voxels=out_voxels,
                 host_bytes=host_bytes, gpu_bytes=gpu_bytes)


def with_fresh_pages(stage: Stage, replay: PassReplay, machine: MachineProfile) -> Stage:
    """`stage` (on the CPU) with each layer's fresh mappings (`replay`) faulted in at the
    machine's fresh_page_bytes_per_s, every pass: glibc unmaps them on free."""
    rate = machine.rate("fresh_page_bytes_per_s")
    return replace(stage, layer_seconds=tuple(
        t + f / rate for t, f in zip(stage.layer_seconds, replay.layer_fresh_bytes, strict=True)))


def _voxels(shape: LayerShape) -> int:
    z, y, x = shape.size_out
    return z * y * x


def build(
    network: Network,
    machine: MachineProfile,
    alg: Algorithm,
    shapes: list[LayerShape],
    *,
    split_op: int | None,
    stages: list[Stage],
    patch_s: float,
    peak: int,
    gpu_peak: int,
    out_voxels: int,
    host_bytes: int,
    gpu_bytes: int,
) -> Plan:
    """The `Plan` of one evaluated configuration: `stages` run `shapes` (split at
    `split_op`) in `patch_s` seconds per patch within `peak` host and `gpu_peak` device
    bytes, under the `host_bytes` and `gpu_bytes` limits it was searched with."""
    prims = tuple(p for st in stages for p in st.primitives)
    layers = tuple(
        LayerPlan(sh.index, sh.kind, st.device, prim, t, b)
        for st in stages
        for sh, prim, t, b in zip(st.shapes, st.primitives, st.layer_seconds, st.layer_bytes,
                                  strict=True)
    )
    kept = sum(layer_memory(sh, p).kept_bytes for sh, p in zip(shapes, prims, strict=True))
    size_in = shapes[0].size_in
    return Plan(
        network=network.name,
        machine=machine.name,
        algorithm=alg,
        input_size=size_in,
        output_size=network.output_size(size_in),
        batch=shapes[0].batch_in,
        split_op=split_op,
        primitives=tuple(None if sh.kind != "conv" else p for sh, p in zip(shapes, prims,
                                                                          strict=True)),
        layers=layers,
        peak_bytes=int(peak),
        predicted_patch_s=patch_s,
        predicted_voxels_per_second=out_voxels / patch_s,
        gpu_peak_bytes=int(gpu_peak),
        gpu_sub_batches=max((st.sub_batches for st in stages if st.device == "gpu"), default=1),
        spectra_cache_bytes=int(kept),
        workspace_cache_bytes=workspace_cache_bytes(host_bytes - machine.base_rss_bytes
                                                    - weights_bytes(shapes)
                                                    - 2 * shapes[-1].out_bytes)
        if alg in ("cpu", "cpu-gpu") else 0,
        memory_limit_bytes=int(host_bytes),
        gpu_memory_limit_bytes=int(gpu_bytes),
    )

