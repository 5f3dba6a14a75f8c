"""A reduced precision's error, measured before a run: int8 quantized and checked against
--max-error, and --precision auto's choice (docs/design.md, "int8 and auto").

The held-out windows (int8_calibration.py) run through the fp32 network compiled by
OpenVINO and through the candidate (NNCF's int8 network, or the bf16 one); the error is
max |candidate - fp32| and mean |candidate - fp32| over the fp32 outputs' range on those
windows, and with --labels the fraction of voxels whose label differs (the same label
function on both). int8 above the allowed error is quantized again with NNCF's mixed
preset (asymmetric activations), then also with the first and last conv nodes kept in
float (NNCF's ignored scope: the usual sensitive layers, reading the raw input and
writing the logits), then with NNCF's accuracy control (it puts back in float the layers
that matter most until the calibration windows' largest error is within CONTROL_MARGIN
of the allowed one), and refused with one sentence if still above. The network taken is
timed on one held-out window against fp32 (`window_speedup`): a network with layers kept
in float is slower than the planner's int8 rate says, and auto weighs what was measured
(engine/precision_run.py). An int8
measurement is kept beside its quantized network (keyed by the held-out windows and the
labels), so a rerun or resume neither quantizes nor measures again.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from znni.engine.compute.int8_calibration import CalibrationSet
from znni.model.onnx_model import OnnxModel
from znni.triple import Triple

log = logging.getLogger(__name__)
Labels = Callable[[np.ndarray], np.ndarray]  # (C, Z, Y, X) output -> (Z, Y, X) labels
# auto: the precisions tried after their predicted speed ties, fastest kernels first
AUTO_ORDER = ("int8", "bf16", "fp32")
# The accuracy control aims at this share of --max-error on the calibration windows: the
# held-out windows, which decide, were not seen by it, and a network's largest error moves
# between windows (trained_unet.onnx, 64^3, aimed at 1.5%: 1.24% on the calibration
# windows and 1.16% held out; 1.35% and 1.34% with the mixed preset; Zen 4, 2026-11-29)
CONTROL_MARGIN = 0.75


def relative_error(ref: np.ndarray, got: np.ndarray, labels: Labels | None = None
                   ) -> dict[str, Any]:
    """max and mean |got - ref| over ref's range (its max minus its min over all windows;
    1 where ref is constant), and with `labels` the fraction of voxels whose label
    changes; `ref` and `got` are (N, C, ...) outputs of the same windows."""
    if ref.shape != got.shape:
        raise ValueError(f"outputs of shape {ref.shape} and {got.shape} cannot be compared")
    span = float(ref.max()) - float(ref.min())
    diff = np.abs(got.astype(np.float64) - ref.astype(np.float64))
    scale = span if span > 0 else 1.0
    out: dict[str, Any] = {"max_error": float(diff.max()) / scale,
                           "mean_error": float(diff.mean()) / scale, "fp32_range": span,
                           "labels_changed": None}
    if labels is not None:
        changed = sum(int(np.count_nonzero(labels(r) != labels(g)))
                      for r, g in zip(ref, got, strict=True))
        out["labels_changed"] = changed / max(1, ref.shape[0] * int(np.prod(ref.shape[2:])))
    return out


def run_windows(path: str, windows: np.ndarray, output: str, precision: str) -> np.ndarray:
    """Each (C, *W) window of `windows` through the network at `path` compiled by OpenVINO
    at `precision` (batch 1): their outputs, (N, Cout, ...) float32."""
    from znni.primitives.cpu.openvino_network import NETWORKS

    net = NETWORKS.get(path, (1, *windows.shape[1:]), output, precision)
    return np.concatenate([net.run(windows[i:i + 1]) for i in range(windows.shape[0])])


@dataclass(frozen=True)
class Measured:
    """A candidate precision's measured error, and for int8 its quantized network."""

    precision: str
    error: dict[str, Any]
    compiled_path: str | None = None  # int8: the quantized IR the run compiles
    record: dict[str, Any] = field(default_factory=dict)  # int8: provenance's record

    def within(self, max_error: float) -> bool:
        return bool(self.error["max_error"] <= max_error)


def _fp32_reference(model: OnnxModel, output: str, sample: CalibrationSet) -> np.ndarray:
    return run_windows(model.path, sample.held_out, output, "fp32")


def _note_key(sample: CalibrationSet, labels_text: str | None) -> str:
    h = hashlib.sha256(np.ascontiguousarray(sample.held_out).tobytes())
    h.update(f"|{sample.held_out.shape}|{labels_text}".encode())
    return "error-" + h.hexdigest()[:16]


def quantize_and_measure(model: OnnxModel, output: str, sample: CalibrationSet,
                         keep_float: Sequence[str] = (), preset: str = "performance", *,
                         labels: Labels | None = None, labels_text: str | None = None,
                         reference: Callable[[], np.ndarray] | None = None,
                         max_drop: float | None = None) -> Measured:
    """NNCF's int8 network of `model` calibrated on `sample` (from the cache or made now;
    `max_drop`: with NNCF's accuracy control) and its error on the held-out windows (kept
    beside it, so found there next time)."""
    from znni.primitives.cpu.openvino_int8 import quantized_network, read_note, write_note

    q = quantized_network(model.path, model.digest, sample.calibration, output, keep_float,
                          preset, max_drop=max_drop)
    key = _note_key(sample, labels_text)
    error = read_note(q, key)
    if error is None:
        ref = reference() if reference is not None else _fp32_reference(model, output, sample)
        error = relative_error(ref, run_windows(q.xml, sample.held_out, output, "int8"),
                               labels)
        error["window_speedup"] = window_speedup(model.path, q.xml, sample.held_out[:1],
                                                 output)
        write_note(q, key, error)
    record = {**sample.record(), **error, "preset": q.preset, "kept_float": list(q.keep_float),
              "accuracy_control": max_drop, "digest": q.digest, "cached": q.cached,
              "quantize_s": q.seconds}
    return Measured("int8", error, q.xml, record)


