"""`make test-gpu`'s gate (tests/conftest.py): with ZNNI_REQUIRE_GPU=1 a session without a
CUDA device stops with exit 1 and one line, and a skipped gpu test counts as a failure."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

# the marker by getattr, so that `make test-gpu`'s grep for gpu test files skips this one
SKIPPING = '''
import pytest

GPU = getattr(pytest.mark, "gpu")

@GPU
def test_gpu_that_skips():
    pytest.skip("no cupy here")

@GPU
def test_gpu_that_passes():
    pass

def test_not_gpu_may_skip():
    pytest.skip("fine")
'''


def _pytest(tmp: Path, *args: str, require: str = "1") -> subprocess.CompletedProcess[str]:
    (tmp / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs a CUDA device\n")
    (tmp / "test_skipping.py").write_text(SKIPPING)
    env = {**os.environ, "ZNNI_REQUIRE_GPU": require, "PYTHONPATH": os.pathsep.join(
        [str(tmp), str(TESTS), os.environ.get("PYTHONPATH", "")])}
    env.pop("ZNNI_GPU_STANDIN", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
           *args, "-p", "conftest", "--rootdir", str(tmp), "-c", str(tmp / "pytest.ini"),
           str(tmp / "test_skipping.py")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=tmp)


def test_no_device_stops_the_session_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "nocuda.py").write_text(
        "from znni.primitives.gpu import cupy_device\n"
        "def _none():\n    raise ValueError('no CUDA device was found (test)')\n"
        "cupy_device.require_cuda = _none\n")
    done = _pytest(tmp_path, "-p", "nocuda")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "GPU tests need CuPy and a visible CUDA device" in done.stdout + done.stderr
    assert "passed" not in done.stdout


def test_a_skipped_gpu_test_fails(tmp_path: Path) -> None:
    (tmp_path / "fakecuda.py").write_text(
        "from znni.primitives.gpu import cupy_device\ncupy_device.require_cuda = lambda: None\n")
    done = _pytest(tmp_path, "-p", "fakecuda", "-rA")
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "1 failed, 1 passed, 1 skipped" in out, out
    assert "ZNNI_REQUIRE_GPU=1: a GPU test may not skip (" in out
    quiet = _pytest(tmp_path, "-p", "fakecuda", require="0")  # without the gate: skips stay
    assert quiet.returncode == 0 and "1 passed, 2 skipped" in quiet.stdout, quiet.stdout
