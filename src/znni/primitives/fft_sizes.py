"""Good FFT sizes: the one rule the CPU backend, the GPU backend and the planner use.

ZNNi pads to the smallest fast size >= n, not to n + k - 1: circular
wrap-around only corrupts the k - 1 outputs that valid convolution discards
anyway, so any size >= n works. FFTW and cuFFT are fastest on sizes
2^a 3^b 5^c 7^d; FFTW is also fast with one more factor 11 or 13, cuFFT is
not, so the backend names its library's extra factors.
"""

from __future__ import annotations

from functools import lru_cache

from znni.primitives.base import Triple

FFTW_EXTRA_FACTORS: tuple[int, ...] = (11, 13)  # FFTW: at most one of these on top
CUFFT_EXTRA_FACTORS: tuple[int, ...] = ()


def _is_smooth(n: int) -> bool:
    for p in (2, 3, 5, 7):
        while n % p == 0:
            n //= p
    return n == 1


def is_good_size(n: int, extra: tuple[int, ...] = FFTW_EXTRA_FACTORS) -> bool:
    """True for 2^a 3^b 5^c 7^d, times at most one factor from `extra`."""
    if n < 1:
        return False
    return _is_smooth(n) or any(n % e == 0 and _is_smooth(n // e) for e in extra)


@lru_cache(maxsize=8192)
def good_size(n: int, even: bool = False, extra: tuple[int, ...] = FFTW_EXTRA_FACTORS) -> int:
    """Smallest good size >= n (even when `even`, as the rfft axis prefers)."""
    if n < 1:
        raise ValueError(f"FFT size must be >= 1, got {n}")
    m = n
    while not (is_good_size(m, extra) and (not even or m % 2 == 0)):
        m += 1
    return m


def padded_shape(size: Triple, extra: tuple[int, ...] = FFTW_EXTRA_FACTORS) -> Triple:
    """Transform shape for an image of `size`: good sizes, the rfft (last) axis even."""
    z, y, x = size
    return (good_size(z, extra=extra), good_size(y, extra=extra), good_size(x, x > 1, extra))


def spectrum_points(padded: Triple) -> int:
    """Complex values of one real-to-complex (half) spectrum of a `padded` transform."""
    return padded[0] * padded[1] * (padded[2] // 2 + 1)
