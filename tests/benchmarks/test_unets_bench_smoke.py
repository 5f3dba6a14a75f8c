"""benchmarks/unets.py on a tiny BasicUNet: every whole process (`znni segment`, a MONAI
user's script on torch, onnxruntime and OpenVINO) runs from Zarr to Zarr, and its row
reports its time, its loop and its output's difference from MONAI on torch."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "unets.py"
ROW = re.compile(r"^(?P<label>.+?)\s+(?P<s>[0-9.]+)\s+(?P<loop>[0-9.]+)\s+[0-9,]+\s+[0-9.]+Gi"
                 r"\s+[0-9.]+x\s+(?P<max>[0-9.e+-]+) / (?P<mean>[0-9.e+-]+), "
                 r"(?P<labels>[0-9.]+)%$")


@pytest.mark.slow
def test_unets_benchmark_whole_processes(tmp_path: Path) -> None:
    for module in ("torch", "monai", "onnxruntime", "openvino"):
        pytest.importorskip(module)
    done = subprocess.run(
        [sys.executable, str(BENCH), "--size", "40", "--window", "32", "--reps", "1",
         "--features", "4,4,8,8,16,4", "--no-auto", "--no-bf16", "--no-int8"],
        capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {m["label"].strip(): m for line in done.stdout.splitlines()
            if (m := ROW.match(line))}
    assert set(rows) == {"znni segment (same window)", "MONAI on torch",
                         "MONAI + onnxruntime", "MONAI + OpenVINO f32"}, done.stdout
    for label, row in rows.items():
        # its times are reported as numbers (their size is the benchmark's, not a test's)
        assert math.isfinite(float(row["s"])) and math.isfinite(float(row["loop"])), label
        assert float(row["max"]) < 1e-4, (label, done.stdout)  # fp32, the same windows
    assert "znni segment (same window) vs MONAI + OpenVINO f32:" in done.stdout
