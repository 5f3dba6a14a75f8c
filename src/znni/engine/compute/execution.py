"""From a job and its plan to the backends that run it: CPU, GPU, or the CPU-GPU pipeline.

The planner decides the algorithm (cpu, gpu, gpu-ram, cpu-gpu), the patch and
the per-layer primitives; this module turns that into backend names and
options a `BlockWorker` can build in any process. With ZNNI_GPU_STANDIN=1 the
GPU algorithms run on the numpy stand-in device, so every path runs in CI.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from znni.engine.geometry import Triple
from znni.model.network import Network
from znni.primitives.base import Backend

if TYPE_CHECKING:  # the planner is imported when a plan is made, not with the engine
    from znni.planner.machine import MachineProfile
    from znni.planner.plan import DeviceChoice, Plan

STANDIN_ENV = "ZNNI_GPU_STANDIN"  # "1": GPU work runs on the numpy stand-in device
BACKEND_ENV = "ZNNI_BACKEND"  # overrides the CPU backend's name (e.g. "reference")
# precisions only the CPU runs: NNCF's int8 network compiled by OpenVINO, and auto (the
# fastest of fp32, bf16 and int8 within --max-error, engine/compute/precision_error.py)
CPU_ONLY_PRECISIONS = ("int8", "auto")
STANDIN_MEMORY_BYTES = 2**30  # the stand-in device's memory cap when no plan sets one
PLAN_BUDGET_QUANTUM_BYTES = 64 * 2**20  # budgets are planned in whole 64 MiB steps
PLAN_CACHE_ENTRIES = 64  # plans are small frozen values; bounded by count
MACHINE_TTL_S = 30.0  # a server re-detects this machine at most this often

_PLANS: OrderedDict[tuple[Hashable, ...], Plan] = OrderedDict()
_PLAN_LOCK = threading.Lock()
_MACHINE_LOCK = threading.Lock()
_MACHINE: dict[tuple[Hashable, ...], tuple[float, MachineProfile]] = {}  # env key -> (at, profile)


@dataclass(frozen=True)
class Execution:
    """How patches run: `mode` cpu | gpu | cpu-gpu, backends by name, the split op."""

    mode: str
    cpu_backend: str
    cpu_options: dict[str, Any] = field(default_factory=dict)
    gpu_backend: str | None = None
    gpu_options: dict[str, Any] = field(default_factory=dict)
    split_op: int | None = None  # cpu-gpu: ops [0, split_op) on the CPU, the rest on the GPU


def standin_requested() -> bool:
    return os.environ.get(STANDIN_ENV, "") not in ("", "0")


def gpu_available() -> bool:
    """A CUDA device through CuPy, or the stand-in when ZNNI_GPU_STANDIN=1."""
    if standin_requested():
        return True
    from znni.primitives.gpu.cupy_device import cuda_available

    return cuda_available()


def check_device(device: str) -> None:
    """--device gpu / cpu-gpu without CuPy or a CUDA device: one sentence naming the fix."""
    if device in ("gpu", "cpu-gpu") and not gpu_available():
        from znni.primitives.gpu import require_cuda

        require_cuda()


def check_precision(device: str, precision: str) -> None:
    """One sentence where `precision` cannot run on `device`: a name not in
    primitives/precision.PRECISIONS (or "auto"); on the CPU anything but fp32, bf16, int8
    and auto (bf16 and int8 run in OpenVINO's compiled networks; a CPU without bf16 units
    computes bf16 in fp32, with a warning); int8 and auto anywhere but the CPU (--device
    auto runs them there: `cpu_precision_device`); on the GPU (gpu, or cpu-gpu and auto
    where a graph network runs there), a precision its compute capability lacks (tf32 and
    bf16 need 8.0, fp16 5.3). The stand-in takes the GPU's four."""
    from znni.primitives.precision import check_precision as check_name

    if precision in CPU_ONLY_PRECISIONS:
        if device in ("gpu", "cpu-gpu"):
            raise ValueError(f"--precision {precision} runs on the CPU (NNCF's int8 network "
                             f"compiled by OpenVINO), not --device {device}; the GPU takes "
                             "fp32, tf32, bf16 or fp16")
        return
    check_name(precision)
    if precision == "fp32":
        return
    on_gpu = device == "gpu" or (device != "cpu" and graph_runs_on_gpu(device))
    if not on_gpu:  # the CPU: bf16 in OpenVINO's compiled networks, nothing else
        if precision == "bf16":
            return
        raise ValueError(f"--precision {precision} needs --device gpu; the CPU runs fp32, "
                         "bf16, int8 or auto")
    if standin_requested():
        return
    check_device(device)
    from znni.primitives.gpu import MIN_CAPABILITY, compute_capability, supported_precisions

    if precision not in supported_precisions(0):
        need, have = MIN_CAPABILITY[precision], compute_capability(0)
        shown = "unknown" if have is None else f"{have[0]}.{have[1]}"
        raise ValueError(f"--precision {precision} needs a GPU of compute capability "
                         f"{need[0]}.{need[1]} or more; device 0 has {shown}")


