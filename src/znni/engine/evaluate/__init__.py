"""Segmentations scored against ground truth (issue 51): variation of information (split,
merge) and adapted Rand error, from a contingency table counted block by block, so volumes
larger than memory are scored (docs/evaluate.md)."""

from __future__ import annotations

from znni.engine.evaluate.contingency import ContingencyTable, TableBuilder, block_table
from znni.engine.evaluate.run import EvaluationReport, border_band, evaluate
from znni.engine.evaluate.scores import Scores, score

__all__ = ["ContingencyTable", "EvaluationReport", "Scores", "TableBuilder", "block_table",
           "border_band", "evaluate", "score"]
