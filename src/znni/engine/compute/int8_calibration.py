"""Calibration and held-out windows for int8 (and auto) runs, sampled from the job's own
input (docs/design.md, "int8 and auto").

Windows of the run's window size are taken over the region, spread: candidate origins on
a coarse grid of the region (a few per axis), then on a finer one (half a window apart),
each grid shuffled with a fixed seed, so the same job always draws the same windows (and
finds its quantized network in the cache). A candidate is skipped where its input is
constant (all zero, or all one value: padding, an empty stretch) or wholly outside the
--mask. Windows are read clipped to the region, preprocessed as the engine feeds windows
(`OnnxModel.network_input`: scale, shift, a package's preprocessing) and zero-padded
where the region is smaller than the window, as the windowed engine pads them. This
module reads through the `read` callable it is given: compute never opens a store.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from znni.engine.geometry import Box
from znni.model.onnx_model import OnnxModel
from znni.triple import Triple

# NNCF's post-training quantization fits a min-max range per activation (PERFORMANCE:
# per tensor) from these windows: 16 windows of 64^3 hold 4M voxels per channel, and its
# time grows with each window (3.3 s for 16 at 64^3, BasicUNet, issue 53's host); NNCF's
# default of 300 samples is for small 2D images, not windows of a volume
CALIBRATION_WINDOWS = 16
# windows never calibrated on, where the int8 and fp32 outputs are compared: 4 of 64^3
# compare 1M voxels per channel, a second of fp32 and int8 runs on 2 cores
HELDOUT_WINDOWS = 4
SEED = 53  # the sample's fixed seed (issue 53)
# the calibration and held-out windows are at most this many voxels per axis (on the
# model's window grid): NNCF's statistics and the held-out runs then cost the same for a
# planner's 256^3 window as for a 64^3 one (at 256^3 they took 65 s and 8.8 GiB on the
# trained test U-Net); the quantized network is compiled at the run's window, OpenVINO
# reshaping it (its quantization ranges are per tensor or per channel, not per voxel)
CALIBRATION_SIDE = 64
# candidate windows read before giving up on a mostly empty volume (512 of 64^3 uint8:
# 128 MiB read)
MAX_PROBES = 512

Reader = Callable[[Box], np.ndarray]  # a box of the volume -> (C, Z, Y, X) voxels
Inside = Callable[[Box], bool]  # whether a box has any voxel inside the --mask


@dataclass(frozen=True)
class CalibrationSet:
    """The sampled windows, preprocessed: (N, C, *W) and (M, C, *W) float32."""

    calibration: np.ndarray
    held_out: np.ndarray
    origins: tuple[Triple, ...]  # every window's first voxel: calibration, then held-out
    probed: int  # candidate windows read
    disjoint: bool  # False only when the region holds one non-empty window, used for both

    def record(self) -> dict[str, object]:
        """What the provenance keeps of the sample."""
        return {"calibration_windows": int(self.calibration.shape[0]),
                "held_out_windows": int(self.held_out.shape[0]),
                "held_out_disjoint": self.disjoint, "windows_read": self.probed,
                "seed": SEED, "calibration_window": list(self.window)}

    @property
    def window(self) -> Triple:
        """The windows' spatial size (the run's window, capped by calibration_window)."""
        z, y, x = self.held_out.shape[2:]
        return (int(z), int(y), int(x))


def calibration_window(model: OnnxModel, window: Triple,
                       side: int = CALIBRATION_SIDE) -> Triple:
    """The window int8 is calibrated and measured at for a run at `window`: each axis at
    most `side` voxels (or the model's least window), on the model's window grid; a model
    exported for one window size keeps it."""
    if model.fixed_window is not None:
        return (int(window[0]), int(window[1]), int(window[2]))
    out = []
    for w, least, step in zip(window, model.min_window, model.size_factor, strict=True):
        if w <= side:
            out.append(int(w))
        else:
            out.append(int(least + max(0, (side - least) // step) * step))
    return (out[0], out[1], out[2])


def axis_origins(lo: int, hi: int, size: int, count: int) -> list[int]:
    """At most `count` origins of a `size` window spread evenly over [lo, hi) on one axis
    (first and last included); one origin centred on it where the window is larger."""
    room = hi - lo - size
    if room <= 0:
        return [lo + room // 2]
    count = max(1, min(count, room + 1))
    if count == 1:
        return [lo + room // 2]
    return sorted({lo + round(i * room / (count - 1)) for i in range(count)})


def candidate_origins(region: Box, window: Triple, need: int,
                      seed: int = SEED) -> list[Triple]:
    """Window origins over `region`: a coarse grid (about 4 * `need` windows), then the
    rest of a grid half a window apart, each shuffled with `seed`."""
    per_axis = max(2, math.ceil((4 * need) ** (1 / 3)))
    coarse = _grid(region, window, [per_axis] * 3)
    fine_counts = [max(1, (region.shape[a] - window[a]) * 2 // max(1, window[a]) + 1)
                   for a in range(3)]
    fine = [o for o in _grid(region, window, fine_counts) if o not in set(coarse)]
    rng = np.random.default_rng(seed)
    order = [coarse[i] for i in rng.permutation(len(coarse))]
    return order + [fine[i] for i in rng.permutation(len(fine))]


def _grid(region: Box, window: Triple, counts: list[int]) -> list[Triple]:
    axes = [axis_origins(region.lo[a], region.hi[a], window[a], counts[a]) for a in range(3)]
    return [(z, y, x) for z in axes[0] for y in axes[1] for x in axes[2]]


def sample_windows(read: Reader, region: Box, window: Triple, model: OnnxModel, *,
                   inside: Inside | None = None, where: str = "the input",
                   count: int = CALIBRATION_WINDOWS, held_out: int = HELDOUT_WINDOWS,
                   seed: int = SEED) -> CalibrationSet:
    """`count` calibration and `held_out` held-out windows of `window` from `region`
    (module docstring), fewer where the region holds fewer non-empty windows: then a fifth
    of those found (at least one) are held out. ValueError of one sentence where every
    window read is empty."""
    chosen: list[tuple[Triple, np.ndarray]] = []
    probed = 0
    for origin in candidate_origins(region, window, count + held_out, seed)[:MAX_PROBES]:
        probed += 1
        box = _window_box(origin, window).intersect(region)
        if box is None or box.size == 0 or (inside is not None and not inside(box)):
            continue  # outside the region or the mask
        raw = read(box)
        if raw.min() == raw.max():
            continue  # constant: padding or an empty stretch
        chosen.append((origin, _padded(model.network_input(raw), origin, region, window)))
        if len(chosen) == count + held_out:
            break
    if not chosen:
        raise ValueError(
            f"int8 calibration found only empty windows in {where} ({probed} windows of "
            f"{'x'.join(map(str, window))} read over region {_region_text(region)}, each "
            "constant or outside the mask); choose another --roi or --precision fp32")
    return _split(chosen, count, held_out, probed)


def _split(chosen: list[tuple[Triple, np.ndarray]], count: int, held_out: int,
           probed: int) -> CalibrationSet:
    n = len(chosen)
    if n == 1:  # one window in all: it calibrates and is measured on
        arr = chosen[0][1][None]
        return CalibrationSet(arr, arr, (chosen[0][0],), probed, False)
    held = held_out if n >= count + held_out else max(1, min(held_out, n // 5))
    calib = chosen[:min(count, n - held)]
    held_part = chosen[len(calib):len(calib) + held]
    return CalibrationSet(np.stack([w for _, w in calib]), np.stack([w for _, w in held_part]),
                          tuple(o for o, _ in calib + held_part), probed, True)


def _window_box(origin: Triple, window: Triple) -> Box:
    return Box(origin, (origin[0] + window[0], origin[1] + window[1], origin[2] + window[2]))


def _padded(x: np.ndarray, origin: Triple, region: Box, window: Triple) -> np.ndarray:
    """The preprocessed part `x` (C, *part) in a zero window (C, *window) at its place."""
    if x.shape[1:] == tuple(window):
        return np.ascontiguousarray(x, np.float32)
    out = np.zeros((x.shape[0], *window), np.float32)
    at = [max(0, region.lo[a] - origin[a]) for a in range(3)]
    out[:, at[0]:at[0] + x.shape[1], at[1]:at[1] + x.shape[2], at[2]:at[2] + x.shape[3]] = x
    return out


def _region_text(region: Box) -> str:
    return ",".join(f"{a}:{b}" for a, b in zip(region.lo, region.hi, strict=True))
