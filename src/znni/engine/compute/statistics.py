"""The first pass over the input: the statistics a bioimage.io package's preprocessing needs.

`zero_mean_unit_variance` and `scale_range` (and `clip` with percentiles) take the mean,
the standard deviation or percentiles of the whole sample; for a volume run the sample
is the input volume (or ROI). They are computed here slab by slab (`SLAB_VOXELS` at a
time: bounded memory whatever the volume), before anything is written, and recorded in
the ledger's fingerprint parts and the output's provenance; a resumed run takes them from
its ledger instead of reading the volume again.

- mean and std (population, ddof 0): per-slab sums in float64, merged (Chan et al.).
- percentiles: exact, numpy's default (linear) definition. Integer inputs of up to 16 bits
  count every value (a bincount of at most 65536 entries, one pass). Other inputs take
  three passes: min and max; a histogram of HIST_BINS bins between them; the values of
  the bins that hold the two order statistics a percentile needs, sorted. A bin holding
  more than EXACT_CAP values (a near-constant volume) gives its lower edge instead: then
  the error is at most (max - min) / HIST_BINS.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from znni.engine.geometry import Box
from znni.model.processing import Stat, Values

SLAB_VOXELS = 8 * 2**20  # voxels (all channels) read and reduced at a time
HIST_BINS = 65536
EXACT_CAP = 16 * 2**20  # values of one histogram bin gathered to sort (float inputs)


def slabs(region: Box, channels: int) -> Iterator[Box]:
    """The region cut along z into slabs of at most SLAB_VOXELS voxels (one z plane at least)."""
    plane = channels * region.shape[1] * region.shape[2]
    step = max(1, SLAB_VOXELS // max(plane, 1))
    for z in range(region.lo[0], region.hi[0], step):
        yield Box((z, region.lo[1], region.lo[2]),
                  (min(z + step, region.hi[0]), region.hi[1], region.hi[2]))


def _groups(x: np.ndarray, joint: bool) -> list[np.ndarray]:
    """Flat views: one of every channel together, or one per channel. `x` (C, Z, Y, X)."""
    return [x.reshape(-1)] if joint else [x[c].reshape(-1) for c in range(x.shape[0])]


@dataclass
class _Moments:
    n: int = 0
    mean: float = 0.0
    m2: float = 0.0  # sum of squared deviations from the mean

    def add(self, v: np.ndarray) -> None:
        """Merge a slab's values (Chan et al.'s pairwise update, float64)."""
        if v.size == 0:
            return
        v = v.astype(np.float64)
        n_b, mean_b = v.size, float(v.mean())
        m2_b = float(((v - mean_b) ** 2).sum())
        n = self.n + n_b
        delta = mean_b - self.mean
        self.mean += delta * n_b / n
        self.m2 += m2_b + delta * delta * self.n * n_b / n
        self.n = n


def compute_statistics(read: Any, region: Box, channels: int, dtype: np.dtype,
                       stats: tuple[Stat, ...]) -> Values:
    """The values of `stats` over `region` of the volume `read(box) -> (C, Z, Y, X)`."""
    out: Values = {}
    for joint in (True, False):
        wanted = [s for s in stats if s.joint == joint]
        if not wanted:
            continue
        groups = 1 if joint else channels
        if any(s.kind in ("mean", "std") for s in wanted):
            moments = [_Moments() for _ in range(groups)]
            for box in slabs(region, channels):
                for m, v in zip(moments, _groups(read(box), joint), strict=True):
                    m.add(v)
            for s in wanted:
                if s.kind == "mean":
                    out[s.key()] = tuple(m.mean for m in moments)
                elif s.kind == "std":
                    out[s.key()] = tuple(float(np.sqrt(m.m2 / max(m.n, 1))) for m in moments)
        qs = [s for s in wanted if s.kind == "percentile"]
        if qs:
            found = _percentiles(read, region, channels, dtype, joint, [s.q for s in qs])
            for s, values in zip(qs, found, strict=True):
                out[s.key()] = values
    return out


def _ranks(n: int, q: float) -> tuple[int, int, float]:
    """numpy's linear percentile: the order statistics (lo, hi) and the weight of hi."""
    h = (n - 1) * q / 100.0
    lo = int(np.floor(h))
    return lo, min(lo + 1, n - 1), h - lo


def _percentiles(read: Any, region: Box, channels: int, dtype: np.dtype, joint: bool,
                 qs: list[float]) -> list[tuple[float, ...]]:
    """Per q, the percentile of each group (one group when joint)."""
    groups = 1 if joint else channels
    dt = np.dtype(dtype)
    if dt.kind in "uib" and dt.itemsize <= 2:
        offset = 0 if dt.kind in "ub" else -int(np.iinfo(dt).min)
        size = 2 if dt.kind == "b" else 2 ** (8 * dt.itemsize)
        counts = np.zeros((groups, size), np.int64)
        for box in slabs(region, channels):
            for g, v in enumerate(_groups(read(box), joint)):
                counts[g] += np.bincount(v.astype(np.int64) + offset, minlength=size)
        return [tuple(_from_counts(counts[g], q) - offset for g in range(groups)) for q in qs]
    lo = np.full(groups, np.inf)
    hi = np.full(groups, -np.inf)
    for box in slabs(region, channels):
        for g, v in enumerate(_groups(read(box), joint)):
            if v.size:
                lo[g], hi[g] = min(lo[g], float(v.min())), max(hi[g], float(v.max()))
    counts = np.zeros((groups, HIST_BINS), np.int64)
    for box in slabs(region, channels):
        for g, v in enumerate(_groups(read(box), joint)):
            counts[g] += np.bincount(_bins(v, lo[g], hi[g]), minlength=HIST_BINS)
    return _exact_from_bins(read, region, channels, joint, qs, counts, lo, hi)


