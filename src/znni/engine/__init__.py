"""Running a plan over a volume: patch pipeline, block sweep, ledger, local or Dask.

The entry point is `segment.segment(job)`, with a `job.SegmentJob`.
"""
