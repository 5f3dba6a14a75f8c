"""The backend warns when an inherited OPENBLAS_CORETYPE pins pre-AVX-512 GEMM kernels."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from znni.primitives.cpu.threads import forced_blas_note

AVX512 = {"fma", "avx2", "avx512f", "avx512bw"}


def test_note_only_when_forced_to_older_kernels_on_avx512() -> None:
    note = forced_blas_note("Haswell", "Haswell", AVX512)
    assert note is not None and "OPENBLAS_CORETYPE=Haswell" in note
    assert forced_blas_note("Haswell", None, AVX512) is None  # OpenBLAS's own choice
    assert forced_blas_note("SkylakeX", "SkylakeX", AVX512) is None
    assert forced_blas_note("Haswell", "Haswell", {"fma", "avx2"}) is None  # no AVX-512 to miss
    assert forced_blas_note(None, "Haswell", AVX512) is None  # no OpenBLAS loaded


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return set(
        next(
            (ln.split(":", 1)[1].split() for ln in text.splitlines() if ln.startswith("flags")), []
        )
    )


def _backend_log(coretype: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    if coretype is not None:
        env["OPENBLAS_CORETYPE"] = coretype
    code = (
        "import logging; logging.basicConfig(); from znni.primitives.cpu import CpuBackend;"
        "CpuBackend(threads=1, persist_choices=False).close()"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    return run.stderr


@pytest.mark.skipif("avx512f" not in _cpu_flags(), reason="needs an AVX-512 CPU")
def test_backend_warns_on_forced_haswell_and_not_on_detection() -> None:
    assert "pins OpenBLAS to Haswell kernels" in _backend_log("Haswell")
    assert "OPENBLAS_CORETYPE" not in _backend_log(None)
