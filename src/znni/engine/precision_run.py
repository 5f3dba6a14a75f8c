"""The precision a graph run computes at, settled before anything is written (issue 53):
`--precision int8` quantized on the job's own windows with its error measured (refused
above --max-error), and `--precision auto`, the fastest predicted precision whose measured
error is within --max-error. `segment.prepare_run` and `znni plan --input` call it; the
input and the mask are opened by them and read here through values.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from znni.engine.compute.int8_calibration import (
    CalibrationSet,
    Reader,
    calibration_window,
    sample_windows,
)
from znni.engine.compute.precision_error import (
    AUTO_ORDER,
    Measured,
    bf16_measured,
    int8_measured,
    refusal,
    try_text,
)
from znni.engine.geometry import Box
from znni.engine.io.mask import OUTSIDE, Mask, MaskSpec
from znni.engine.output.labels import LabelSpec
from znni.model.onnx_model import OnnxModel
from znni.triple import Triple

T = TypeVar("T")
NOT_MEASURED = ("int8: its error against fp32 is measured on the input's own windows once "
                "--input is given")
JOB_MEASURES = ("int8: its error against fp32 is measured on the input's own windows when "
                "a job is submitted, before it writes")


@dataclass(frozen=True)
class Candidate:
    """A precision the run could compute at: its planned window and predicted rate."""

    precision: str
    window: Triple
    predicted_voxels_per_second: float


@dataclass(frozen=True)
class Settled:
    """The precision that runs, the quantized IR it compiles (int8), and what the plan and
    the provenance record of it: "int8" (the error report) and "precision_auto" (the
    candidates measured and the one chosen)."""

    precision: str
    compiled_path: str | None = None
    records: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0  # the settlement's own time, measured: sampling, NNCF, errors


class Sampler:
    """The run's calibration windows per window size, sampled once each."""

    def __init__(self, model: OnnxModel, read: Reader, region: Box,
                 mask: MaskSpec | None = None, where: str = "the input") -> None:
        self.model, self.read, self.region, self.where = model, read, region, where
        self._mask = mask
        self._opened: Mask | None = None
        self._sets: dict[Triple, CalibrationSet] = {}

    def _inside(self, box: Box) -> bool:
        if self._opened is None:
            assert self._mask is not None
            self._opened = Mask(self._mask)
        return self._opened.coverage(box) != OUTSIDE

    def __call__(self, window: Triple) -> CalibrationSet:
        """The sample for a run at `window`, at its capped calibration window."""
        window = calibration_window(self.model, window)
        if window not in self._sets:
            self._sets[window] = sample_windows(
                self.read, self.region, window, self.model, where=self.where,
                inside=None if self._mask is None else self._inside)
        return self._sets[window]


def graph_output(model: OnnxModel, window: Triple) -> str:
    """The output name OpenVINO runs: the graph's, for this window."""
    return model.graph(window).output


def settle(asked: str, model: OnnxModel, candidates: Mapping[str, Candidate],
           sample: Callable[[Triple], CalibrationSet], *, max_error: float,
           labels: LabelSpec | None = None) -> Settled:
    """What runs for `asked` ("int8" or "auto"): int8 measured and refused above
    `max_error` (ValueError, one sentence); auto's first candidate, fastest predicted first,
    whose error is within it (fp32 always is). `candidates`: precision -> its plan."""
    apply = None if labels is None else labels.apply
    text = None if labels is None else labels.text()
    if asked == "int8":
        c = candidates["int8"]
        measured = _int8(model, sample(c.window), max_error, apply, text)
        if not measured.within(max_error):
            raise ValueError(refusal(measured, max_error))
        return Settled("int8", measured.compiled_path,
                       {"int8": {**measured.record, "max_error_allowed": max_error}})
    return _auto(model, candidates, sample, max_error, apply, text)


def _int8(model: OnnxModel, sample: CalibrationSet, max_error: float,
          labels: Callable[[Any], Any] | None, text: str | None) -> Measured:
    """int8 quantized and measured at the sample's (calibration) window."""
    try:
        return int8_measured(model, graph_output(model, sample.window), sample.window, sample,
                             max_error=max_error, labels=labels, labels_text=text)
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001 - NNCF's or OpenVINO's own failure, named
        raise ValueError(f"NNCF could not quantize model {model.name!r} to int8 "
                         f"({type(e).__name__}: {e}); run --precision fp32") from None


