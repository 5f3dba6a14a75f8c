"""This machine's profile: cores, available RAM, CUDA devices and calibrated rates.

Kept apart from `machine.py` because it needs calibration (which needs the cost
model, which needs `MachineProfile`): `machine` stays the plain value below both.
"""

from __future__ import annotations

import importlib.util
import os

from znni.planner.calibrate import calibrated_profile
from znni.planner.machine import GpuProfile, MachineProfile, available_memory_bytes


def detect_machine(*, calibrate: bool | None = True, parts: tuple[str, ...] = ("cpu",),
                   first_plan: bool = False) -> MachineProfile:
    """This machine, with (cached) calibrated rates.

    calibrate: True measures the rates `parts` names (calibrate.PARTS) when none are
    cached; None uses cached rates if any, else the defaults (never measures); False
    always uses the defaults. first_plan: where the CPU is not yet calibrated, measure only
    a first plan's part of it (calibrate.FIRST_PLAN_SHAPES; steady rates, no run's).
    """
    from znni.primitives.gpu import device_info  # CuPy, only when asked

    devices = device_info()
    # cuDNN's frontend installed (calibration asks the device itself: gpu_calibrate)
    has_cudnn = bool(devices) and importlib.util.find_spec("cudnn") is not None
    gpus = tuple(
        GpuProfile(name=g["name"], memory_bytes=int(g["free_bytes"]), has_cudnn=has_cudnn)
        for g in devices
    )
    profile = MachineProfile(
        name=f"detected-{os.uname().nodename}",
        cores=os.cpu_count() or 1,
        memory_bytes=available_memory_bytes(),
        gpus=gpus,
    )
    if calibrate is not False:
        profile = calibrated_profile(profile, measure=bool(calibrate), parts=parts,
                                     first_plan=first_plan)
    return profile


def calibrate_gpus() -> None:
    """Measure this machine's GPU primitives once (a few seconds; cached by GPU name, see
    graph/gpu_calibrate.cached_gpu_rates), as `znni plan` does before planning a graph
    network on this machine's GPU; nothing without a CUDA device."""
    from znni.planner.graph.gpu_calibrate import cached_gpu_rates

    cached_gpu_rates(detect_machine(calibrate=False).gpus, measure=True)


def calibrate_graph_primitives(precision: str = "fp32") -> None:
    """Measure this machine's graph primitives (OpenVINO's conv where installed; its int8
    conv's speed-up where `precision` is int8 or auto) once, as `znni plan MODEL.onnx` does
    before planning a graph model on this machine's CPU, where its CPU primitives are
    calibrated (a graph plan never starts the whole calibration: it takes the default
    rates until a sequential plan has measured them; a first plan's partial calibration
    does not count, since these primitives are fitted on the whole one's rates)."""
    from znni.planner.calibrate import measured_parts

    machine = detect_machine(calibrate=None)
    if machine.calibrated and not machine.partial_calibration:
        int8 = ("int8",) if precision in ("int8", "auto") else ()
        measured_parts(machine, ("graph", "openvino", *int8))
