"""Fast CPU primitives on numpy and pyFFTW: padded and pruned FFT conv, direct conv, MPF.

pyFFTW itself is imported when the first FFT is planned (`fftw_plans.fftw`), so importing
this package (as the planner does, for the kernels' cost constants) stays cheap.
"""

from znni.primitives.cpu.backend import CONV_PRIMITIVES, CpuBackend

__all__ = ["CONV_PRIMITIVES", "CpuBackend"]
