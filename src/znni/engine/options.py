"""A job's options checked before anything is opened: each bad value is one sentence
(the CLI prints it and exits 2; the API answers 422 with it)."""

from __future__ import annotations

import math

from znni.engine.compute.execution import check_device, check_precision
from znni.engine.compute.tta import FlipSpec
from znni.engine.io.faults import check_bad_chunk_policy
from znni.engine.job import SegmentJob
from znni.engine.workers.windowed import check_window_options
from znni.model.onnx_model import OnnxModel


def check_options(job: SegmentJob) -> None:
    """ValueError naming the first option of `job` that cannot run."""
    if job.border not in ("reflect", "zero"):
        raise ValueError(f"border mode {job.border!r} is not one of reflect, zero")
    if job.dtype not in ("float32", "uint8"):
        raise ValueError(f"output dtype {job.dtype!r} is not one of float32, uint8")
    if isinstance(job.network, OnnxModel):
        if job.network.mode == "windowed":
            check_window_options(job.overlap, job.blend)
    elif job.window is not None:
        raise ValueError(
            f"network {job.network.name!r} runs in exact (MPF) mode, where --window does not "
            "apply; windows are for ONNX models"
        )

    check_bad_chunk_policy(job.on_bad_chunk, job.scheduler)
    FlipSpec.parse(job.tta)  # --tta: one sentence naming a bad value
    check_device(job.device)
    check_precision(job.device, job.precision)
    if job.precision != "fp32" and not isinstance(job.network, OnnxModel):
        raise ValueError(
            f"precision {job.precision} applies to ONNX graph models in this version; "
            f"network {job.network.name!r} runs in exact (MPF) mode in fp32"
        )
    check_max_error(job.max_error)
    for what, value in (("chunks", job.chunks), ("block", job.block), ("window", job.window)):
        if value is not None and (len(value) != 3 or min(value) < 1):
            raise ValueError(f"{what} {value!r} must be 3 positive integers z,y,x")


def check_max_error(value: object) -> None:
    """--max-error (the API's max_error): a finite number >= 0, else one sentence."""
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not math.isfinite(value) or value < 0:
        raise ValueError(f"--max-error {value!r} must be a number >= 0 (a fraction of the "
                         "fp32 output's range, e.g. 0.02)")
