"""Test helpers shared across test folders, importable as `support.<module>` (pytest's
`pythonpath = ["tests"]`, so spawned subprocesses import them too):

- naive: brute-force references (convolution, pooling, dense networks) and `close`;
- naive_graph: references for the graph ops;
- engine_ref: small networks and volumes written to disk, and their dense reference;
- gpu_helpers: layer lists for the GPU backend tests;
- planner_nets: the ZNNi paper's networks and a traced peak-memory reference;
- server_util: a live `znni serve` process, jobs and volumes for the API tests;
- s3_util, gcs_util, gcs_token_gate: local S3 and GCS servers and a token gate;
- store_runs: `znni segment` runs against an object store;
- onnx_models: each ONNX test model built and exported once per session.
"""
