"""The block sweep: any stage's blocks computed locally or on Dask, resumably (run.py)."""