def cpu_precision_device(device: str, precision: str) -> str:
    """The device a job runs on: int8 and auto run on the CPU, so --device auto is the CPU
    for them whatever GPU is visible; `device` otherwise."""
    return "cpu" if precision in CPU_ONLY_PRECISIONS and device == "auto" else device


def planning_machine() -> MachineProfile:
    """This machine as the planner sees it: cached calibration, never measured here.

    Detection (CUDA devices via an import of CuPy, the calibration file, free memory) is
    reused for MACHINE_TTL_S per environment, so a server validating a burst of
    submissions does not repeat it for each.
    """
    from znni.planner.detect import detect_machine
    from znni.planner.machine import GpuProfile

    env = tuple(os.environ.get(k) for k in (STANDIN_ENV, "XDG_CACHE_HOME", "OPENBLAS_CORETYPE"))
    now = time.monotonic()
    with _MACHINE_LOCK:
        hit = _MACHINE.get(env)
        if hit is not None and now - hit[0] < MACHINE_TTL_S:
            return hit[1]
        machine = detect_machine(calibrate=None)
        if standin_requested() and machine.gpu is None:
            standin = GpuProfile(name="numpy stand-in", memory_bytes=STANDIN_MEMORY_BYTES)
            machine = replace(machine, gpus=(standin,))
        _MACHINE[env] = (now, machine)
        return machine


def plan_job(network: Network, device: DeviceChoice, budget_bytes: int, region: Triple) -> Plan:
    """The planner's best plan for computing `region` within `budget_bytes` of host memory.

    Budgets are rounded down to PLAN_BUDGET_QUANTUM_BYTES so that a plan is a pure
    function of (network, device, budget, region, machine) and can be reused: a
    server validating many submissions of one network plans once.
    """
    from znni.planner.search import make_plan

    check_device(device)
    if budget_bytes > PLAN_BUDGET_QUANTUM_BYTES:
        budget_bytes -= budget_bytes % PLAN_BUDGET_QUANTUM_BYTES
    machine = planning_machine()
    # the machine without its free memory: the plan uses the explicit budget only
    key = (network.digest, device, budget_bytes, tuple(region), repr(machine.with_memory(1)))
    with _PLAN_LOCK:
        if key in _PLANS:
            _PLANS.move_to_end(key)
            return _PLANS[key]
    plan = make_plan(
        network, machine=machine, device=device, memory_limit_bytes=budget_bytes,
        max_output=region,
    )
    with _PLAN_LOCK:
        _PLANS[key] = plan
        while len(_PLANS) > PLAN_CACHE_ENTRIES:
            _PLANS.popitem(last=False)
    return plan