def _bins(v: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Each value's histogram bin over [lo, hi] (the same arithmetic in every pass)."""
    width = (hi - lo) / HIST_BINS if hi > lo else 1.0
    idx = np.floor((v.astype(np.float64) - lo) / width).astype(np.int64)
    return np.clip(idx, 0, HIST_BINS - 1)


def _from_counts(counts: np.ndarray, q: float) -> float:
    """The percentile from exact counts of the integer values 0..len-1."""
    cum = np.cumsum(counts)
    a, b, w = _ranks(int(cum[-1]), q)
    va = float(np.searchsorted(cum, a, side="right"))
    vb = float(np.searchsorted(cum, b, side="right"))
    return va + w * (vb - va)


def _exact_from_bins(read: Any, region: Box, channels: int, joint: bool, qs: list[float],
                     counts: np.ndarray, lo: np.ndarray, hi: np.ndarray
                     ) -> list[tuple[float, ...]]:
    """Gather the values of the bins that hold the order statistics, sort, pick."""
    groups = counts.shape[0]
    cum = np.cumsum(counts, axis=1)
    # per group: rank -> (bin, rank within the bin)
    where: list[dict[int, tuple[int, int]]] = [{} for _ in range(groups)]
    for g in range(groups):
        for q in qs:
            for r in _ranks(int(cum[g, -1]), q)[:2]:
                b = int(np.searchsorted(cum[g], r, side="right"))
                where[g][r] = (b, r - (int(cum[g, b - 1]) if b else 0))
    wanted = [{b for b, _ in where[g].values() if counts[g, b] <= EXACT_CAP}
              for g in range(groups)]
    gathered: list[dict[int, list[np.ndarray]]] = [{b: [] for b in w} for w in wanted]
    if any(wanted):
        for box in slabs(region, channels):
            for g, v in enumerate(_groups(read(box), joint)):
                if not wanted[g]:
                    continue
                idx = _bins(v, lo[g], hi[g])
                for b in wanted[g]:
                    gathered[g][b].append(v[idx == b])
    width = (hi - lo) / HIST_BINS
    out = []
    for q in qs:
        per_group = []
        for g in range(groups):
            a, b, w = _ranks(int(cum[g, -1]), q)
            vals = []
            for r in (a, b):
                bin_, k = where[g][r]
                if bin_ in gathered[g]:
                    vals.append(float(np.sort(np.concatenate(gathered[g][bin_]))[k]))
                else:  # too many values in one bin: its lower edge (error < one bin)
                    vals.append(float(lo[g] + bin_ * width[g]))
            per_group.append(vals[0] + w * (vals[1] - vals[0]))
        out.append(tuple(per_group))
    return out


def with_input_statistics(model: Any, volume: Any, region: Box, header: dict[str, Any] | None,
                          parts: dict[str, Any]) -> tuple[Any, dict[str, list[float]] | None]:
    """(the model with its preprocessing's statistics filled in, those statistics or None
    when it needs none). A ledger whose parts agree with `parts` (same network, input, ROI,
    ...) gives them: a resumed run does not read the volume again."""
    from dataclasses import replace

    from znni.model.processing import needed_stats, resolve_chain

    ops = tuple(getattr(model, "preprocessing", ()))
    stats = needed_stats(ops)
    if not stats:
        return model, None
    old = (header or {}).get("parts", {})
    recorded = old.get("statistics") if all(old.get(k) == v for k, v in parts.items()) else None
    if isinstance(recorded, dict) and all(s.key() in recorded for s in stats):
        values = {s.key(): tuple(float(v) for v in recorded[s.key()]) for s in stats}
    else:
        values = compute_statistics(volume.read, region, model.in_channels, volume.dtype, stats)
    resolved = resolve_chain(ops, values)
    return replace(model, preprocessing=resolved), {k: list(v) for k, v in values.items()}


def prepare_package(job: Any, volume: Any, region: Box, header: dict[str, Any] | None,
                    parts: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(the job, its fingerprint parts) ready for a bioimage.io package: its preprocessing's
    statistics resolved (recorded in the parts; taken from the ledger on resume, computed
    again on --overwrite) and its window grid raised for its halo at the job's overlap (an
    explicit --window is checked against the halo instead). Other models pass unchanged."""
    from dataclasses import replace

    from znni.model.bioimage_package import check_halo, halo_min_window

    model = job.network
    if getattr(model, "package", None) is None:
        return job, parts
    if job.window is not None:
        check_halo(model, job.window, job.overlap, region.shape)
    model = halo_min_window(model, job.overlap, region.shape)
    model, stats = with_input_statistics(model, volume, region,
                                         None if job.overwrite else header, parts)
    return replace(job, network=model), parts if stats is None else {**parts,
                                                                      "statistics": stats}
