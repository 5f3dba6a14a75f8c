"""Kernel spectra kept between patches, in an LRU bounded in bytes.

Spectra are Cin*Cout*Nz*Ny*(Nx/2+1)*8 bytes (6.9 GB for 80x80 at 64^3), so
what fits decides between "fft-keep" and "fft-recompute". The key holds
everything that shapes the spectra: a digest of the weight bytes, the weight
shape and dtype, and the padded transform size.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable

import numpy as np

from znni.lru import BytesLRU
from znni.primitives.base import Triple


def spectra_key(weight: np.ndarray, padded: Triple) -> Hashable:
    """Cache key of the spectra of `weight` transformed at `padded`."""
    w = np.ascontiguousarray(weight)
    digest = hashlib.blake2b(w.view(np.uint8).reshape(-1).data, digest_size=16).hexdigest()
    return (digest, w.shape, w.dtype.str, tuple(padded))


class SpectraCache(BytesLRU):
    """Kernel spectra under `spectra_key`s, bounded in bytes (what fits decides between
    fft-keep and fft-recompute)."""
