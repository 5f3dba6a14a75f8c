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


ARENAS = """
import ctypes, ctypes.util, os, re, tempfile, threading
import numpy as np
from znni.primitives.cpu.heap import keep_freed_memory
keep_freed_memory()
kept = []
def work():
    kept.append(np.ones(2**20, np.float32))  # malloc'd by this thread
threads = [threading.Thread(target=work) for _ in range(3)]
for t in threads: t.start()
for t in threads: t.join()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.fopen.restype = ctypes.c_void_p
path = tempfile.NamedTemporaryFile(suffix=".xml", delete=False).name
f = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, ctypes.c_void_p(f))
libc.fclose(ctypes.c_void_p(f))
print(len(re.findall(r'<heap nr="', open(path).read())))
os.remove(path)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_worker_threads_allocate_in_the_main_arena() -> None:
    """Each thread's own arena would keep its largest workspace apart from the tensors'
    freed blocks; with the heap kept, every thread shares the one arena."""
    env = {k: v for k, v in os.environ.items() if k != "ZNNI_KEEP_HEAP"}
    done = subprocess.run([sys.executable, "-c", ARENAS], capture_output=True, text=True,
                          env=env, check=True)
    assert done.stdout.strip() == "1"
    done = subprocess.run([sys.executable, "-c", ARENAS], capture_output=True, text=True,
                          env={**env, "ZNNI_KEEP_HEAP": "0"}, check=True)
    assert int(done.stdout.strip()) > 1  # glibc's default: a new arena per thread
