"""The heap setting that lets windows reuse freed tensor pages (primitives/cpu/heap)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

CODE = "from znni.primitives.cpu.heap import keep_freed_memory as k; print(k(), k())"


def _run(env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "ZNNI_KEEP_HEAP"}
    if env_value is not None:
        env["ZNNI_KEEP_HEAP"] = env_value
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True,
                          env=env, check=True)
    return done.stdout.strip()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_takes_the_thresholds_once_and_the_switch_turns_it_off() -> None:
    assert _run(None) == "True True"
    assert _run("0") == "False False"


def test_a_heavy_run_with_the_heap_kept_gives_the_same_numbers() -> None:
    """Reused pages hold old values: results must not depend on fresh (zeroed) memory."""
    import numpy as np

    from znni.primitives.backends import make_backend

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 4, 40, 40, 40)).astype(np.float32)
    w = rng.standard_normal((4, 4, 3, 3, 3)).astype(np.float32)
    b = np.zeros(4, np.float32)
    backend = make_backend("cpu")
    first = backend.conv3d(x, w, b, None, "winograd")
    garbage = [np.full(2**24, np.nan, np.float32) for _ in range(4)]  # freed, reused below
    del garbage
    again = backend.conv3d(x, w, b, None, "winograd")
    assert np.array_equal(first, again) and np.isfinite(again).all()