def _auto(model: OnnxModel, candidates: Mapping[str, Candidate],
          sample: Callable[[Triple], CalibrationSet], max_error: float,
          labels: Callable[[Any], Any] | None, text: str | None) -> Settled:
    """auto: candidates by predicted voxels/s (ties: int8, bf16, fp32), each measured in
    turn until one is within `max_error`; fp32 needs no measurement. An int8 network
    within it whose measured speed-up over fp32 on a window is below the planner's (layers
    kept in float) goes back in line at the rate that speed-up gives, and is taken when
    it comes round again."""
    def key(c: Candidate) -> tuple[float, int]:
        return (-c.predicted_voxels_per_second, AUTO_ORDER.index(c.precision))

    pending = sorted(candidates.values(), key=key)
    tried: list[dict[str, Any]] = []
    held: dict[str, Measured] = {}  # measured within, rate revised down
    while pending:
        c = pending.pop(0)
        if c.precision in held:  # still the fastest left at its measured rate
            return _chosen(c, held[c.precision], tried, pending, max_error)
        row: dict[str, Any] = {"precision": c.precision, "window": list(c.window),
                               "predicted_voxels_per_second": c.predicted_voxels_per_second}
        if c.precision == "fp32":  # exact by definition; the slower ones are not measured
            tried.append({**row, "within": True})
            return _chosen(c, None, tried, [d for d in pending if d.precision not in held],
                           max_error)
        try:
            measured = _measure(model, c, sample(c.window), max_error, labels, text)
        except ValueError as e:  # e.g. NNCF missing, or a sample of empty windows
            tried.append({**row, "within": False, "refused": str(e)})
            continue
        error = {k: measured.error[k] for k in ("max_error", "mean_error", "labels_changed")}
        tried.append({**row, **error, "within": measured.within(max_error)})
        if not measured.within(max_error):
            continue
        revised = _revised(c, measured, candidates)
        if revised is None or not pending or key(pending[0]) >= key(revised):
            return _chosen(c, measured, tried,
                           [d for d in pending if d.precision not in held], max_error)
        tried[-1]["measured_voxels_per_second"] = revised.predicted_voxels_per_second
        held[c.precision] = measured
        pending = sorted([*pending, revised], key=key)
    raise ValueError("--precision auto found no candidate precision, not even fp32")


def _revised(c: Candidate, measured: Measured, candidates: Mapping[str, Candidate]
             ) -> Candidate | None:
    """int8's rate from its measured speed-up over fp32 on a window (fp32's predicted rate
    times it) where that is below the planner's; None where the plan stands."""
    speedup, fp32 = measured.record.get("window_speedup"), candidates.get("fp32")
    if c.precision != "int8" or not speedup or fp32 is None:
        return None
    rate = fp32.predicted_voxels_per_second * float(speedup)
    return replace(c, predicted_voxels_per_second=rate) if rate < (
        c.predicted_voxels_per_second) else None


def _chosen(c: Candidate, measured: Measured | None, tried: list[dict[str, Any]],
            pending: list[Candidate], max_error: float) -> Settled:
    """auto's choice `c` (measured, or fp32), the candidates left recorded as slower."""
    tried = [*tried, *(_slower(d) for d in pending)]
    records = {"precision_auto": _auto_record(c.precision, tried, max_error)}
    if measured is None:
        return Settled(c.precision, None, records)
    if c.precision == "int8":
        records["int8"] = {**measured.record, "max_error_allowed": max_error}
    return Settled(c.precision, measured.compiled_path, records)


def _slower(c: Candidate) -> dict[str, Any]:
    """A candidate predicted slower than the one chosen: not measured."""
    return {"precision": c.precision, "window": list(c.window), "measured": False,
            "predicted_voxels_per_second": c.predicted_voxels_per_second}


def _measure(model: OnnxModel, c: Candidate, sample: CalibrationSet, max_error: float,
             labels: Callable[[Any], Any] | None, text: str | None) -> Measured:
    if c.precision == "int8":
        return _int8(model, sample, max_error, labels, text)
    return bf16_measured(model, graph_output(model, sample.window), sample, labels=labels)


def _auto_record(chosen: str, tried: list[dict[str, Any]], max_error: float) -> dict[str, Any]:
    return {"chosen": chosen, "max_error_allowed": max_error, "candidates": tried}


def auto_precisions() -> tuple[str, ...]:
    """auto's candidates on this machine: fp32; bf16 where the CPU has bf16 units; int8
    where NNCF and OpenVINO are installed."""
    from znni.planner.graph.openvino_costs import openvino_ready
    from znni.primitives.cpu.openvino_int8 import nncf_available
    from znni.primitives.cpu.openvino_network import cpu_has_bf16

    ready = openvino_ready()
    return ("fp32", *(("bf16",) if ready and cpu_has_bf16() else ()),
            *(("int8",) if ready and nncf_available() else ()))