def execution_for(plan: Plan | None, device: str) -> Execution:
    """The backends a plan (or, without one, the device flag alone) asks for."""
    cpu_name = os.environ.get(BACKEND_ENV) or "cpu"
    cpu_options: dict[str, Any] = {}
    if plan is not None and cpu_name == "cpu":
        if plan.spectra_cache_bytes:
            cpu_options["spectra_cache_bytes"] = int(plan.spectra_cache_bytes)
        if plan.workspace_cache_bytes:
            cpu_options["workspace_bytes"] = int(plan.workspace_cache_bytes)
    algorithm = plan.algorithm if plan is not None else ("cpu" if device == "auto" else device)
    if algorithm == "cpu":
        return Execution("cpu", cpu_name, cpu_options)
    gpu_name = "gpu-standin" if standin_requested() else "gpu"
    gpu_options: dict[str, Any] = {}
    if plan is not None and plan.gpu_memory_limit_bytes:
        gpu_options["memory_cap_bytes"] = int(plan.gpu_memory_limit_bytes)
    elif gpu_name == "gpu-standin":
        gpu_options["memory_cap_bytes"] = STANDIN_MEMORY_BYTES
    if algorithm in ("gpu", "gpu-ram"):
        return Execution("gpu", cpu_name, cpu_options, gpu_name, gpu_options)
    split_op = plan.split_op if plan is not None else None
    return Execution("cpu-gpu", cpu_name, cpu_options, gpu_name, gpu_options, split_op)


def build_backends(execution: Execution) -> tuple[Backend, Backend | None]:
    """(CPU backend, GPU backend or None), built in the calling process."""
    from znni.primitives.backends import make_backend

    cpu = make_backend(execution.cpu_backend, **execution.cpu_options)
    if execution.gpu_backend is None:
        return cpu, None
    return cpu, make_backend(execution.gpu_backend, **execution.gpu_options)


def default_split_op(network: Network) -> int:
    """Without a plan: the CPU runs everything up to and including the first pooling layer."""
    from znni.primitives.base import Pool

    for i, op in enumerate(network.ops):
        if isinstance(op, Pool):
            return i + 1
    return 1


def graph_runs_on_gpu(device: str) -> bool:
    """Whether a graph (ONNX) network runs on the GPU: --device gpu, and cpu-gpu (the CPU
    reads, gathers windows and writes while the GPU runs every window: a U-Net's skip
    connections tie its layers together, so there is no cheap layer split), and auto
    where a device is visible (CuPy, or the stand-in with ZNNI_GPU_STANDIN=1)."""
    if device in ("gpu", "cpu-gpu"):
        return True
    return device == "auto" and gpu_available()


def graph_backend_name(device: str) -> str:
    """The backend a graph network's workers build for `device`."""
    if not graph_runs_on_gpu(device):
        return os.environ.get(BACKEND_ENV) or "cpu"
    return "gpu-standin" if standin_requested() else "gpu"


def graph_device_cap(device: str, memory_limit_bytes: int | None) -> int:
    """The device memory a graph network's GPU pass is planned within and its workers
    count against (planner.graph.gpu_search.device_cap_bytes: a share of the GPU's memory,
    within --memory-limit where given); 0 on the CPU."""
    if not graph_runs_on_gpu(device):
        return 0
    from znni.planner.graph.gpu_search import device_cap_bytes

    return device_cap_bytes(planning_machine(), memory_limit_bytes)


def graph_pass_device(device: str, precision: str,
                      memory_limit_bytes: int | None) -> dict[str, Any]:
    """Where a graph network's windows run, as the graph planner's choose/plan_window take
    it: the CPU at `precision` (fp32, or bf16 in compiled networks), or the GPU at
    `precision` within the device cap."""
    if not graph_runs_on_gpu(device):
        return {"precision": precision}
    cap = graph_device_cap(device, memory_limit_bytes)
    return {"device": "gpu", "precision": precision, "device_cap": cap}
