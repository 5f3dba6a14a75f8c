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


THRESHOLD = """
import sys
import numpy as np
from znni.primitives.cpu.heap import SEQUENTIAL_MMAP_THRESHOLD_BYTES, keep_freed_memory
keep_freed_memory(*([SEQUENTIAL_MMAP_THRESHOLD_BYTES] if sys.argv[1] == "seq" else []))
keep_freed_memory()  # a later call (the backend's) keeps the first threshold
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
a = np.ones(2**25, np.float32)  # 128 MiB, touched
before = rss()
del a
print(before - rss() > 2**26)  # its pages went back to the system on free
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_a_sequential_pass_returns_its_large_tensors_and_windows_keep_theirs() -> None:
    """Sequential workers take the lower mmap threshold first (workers/mpf.py): a freed
    128 MiB tensor leaves the process; at the windows' 1 GiB threshold it stays."""
    def freed(kind: str) -> str:
        return subprocess.run([sys.executable, "-c", THRESHOLD, kind], capture_output=True,
                              text=True, check=True).stdout.strip()

    assert freed("seq") == "True" and freed("window") == "False"