def int8_line(records: dict[str, Any]) -> str | None:
    """`znni segment`'s and `znni plan`'s line on the measured error; None without one."""
    auto, r = records.get("precision_auto"), records.get("int8")
    parts = []
    if r is not None:
        line = (f"int8: max error {r['max_error']:.2%} / mean {r['mean_error']:.2%} of the "
                f"fp32 range on {r['held_out_windows']} held-out window"
                f"{'s' * (r['held_out_windows'] != 1)}")
        if r.get("labels_changed") is not None:
            line += f", labels changed {r['labels_changed']:.2%}"
        if r.get("preset") == "mixed" or r.get("kept_float"):  # the first try was above
            line += f", NNCF's {try_text(r)}"
        if r.get("window_speedup"):
            line += f"; {r['window_speedup']:.2f}x fp32 on one window"
        parts.append(line + (" (quantized network from the cache)" if r.get("cached") else
                             f" (quantized in {r['quantize_s']:.1f} s, cached)"))
    if auto is not None:
        parts.append(auto_line(auto))
    return "\n".join(parts) or None


def auto_line(auto: dict[str, Any]) -> str:
    """--precision auto's choice and why: each candidate's measured error."""
    seen = []
    for c in auto["candidates"]:
        rate = f"{c['predicted_voxels_per_second']:,.0f} voxels/s"
        if "max_error" in c:
            measured = c.get("measured_voxels_per_second")
            seen.append(f"{c['precision']} {rate}, max error {c['max_error']:.2%}"
                        + ("" if c["within"] else " (above)")
                        + (f", {measured:,.0f} voxels/s by its measured speed-up over fp32"
                           if measured else ""))
        elif "refused" in c:
            seen.append(f"{c['precision']} {rate}, not measured ({c['refused']})")
        else:
            seen.append(f"{c['precision']} {rate}"
                        + (", slower: not measured" if c.get("measured") is False else ""))
    return (f"precision auto: {auto['chosen']}, the fastest predicted within --max-error "
            f"{auto['max_error_allowed']:.2%} (fastest first: {'; '.join(seen)})")


def settle_for_job(asked: str, model: OnnxModel, plan_for: Callable[[str], Any],
                   read: Reader, region: Box, *, mask: MaskSpec | None, where: str,
                   max_error: float, labels: LabelSpec | None) -> tuple[Any, Settled]:
    """The chosen precision's plan (`plan_for(precision)`: a graph_choice.GraphChoice) and
    its settlement for an int8 or auto job: int8's plan alone; auto's candidates each
    planned, those that cannot be (e.g. beyond the budget) passed over, but fp32, and
    those whose plan runs another precision (candidates_of)."""
    plans = plan_candidates(asked, plan_for)
    candidates = candidates_of(plans)
    sample = Sampler(model, read, region, mask, where)
    t0 = time.perf_counter()
    settled = settle(asked, model, candidates, sample, max_error=max_error, labels=labels)
    return plans[settled.precision], replace(settled, seconds=time.perf_counter() - t0)


def candidates_of(plans: Mapping[str, Any]) -> dict[str, Candidate]:
    """The candidates of each precision's plan (a graph_choice.GraphChoice: window,
    predicted_voxels_per_second, precision), less those whose plan runs another precision
    than their own (bf16 where no compiled network was predicted faster: fp32's plan)."""
    return {p: Candidate(p, c.window, c.predicted_voxels_per_second)
            for p, c in plans.items() if p == "fp32" or c.precision == p}


def plan_candidates(asked: str, plan_for: Callable[[str], T]) -> dict[str, T]:
    """`plan_for(precision)` of each precision `asked` ("int8" or "auto") may run at:
    int8's alone; auto's candidates (auto_precisions), those that cannot be planned (e.g.
    beyond the budget) passed over, but fp32, whose refusal is the run's."""
    plans: dict[str, T] = {}
    for p in ("int8",) if asked == "int8" else auto_precisions():
        try:
            plans[p] = plan_for(p)
        except ValueError:
            if p in ("int8", "fp32"):  # int8 asked, or auto's fallback: its own sentence
                raise
    return plans


def unmeasured_summary(asked: str, plans: Mapping[str, dict[str, Any]],
                       note: str = NOT_MEASURED) -> dict[str, Any]:
    """A graph plan summary for int8 or auto without the input to measure on (`znni plan`
    without --input, POST /v1/plan): the fastest predicted candidate's, with each
    candidate's predicted rate and the note that the error is measured on the input."""
    best = max(plans.values(), key=lambda s: float(s["predicted_voxels_per_second"]))
    return {**best, "precision_asked": asked, "precision_note": note,
            "precision_candidates": {p: s["predicted_voxels_per_second"]
                                     for p, s in plans.items()}}