def int8_measured(model: OnnxModel, output: str, window: Triple, sample: CalibrationSet, *,
                  max_error: float, labels: Labels | None = None,
                  labels_text: str | None = None) -> Measured:
    """int8 as quantize_and_measure makes it, NNCF's quantizations tried in turn until one
    is within `max_error`: the performance preset (the fastest), the mixed preset
    (asymmetric activations), mixed with the first and last conv kept in float, then mixed
    under NNCF's accuracy control. A network it put wholly back in float is no int8
    network and never taken. The record is the first try within `max_error`, else the
    most exact one (the caller refuses or passes over it), and lists every try, each with
    its measured speed-up over fp32 on one window."""
    from znni.primitives.cpu.openvino_int8 import conv_names

    refs: dict[str, np.ndarray] = {}

    def reference() -> np.ndarray:  # the fp32 outputs, run once for every try
        if "ref" not in refs:
            refs["ref"] = _fp32_reference(model, output, sample)
        return refs["ref"]

    names = conv_names(model.path, (1, model.in_channels, *window))
    ends = tuple(dict.fromkeys((names[0], names[-1]))) if names else ()
    control = CONTROL_MARGIN * max_error if 0 < CONTROL_MARGIN * max_error < 1 else None
    plan: list[tuple[str, tuple[str, ...], float | None]] = [
        ("performance", (), None), ("mixed", (), None),
        *([("mixed", ends, None)] if ends else []),
        *([("mixed", (), control)] if control is not None and names else [])]

    tries: list[dict[str, Any]] = []
    seconds, cached = 0.0, True
    best: Measured | None = None  # the most exact network with int8 convs left in it
    for preset, kept, drop in plan:
        if drop is not None:
            log.info("int8: above --max-error %g with NNCF's presets (%s); NNCF's accuracy "
                     "control next (a minute or more the first time, cached after: it "
                     "compiles a network per layer it ranks)", max_error,
                     ", ".join(f"{t['max_error']:.2%}" for t in tries))
        m = quantize_and_measure(model, output, sample, kept, preset, labels=labels,
                                 labels_text=labels_text, reference=reference, max_drop=drop)
        seconds, cached = seconds + m.record["quantize_s"], cached and m.record["cached"]
        tries.append({**{k: m.record.get(k) for k in (
            "preset", "kept_float", "accuracy_control", "max_error", "mean_error",
            "labels_changed", "window_speedup")}, "convs": len(names)})
        if names and len(m.record["kept_float"]) >= len(names):
            continue  # every conv back in float: no int8 left, not an int8 network
        if best is None or m.error["max_error"] < best.error["max_error"]:
            best = m
        if m.within(max_error):
            break
    m = best if best is not None else m
    return Measured("int8", m.error, m.compiled_path,
                    {**m.record, "quantize_s": seconds, "cached": cached, "tries": tries})


def window_speedup(fp32_path: str, int8_path: str, window: np.ndarray, output: str,
                   reps: int = 3) -> float:
    """fp32's time over int8's on one (1, C, Z, Y, X) window, medians of `reps` after a
    warm run, alternated (both networks compiled by OpenVINO, as a run compiles them)."""
    from znni.primitives.cpu.openvino_network import NETWORKS

    nets = [NETWORKS.get(path, window.shape, output, precision)
            for path, precision in ((fp32_path, "fp32"), (int8_path, "int8"))]
    times: list[list[float]] = [[], []]
    for net in nets:
        net.run(window)
    for _ in range(reps):
        for net, t in zip(nets, times, strict=True):
            t0 = time.perf_counter()
            net.run(window)
            t.append(time.perf_counter() - t0)
    return float(np.median(times[0]) / max(1e-9, float(np.median(times[1]))))


def try_text(t: dict[str, Any]) -> str:
    """One quantization tried, in words: "mixed preset, first and last conv kept in fp32"."""
    if t.get("accuracy_control") is not None:
        kept, convs = len(t.get("kept_float") or ()), t.get("convs")
        return f"{t['preset']} preset under accuracy control " + (
            f"(all {kept} conv layers kept in fp32: no int8 left)" if convs and kept >= convs
            else f"({kept} conv layers kept in fp32)")
    return t["preset"] + " preset" + (", first and last conv kept in fp32"
                                      if t.get("kept_float") else "")


def refusal(measured: Measured, max_error: float) -> str:
    """The one sentence refusing an int8 run whose error is above `max_error`."""
    r = measured.record
    tried = "; ".join(f"{try_text(t)}: {t['max_error']:.2%}" for t in r.get("tries", ()))
    return (f"int8's largest error is {measured.error['max_error']:.2%} of the fp32 "
            f"output's range on {r['held_out_windows']} held-out windows (NNCF's "
            f"quantizations tried: {tried}), above --max-error {max_error:g} "
            f"({max_error:.2%}); run --precision fp32 (or auto), or allow more with "
            "--max-error")


def bf16_measured(model: OnnxModel, output: str, sample: CalibrationSet, *,
                  labels: Labels | None = None) -> Measured:
    """The bf16 network's error on the held-out windows (auto's bf16 candidate)."""
    ref = _fp32_reference(model, output, sample)
    got = run_windows(model.path, sample.held_out, output, "bf16")
    return Measured("bf16", relative_error(ref, got, labels))
