"""Fast CPU primitives on numpy and pyFFTW: padded and pruned FFT conv, direct conv, MPF.

Importing this package imports pyFFTW; `znni.primitives.backends` does so lazily.
"""

from znni.primitives.cpu.backend import CONV_PRIMITIVES, CpuBackend

__all__ = ["CONV_PRIMITIVES", "CpuBackend"]
