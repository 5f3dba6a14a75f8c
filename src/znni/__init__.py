"""znni: dense sliding-window inference of 3D ConvNets over large Zarr volumes.

Data flows volume -> blocks -> patches -> layers -> primitives -> output blocks:
`primitives` (array kernels) -> `planner` (network model, plans) ->
`engine` (patch pipeline, volume sweep) -> `server` (CLI, HTTP API).
Nothing heavy happens at import time.
"""

__version__ = "0.1.0"
