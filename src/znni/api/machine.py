"""What `GET /v1/machine` reports: CPU, memory, GPUs, worker processes, from /proc and
nvidia-smi (never CuPy: the API process stays free of the GPU stack).

nvidia-smi takes tens of milliseconds (seconds on a busy GPU), so it runs in a thread of its
own and its answer is kept for `GPU_TTL_S`: a dashboard polling from several tabs costs one
call per period, and a request never waits for it but the first (a stale answer is served
while the next is read).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

GPU_TTL_S = 5.0
GPU_QUERY_TIMEOUT_S = 5.0
GPU_QUERY = "index,name,memory.total,memory.used,utilization.gpu"
MIB = 1024 * 1024

_gpu_lock = threading.Lock()
_gpu_cache: tuple[float, list[dict[str, Any]]] = (-1e9, [])
_gpu_reading: threading.Event | None = None  # set when the read in flight has finished


def machine_info(worker_pids: list[int]) -> dict[str, Any]:
    """The machine fields of `MachineRead` (the caller adds workers and queue counts)."""
    mem = _meminfo()
    try:
        load: float | None = os.getloadavg()[0]
    except OSError:
        load = None
    workers_rss = [_rss(pid) for pid in worker_pids]
    return {
        "hostname": os.uname().nodename,
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count() or 1,
        "load_1m": load,
        "memory_total_bytes": mem.get("MemTotal"),
        "memory_available_bytes": mem.get("MemAvailable"),
        "server_rss_bytes": _rss(os.getpid()),
        "workers_rss_bytes": sum(r for r in workers_rss if r is not None) if worker_pids else 0,
        "gpus": gpus(),
    }


def _meminfo() -> dict[str, int]:
    """/proc/meminfo in bytes ({} where there is none)."""
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        fields = rest.split()
        if fields and fields[0].isdigit():
            out[name] = int(fields[0]) * 1024  # kB
    return out


def _cpu_model() -> str | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip() or None
    return None


def _rss(pid: int) -> int | None:
    """A process's resident memory in bytes (None once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return None


def gpus() -> list[dict[str, Any]]:
    """The CUDA devices as nvidia-smi sees them ([] without one): the last answer, read
    again in the background once it is GPU_TTL_S old; the first call waits for it."""
    global _gpu_reading
    with _gpu_lock:
        at, found = _gpu_cache
        reading = _gpu_reading
        if time.monotonic() - at >= GPU_TTL_S and reading is None:
            reading = _gpu_reading = threading.Event()
            threading.Thread(target=_read_gpus, args=(reading,), daemon=True).start()
    if at < 0 and reading is not None:  # nothing read yet: wait for the first answer
        reading.wait(GPU_QUERY_TIMEOUT_S + 1.0)
        with _gpu_lock:
            found = _gpu_cache[1]
    return found


def _read_gpus(done: threading.Event) -> None:
    global _gpu_cache, _gpu_reading
    found = _query_gpus()
    with _gpu_lock:
        _gpu_cache = (time.monotonic(), found)
        _gpu_reading = None
    done.set()


def _query_gpus() -> list[dict[str, Any]]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        run = subprocess.run(
            [exe, f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=GPU_QUERY_TIMEOUT_S, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    if run.returncode != 0:
        return []
    return [g for g in map(parse_gpu_line, run.stdout.splitlines()) if g is not None]


def parse_gpu_line(line: str) -> dict[str, Any] | None:
    """One line of nvidia-smi's CSV ('0, NVIDIA H100, 81559, 1024, 3'); None if malformed."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 5:
        return None
    index, name, total, used, util = parts
    try:
        return {
            "index": int(index),
            "name": name,
            "memory_total_bytes": int(float(total) * MIB),
            "memory_used_bytes": int(float(used) * MIB),
            "utilization_percent": float(util) if _number(util) else None,
        }
    except ValueError:
        return None


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
