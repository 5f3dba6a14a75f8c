"""Array kernels: convolution, pooling, max-pooling fragments, activations.

`base` holds the `Backend` interface and the layer-op values; `reference`
is the simple numpy oracle; `cpu/` and `gpu/` hold the fast backends.
"""

from znni.primitives.base import Activation, Backend, Conv, Op, Pool
from znni.primitives.dense import dense_forward
from znni.primitives.reference import ReferenceBackend

__all__ = [
    "Activation",
    "Backend",
    "Conv",
    "Op",
    "Pool",
    "ReferenceBackend",
    "dense_forward",
]
