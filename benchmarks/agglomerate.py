"""Whole-process `znni agglomerate` against whole-volume waterz: time and scores.

    .venv/bin/python benchmarks/agglomerate.py [--shape 256,384,384 | --quick]
        [--threshold 0.5] [--repeats 2] [--border 1] [--seed 0] [--workdir DIR]
        [--scheduler local:N]

Data: `synthetic_cells(shape)` (engine/agglomerate/synthetic.py: anisotropic cells,
neurites from face to face, leaky, smeared and noisy boundaries), its float32 affinities
written to a Zarr v3 array in chunks of (3, 64, 64, 64) and its ground truth to another,
in a temporary folder (or --workdir).

Peer: waterz on the whole volume in memory, in this process: the whole affinity array read
(timed apart), then `waterz.agglomerate(affs, [threshold])` (timed). znni: the whole
process `python -m znni.cli agglomerate AFFS OUT --threshold T --block B --quiet` for
blocks of 64^3 and 128^3, wall time (start-up, reading, writing the labels included). The
runs alternate (waterz, znni 64, znni 128, again) `--repeats` times; each row's speed
ratio is znni's speed over waterz's (read + agglomerate) in the same repetition, so a
machine busy with something else slows both.

Scores, each segmentation against the ground truth (skimage.metrics, ground-truth
background 0 ignored): VOI split and merge (bits) and the adapted Rand error; with
`--border N` also with the voxels within N voxels of a ground-truth boundary ignored
(CREMI-style). Last, the VOI between znni's 64^3 and 128^3 results (the result must not
depend on the block: ~0) and between znni and waterz. Nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import print_table  # noqa: E402
from _gpu_common import cpu_name  # noqa: E402

ZNNI = [sys.executable, "-m", "znni.cli", "agglomerate"]
BLOCKS = ((64, 64, 64), (128, 128, 128))


@dataclass
class Run:
    """One timed run: its label, wall seconds (read seconds apart for waterz) and result."""

    name: str
    seconds: float | None
    read_s: float | None = None
    labels: np.ndarray | None = None
    error: str | None = None


def triple(text: str) -> tuple[int, int, int]:
    a, b, c = (int(v) for v in text.split(","))
    return (a, b, c)


@contextmanager
def quiet_stdout() -> Iterator[None]:
    """Silence file descriptor 1 (waterz's C++ prints its progress there)."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


def build_data(folder: Path, shape: tuple[int, int, int], seed: int,
               noise: float = 0.1) -> tuple[str, np.ndarray]:
    """Write the synthetic affinities (chunks (3, 64, 64, 64)) and ground truth (chunks 64^3)
    as Zarr v3 arrays under `folder`; (the affinities' path, the ground truth)."""
    import zarr

    from znni.engine.agglomerate.synthetic import synthetic_cells

    t0 = time.perf_counter()
    gt, affs = synthetic_cells(shape, seed=seed, noise=noise)
    made = time.perf_counter() - t0
    affs_path, gt_path = folder / "affs.zarr", folder / "gt.zarr"
    arr = zarr.create_array(store=str(affs_path), shape=affs.shape, chunks=(3, 64, 64, 64),
                            dtype="float32", overwrite=True)
    arr[...] = affs
    arr = zarr.create_array(store=str(gt_path), shape=gt.shape, chunks=(64, 64, 64),
                            dtype="uint64", overwrite=True)
    arr[...] = gt
    print(f"data: synthetic_cells {made:.1f} s, {int(gt.max())} objects, "
          f"{np.count_nonzero(gt == 0) / gt.size:.1%} background; written in "
          f"{time.perf_counter() - t0 - made:.1f} s to {folder}")
    return str(affs_path), gt


def run_waterz(affs_path: str, threshold: float) -> Run:
    """Whole-volume waterz in memory: read the array, then agglomerate (timed apart)."""
    import waterz
    import zarr

    t0 = time.perf_counter()
    affs = np.ascontiguousarray(zarr.open_array(affs_path, mode="r")[...])
    read_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with quiet_stdout():
        labels = next(iter(waterz.agglomerate(affs, [threshold]))).copy()
    return Run("waterz (whole volume)", time.perf_counter() - t0, read_s, labels)


def znni_available() -> str | None:
    """None if `znni agglomerate` runs here, else why not (its last line of output)."""
    try:
        done = subprocess.run([*ZNNI, "--help"], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    if done.returncode == 0:
        return None
    lines = (done.stderr or done.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit status {done.returncode}"


def read_labels(path: Path, shape: tuple[int, int, int]) -> np.ndarray:
    """The labels znni wrote: a Zarr array, or the first array of a Zarr group; a leading
    axis of size 1 (a channel) is dropped, any other shape than `shape` refused."""
    import zarr

    node = zarr.open(str(path), mode="r")
    if isinstance(node, zarr.Group):
        node = node[sorted(k for k, _ in node.arrays())[0]]
    labels = np.asarray(node[...])
    if labels.ndim == 4 and labels.shape[0] == 1:
        labels = labels[0]
    if labels.shape != shape:
        raise ValueError(f"znni wrote labels of shape {labels.shape}, not {shape}")
    return labels


def run_znni(affs_path: str, out: Path, threshold: float, block: tuple[int, int, int],
             shape: tuple[int, int, int], scheduler: str | None) -> Run:
    """The whole `znni agglomerate` process into a fresh `out`, wall time."""
    name = f"znni agglomerate, block {'x'.join(map(str, block))}"
    for old in (out, out.with_name(out.name + ".agglomerate")):
        shutil.rmtree(old, ignore_errors=True)
    cmd = [*ZNNI, affs_path, str(out), "--threshold", f"{threshold:g}",
           "--block", ",".join(map(str, block)), "--quiet"]
    if scheduler:
        cmd += ["--scheduler", scheduler]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return Run(name, None, error=f"exit status {done.returncode}: " + " | ".join(tail))
    try:
        labels = read_labels(out, shape)
    except ValueError as e:
        return Run(name, None, error=str(e))
    return Run(name, seconds, labels=labels)


def border_ignored(gt: np.ndarray, border: int) -> np.ndarray:
    """gt with the voxels within `border` voxels (a cube's reach) of another label,
    background included, set to 0: CREMI-style, so that scores ignore where a boundary lies
    exactly."""
    from scipy import ndimage

    size = 2 * border + 1
    near = ndimage.maximum_filter(gt, size=size) != ndimage.minimum_filter(gt, size=size)
    out = gt.copy()
    out[near] = 0
    return out


def scores(gt: np.ndarray, labels: np.ndarray) -> tuple[float, float, float]:
    """(VOI split, VOI merge, adapted Rand error) against gt, its label 0 ignored."""
    from skimage.metrics import adapted_rand_error, variation_of_information

    split, merge = variation_of_information(gt, labels, ignore_labels=(0,))
    return float(split), float(merge), float(adapted_rand_error(gt, labels, ignore_labels=(0,))[0])


def fmt_scores(values: tuple[float, float, float] | None) -> list[str]:
    return ["-"] * 3 if values is None else [f"{v:.3f}" for v in values]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", type=triple, default=(256, 384, 384))
    ap.add_argument("--quick", action="store_true", help="shape 96,128,128")
    ap.add_argument("--threshold", type=float, default=0.5)
    ap.add_argument("--repeats", type=int, default=2, help="alternating repetitions")
    ap.add_argument("--border", type=int, default=0,
                    help="also score with the ground truth's N-voxel boundary band ignored")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--noise", type=float, default=0.1,
                    help="synthetic_cells' noise (0.1: a watershed of one fragment per ~9 "
                    "voxels; 0.02: per ~100)")
    ap.add_argument("--workdir", type=Path, default=None,
                    help="folder for the arrays and outputs (default: a temporary one)")
    ap.add_argument("--scheduler", default=None, help="znni's --scheduler (default: its own)")
    args = ap.parse_args()
    shape = (96, 128, 128) if args.quick else args.shape
    voxels = int(np.prod(shape))
    print(f"CPU: {cpu_name()}; shape {shape} ({voxels / 1e6:.1f} Mvoxels), threshold "
          f"{args.threshold:g}, {args.repeats} alternating repetitions")
    with tempfile.TemporaryDirectory(prefix="znni-agglomerate-") as tmp:
        folder = args.workdir or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        bench(folder, shape, args)


def bench(folder: Path, shape: tuple[int, int, int], args: argparse.Namespace) -> None:
    affs_path, gt = build_data(folder, shape, args.seed, args.noise)
    missing = znni_available()
    if missing:
        print(f"znni agglomerate is not available ({missing}): znni's rows are missing")
    runs: list[tuple[int, Run]] = []
    for rep in range(args.repeats):
        runs.append((rep, run_waterz(affs_path, args.threshold)))
        if missing:
            continue
        for block in BLOCKS:
            out = folder / f"seg_{'x'.join(map(str, block))}.zarr"
            runs.append((rep, run_znni(affs_path, out, args.threshold, block, shape,
                                          args.scheduler)))
    report(runs, gt, shape, args.border)


@dataclass
class Scored:
    """A result's scores: plain, with the border band ignored (None without --border), and
    whether it differs from the first repetition's result of the same run."""

    plain: tuple[float, float, float]
    banded: tuple[float, float, float] | None
    differs: bool = False


def scored(runs: list[tuple[int, Run]], gt: np.ndarray, border: int) -> dict[str, Scored]:
    """Per run and repetition ("name#rep"), the scores of its result; a repetition whose
    result equals the first one's reuses its scores (scoring is slow), another is scored
    and flagged."""
    gt_band = border_ignored(gt, border) if border else None
    first: dict[str, np.ndarray] = {}
    out: dict[str, Scored] = {}
    for rep, run in runs:
        if run.labels is None:
            continue
        if run.name in first and np.array_equal(first[run.name], run.labels):
            out[f"{run.name}#{rep}"] = out[f"{run.name}#0"]
            continue
        first.setdefault(run.name, run.labels)
        banded = scores(gt_band, run.labels) if gt_band is not None else None
        out[f"{run.name}#{rep}"] = Scored(scores(gt, run.labels), banded, rep > 0)
    return out


def report(runs: list[tuple[int, Run]], gt: np.ndarray, shape: tuple[int, int, int],
           border: int) -> None:
    voxels = int(np.prod(shape))
    score_of = scored(runs, gt, border)
    waterz_s = {rep: r.seconds + (r.read_s or 0.0) for rep, r in runs
                if r.name.startswith("waterz") and r.seconds is not None}
    header = ["rep", "run", "s", "read s", "Mvox/s", "VOI split", "VOI merge", "ARAND"]
    if border:
        header += [f"split b{border}", f"merge b{border}", f"ARAND b{border}"]
    header += ["speed vs waterz"]
    rows = []
    for rep, run in runs:
        if run.seconds is None:
            print(f"{run.name} (repetition {rep}) failed: {run.error}")
            continue
        total = run.seconds + (run.read_s or 0.0)
        got = score_of.get(f"{run.name}#{rep}")
        row = [str(rep), run.name + (" (differs from rep 0)" if got and got.differs else ""),
               f"{run.seconds:.2f}", "-" if run.read_s is None else f"{run.read_s:.2f}",
               f"{voxels / total / 1e6:.2f}", *fmt_scores(got.plain if got else None)]
        if border:
            row += fmt_scores(got.banded if got else None)
        peer = run.name.startswith("waterz")
        row.append("(peer)" if peer else f"{waterz_s[rep] / total:.2f}" if rep in waterz_s else "-")
        rows.append(row)
    print_table(header, rows)
    note = ("s: waterz's agglomerate call (its read apart), znni's whole process; Mvox/s and "
            "the speed ratio (waterz's seconds / znni's) count waterz's read + agglomerate")
    if border:
        note += f"; b{border}: ground-truth voxels within {border} of a boundary ignored"
    print(note)
    compare_results(runs)


def compare_results(runs: list[tuple[int, Run]]) -> None:
    """VOI between znni's block sizes (should be ~0) and between znni and waterz."""
    from skimage.metrics import variation_of_information

    last = {run.name: run.labels for _, run in runs if run.labels is not None}
    names = [n for n in last if n.startswith("znni")]
    pairs = list(zip(names, names[1:]))
    pairs += [(n, w) for n in names[:1] for w in last if w.startswith("waterz")]
    if not names:
        print("znni's rows are missing: no block-to-block comparison")
    for a, b in pairs:
        split, merge = variation_of_information(last[a], last[b])
        print(f"VOI({a} vs {b}): split {split:.4f}, merge {merge:.4f}")


if __name__ == "__main__":
    main()
