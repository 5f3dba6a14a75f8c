"""Boundaries to segmentations: fragments, region graph, agglomeration, relabel."""
