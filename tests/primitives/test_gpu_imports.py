"""Importing the GPU graph code needs neither pyFFTW nor the CPU backend."""

from __future__ import annotations

import subprocess
import sys

GPU_GRAPH_MODULES = [
    "znni.primitives.gpu.conv_dispatch",
    "znni.primitives.gpu.conv_spec",
    "znni.primitives.gpu.cudnn_conv",
    "znni.primitives.gpu.cudnn_standin",
    "znni.primitives.gpu.cufft_conv",
    "znni.primitives.gpu.gemm_loop",
    "znni.primitives.gpu.pinned_pool",
    "znni.primitives.gpu.cupy_device",
    "znni.primitives.gpu.device",
    "znni.primitives.gpu.graph_kernels",
    "znni.primitives.gpu.graph_device",
    "znni.primitives.gpu.backend",
]

PROBE = """
import importlib, sys
sys.modules["pyfftw"] = None  # any `import pyfftw` now raises ImportError
for name in sys.argv[1:]:
    importlib.import_module(name)
bad = sorted(m for m in sys.modules if m.startswith("znni.primitives.cpu"))
print(",".join(bad))
"""


def test_gpu_graph_code_imports_without_pyfftw_or_the_cpu_backend():
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *GPU_GRAPH_MODULES],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"CPU modules imported: {done.stdout.strip()}"


def test_running_a_conv_on_the_stand_in_imports_no_cpu_code():
    probe = PROBE.replace("print(", "_run(); print(").replace(
        "bad = sorted", """def _run():
    import numpy as np
    from znni.primitives.gpu.conv_dispatch import GPU_CONV_PRIMITIVES, device_conv
    from znni.primitives.gpu.device import HostDevice
    dev = HostDevice(2**26)
    x = np.ones((1, 2, 5, 5, 5), np.float32)
    p = {"weight": np.ones((3, 2, 2, 2, 2), np.float32), "bias": None, "strides": (1, 1, 1),
         "pads": (0,) * 6, "dilations": (1, 1, 1), "group": 1}
    for prim in GPU_CONV_PRIMITIVES:
        dev.free(device_conv(dev, prim, x, p, key="k"))
bad = sorted""")
    done = subprocess.run(
        [sys.executable, "-c", probe, "znni.primitives.gpu.conv_dispatch"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"CPU modules imported: {done.stdout.strip()}"
