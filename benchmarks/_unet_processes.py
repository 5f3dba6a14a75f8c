"""Whole processes for benchmarks/unets.py: `znni segment` and a MONAI user's script,
each timed from its start to its exit with its own peak RSS.

The wall time is taken by a small stdlib-only launcher (`python -S`), which starts the
command and reads its children's resource usage: a child's ru_maxrss starts from the
memory of the process that forked it, so the launcher, not the benchmark (which holds
torch and the volume), is that process; its ~10 MB are the floor of every figure.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

USER_SCRIPT = Path(__file__).with_name("_monai_user.py")
LAUNCHER = """
import json, resource, subprocess, sys, time
t0 = time.perf_counter()
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
out, err = p.communicate()
seconds = time.perf_counter() - t0
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps({"seconds": seconds, "rss_bytes": rss, "rc": p.returncode,
                  "stdout": out, "stderr": err[-4000:]}))
"""


def timed(cmd: list[str]) -> dict:
    """Run `cmd` to its exit: {"seconds", "rss_bytes", "stdout"}; RuntimeError if it fails."""
    done = subprocess.run([sys.executable, "-S", "-c", LAUNCHER, *cmd], stdout=subprocess.PIPE,
                          text=True, check=True)
    result = json.loads(done.stdout)
    if result["rc"] != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} ... failed (exit {result['rc']}):\n"
                           f"{result['stderr']}")
    return result


def znni_command(folder: Path, out: Path, window: int | None, overlap: float, limit: str,
                 precision: str, extra: tuple[str, ...] = ()) -> list[str]:
    """`znni segment` as a user types it (the console script beside this Python)."""
    exe = Path(sys.executable).with_name("znni")
    head = [str(exe)] if exe.exists() else [shutil.which("znni") or "znni"]
    cmd = [*head, "segment", str(folder / "basicunet.onnx"), str(folder / "in.zarr"),
           str(out), "--scale", repr(1 / 255), "--overlap", str(overlap), "--overwrite",
           "--memory-limit", limit, "--precision", precision, *extra]
    return cmd + (["--window", f"{window},{window},{window}"] if window else [])


def run_znni(folder: Path, tag: str, window: int | None, overlap: float, limit: str,
             precision: str, extra: tuple[str, ...] = ()) -> dict:
    """The whole process, and the job's own seconds from its report line."""
    out = folder / f"{tag}.zarr"
    result = timed(znni_command(folder, out, window, overlap, limit, precision, extra))
    job = re.search(r"the blocks in ([0-9.]+) s", result["stderr"])  # its report line
    return {"seconds": result["seconds"], "rss_bytes": result["rss_bytes"],
            "inner_seconds": float(job.group(1)) if job else float("nan"), "output": str(out)}


def run_user(folder: Path, tag: str, runtime: str, precision: str, window: int,
             overlap: float, kind: str, features: str) -> dict:
    """A MONAI user's whole process (benchmarks/_monai_user.py)."""
    out = folder / f"{tag}.zarr"
    result = timed([sys.executable, str(USER_SCRIPT), str(folder), str(folder / "in.zarr"),
                    str(out), "--runtime", runtime, "--precision", precision, "--window",
                    str(window), "--overlap", str(overlap), "--model", kind,
                    "--features", features])
    inner = json.loads(result["stdout"].strip().splitlines()[-1])
    return {"seconds": result["seconds"], "rss_bytes": result["rss_bytes"],
            "inner_seconds": inner["loop_seconds"], "setup_seconds": inner["setup_seconds"],
            "output": str(out)}
