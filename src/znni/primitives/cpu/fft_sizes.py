"""Good FFT sizes: ZNNi pads to the smallest fast size >= n, not to n + k - 1.

Circular wrap-around only corrupts the k - 1 outputs that valid convolution
discards anyway, so any size >= n works; FFTW is fastest on 2^a 3^b 5^c 7^d,
optionally times one factor 11 or 13.
"""

from __future__ import annotations

from functools import lru_cache

from znni.primitives.base import Triple


def _is_smooth(n: int) -> bool:
    for p in (2, 3, 5, 7):
        while n % p == 0:
            n //= p
    return n == 1


def is_good_size(n: int) -> bool:
    """True for 2^a 3^b 5^c 7^d times at most one factor 11 or 13."""
    if n < 1:
        return False
    if _is_smooth(n):
        return True
    return any(n % e == 0 and _is_smooth(n // e) for e in (11, 13))


@lru_cache(maxsize=4096)
def good_size(n: int, even: bool = False) -> int:
    """Smallest good size >= n (even when `even`, as the rfft axis prefers)."""
    if n < 1:
        raise ValueError(f"FFT size must be >= 1, got {n}")
    m = n
    while not (is_good_size(m) and (not even or m % 2 == 0)):
        m += 1
    return m


def padded_shape(size: Triple) -> Triple:
    """Transform shape for a patch of `size`: good sizes, the rfft (last) axis even."""
    z, y, x = size
    return (good_size(z), good_size(y), good_size(x, even=x > 1))
