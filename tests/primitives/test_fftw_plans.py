"""How primitives/cpu/fftw_plans imports pyFFTW."""

from __future__ import annotations


def test_pyfftw_imports_without_scipy_fftpack_or_dask() -> None:
    """pyfftw's own __init__ would import scipy.fftpack and dask.array (0.45 s of every
    process start); fftw_plans blocks them while it imports pyfftw, and only then."""
    import subprocess
    import sys

    code = ("import sys, znni.primitives.cpu.fftw_plans as f\n"
            "print('dask' in sys.modules, 'scipy.fftpack' in sys.modules, f.pyfftw.FFTW.__name__)\n"
            "import scipy.fftpack, dask.array\n"
            "print(scipy.fftpack.fft([1.0, 0.0])[0].real, dask.array.ones(2).sum().compute())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.split("\n")
    assert out[0] == "False False FFTW"
    assert out[1] == "1.0 2.0"


def test_importing_the_cpu_primitives_and_the_planner_leaves_pyfftw_unloaded() -> None:
    """pyFFTW is imported when the first FFT is planned, not by `import znni.primitives.cpu`
    nor by the planner, which imports the CPU primitives' cost constants at module level."""
    import subprocess
    import sys

    code = ("import sys, znni.primitives.cpu, znni.planner.search, znni.planner.graph.search\n"
            "print('pyfftw' in sys.modules)\n"
            "from znni.primitives.cpu.fftw_plans import fftw\n"
            "print(fftw().FFTW.__name__, 'pyfftw' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=120).stdout.split("\n")
    assert out[0] == "False"
    assert out[1] == "FFTW True"
