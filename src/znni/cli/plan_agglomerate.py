"""Predicted agglomeration time and memory: `znni agglomerate ... --plan` (from a sample of
the affinities) and `znni plan ... --agglomerate` (of the network's output, from synthetic
cells: its affinities do not exist yet). engine/agglomerate/predict.py predicts."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from znni.engine.agglomerate.job import AgglomerateJob
    from znni.engine.agglomerate.predict import AgglomerationPrediction

PLAN_VOLUME = (512, 512, 512)  # `znni plan --agglomerate` without --input


def predict_job(job: AgglomerateJob) -> AgglomerationPrediction:
    """The job's agglomeration predicted from the central block (at most 64^3) of its
    affinities; checks the job as a run does and writes nothing."""
    from znni.engine.agglomerate.predict import SAMPLE_EDGE, predict
    from znni.engine.agglomerate.prepare import prepare
    from znni.engine.agglomerate.stages import to_affinities
    from znni.engine.geometry import Box
    from znni.triple import as_triple

    prep = prepare(job)
    region = prep.source.region
    side = as_triple(min(SAMPLE_EDGE, b) for b in prep.block)
    lo = as_triple(r + (n - s) // 2 for r, n, s in zip(region.lo, region.shape, side,
                                                      strict=True))
    box = Box(lo, as_triple(a + s for a, s in zip(lo, side, strict=True)))
    sample = to_affinities(prep.volume.read(box), prep.source.scale)
    return predict(region.shape, prep.block, sample, job.thresholds,
                   sample_name=str(job.affinities), low=job.low, high=job.high)


def check_channels(out_channels: int, network: str) -> None:
    """Only affinities (3 channels) or a boundary map (1) agglomerate; ValueError else."""
    if out_channels not in (1, 3):
        raise ValueError(f"--agglomerate needs a network writing 3 channels (affinities) or "
                         f"1 (a boundary map); {network} writes {out_channels}")


def predict_plan(args: argparse.Namespace, region: tuple[int, int, int] | None
                 ) -> tuple[str, dict[str, Any]]:
    """(the line, the JSON object) predicting agglomeration of the network's output over
    the planned region (--input's, else a 512^3 volume), assuming synthetic cells."""
    from znni.engine.agglomerate.job import DEFAULT_BLOCK, parse_thresholds
    from znni.engine.agglomerate.predict import predict

    thresholds, _ = parse_thresholds(args.agglomerate)
    shape = region if region is not None else PLAN_VOLUME
    block = tuple(min(b, n) for b, n in zip(DEFAULT_BLOCK, shape, strict=True))
    p = predict(shape, (block[0], block[1], block[2]), None, thresholds)
    where = "x".join(map(str, shape)) + ("" if region is not None else " (no --input)")
    ts = ",".join(f"{t:g}" for t in thresholds)
    line = f"agglomeration (threshold {ts}) of the output over {where}: {p.line()}"
    return line, {"region": list(shape), "thresholds": list(thresholds), **p.to_dict()}
