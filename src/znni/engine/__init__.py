"""Running a network over a volume: patch pipeline, block sweep, ledger, local or Dask."""

from znni.engine.job import ProgressEvent, SegmentCancelled, SegmentJob, SegmentReport

__all__ = ["ProgressEvent", "SegmentCancelled", "SegmentJob", "SegmentReport"]
