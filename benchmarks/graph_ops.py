"""Graph-op kernels (znni.primitives.cpu.graph_ops) vs PyTorch CPU on U-Net-sized layers.

Medians of `--reps` calls (after one warm-up) per op, torch limited to
`--threads` threads (numpy's BLAS keeps its own default). The ratio is
ours / torch: above 1 means slower than torch. Run: `python benchmarks/graph_ops.py`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from znni.primitives.base import Activation
from znni.primitives.cpu.graph_ops import (
    conv3d,
    conv_transpose3d,
    instance_norm,
    max_pool3d,
    resize3d,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import median_s  # noqa: E402


def cases(torch: Any, rng: np.random.Generator) -> list[tuple[str, Callable, Callable | None]]:
    """(name, ours, torch or None) closures on the same float32 arrays."""
    f32 = np.float32
    x64 = rng.standard_normal((1, 16, 64, 64, 64)).astype(f32)
    w = (rng.standard_normal((16, 16, 3, 3, 3)) * 0.1).astype(f32)
    wd = rng.standard_normal((16, 1, 3, 3, 3)).astype(f32)
    x32 = rng.standard_normal((1, 32, 32, 32, 32)).astype(f32)
    wt = rng.standard_normal((32, 16, 2, 2, 2)).astype(f32)
    x16 = rng.standard_normal((1, 16, 32, 32, 32)).astype(f32)
    b16, s16 = rng.standard_normal(16).astype(f32), rng.standard_normal(16).astype(f32)
    wt16 = rng.standard_normal((16, 16, 2, 2, 2)).astype(f32)
    leaky = Activation("leaky_relu", 0.1)
    ours = [
        ("conv3d 3^3 16->16 64^3 pad 1", lambda: conv3d(x64, w, b16, pads=(1,) * 6)),
        ("depthwise 3^3 16ch 64^3 pad 1", lambda: conv3d(x64, wd, b16, pads=(1,) * 6, groups=16)),
        (
            "conv_transpose k=s=2 32->16 32^3",
            lambda: conv_transpose3d(x32, wt, b16, strides=(2, 2, 2), pads=(0,) * 6),
        ),
        (
            "trilinear x2 16ch 32^3",
            lambda: resize3d(
                x16, (64, 64, 64), mode="linear", coordinate_transformation_mode="half_pixel"
            ),
        ),
        ("instance_norm 16ch 64^3", lambda: instance_norm(x64, s16, b16, 1e-5)),
        # the MONAI block's InstanceNorm -> LeakyReLU, as the engine fuses it
        (
            "instance_norm+leaky_relu 16ch 64^3",
            lambda: instance_norm(x64, s16, b16, 1e-5, activation=leaky),
        ),
        (
            "conv_transpose k=s=2 16->16 32^3",
            lambda: conv_transpose3d(x16, wt16, b16, strides=(2, 2, 2), pads=(0,) * 6),
        ),
        ("max_pool 2^3 16ch 64^3", lambda: max_pool3d(x64, (2, 2, 2), (2, 2, 2))),
    ]
    if torch is None:
        return [(name, fn, None) for name, fn in ours]
    t = {
        k: torch.from_numpy(v)
        for k, v in dict(
            x64=x64, w=w, wd=wd, x32=x32, wt=wt, x16=x16, b16=b16, s16=s16, wt16=wt16
        ).items()
    }
    F = torch.nn.functional
    theirs = [
        lambda: F.conv3d(t["x64"], t["w"], t["b16"], padding=1),
        lambda: F.conv3d(t["x64"], t["wd"], t["b16"], padding=1, groups=16),
        lambda: F.conv_transpose3d(t["x32"], t["wt"], t["b16"], stride=2),
        lambda: F.interpolate(t["x16"], scale_factor=2, mode="trilinear", align_corners=False),
        lambda: F.instance_norm(t["x64"], weight=t["s16"], bias=t["b16"], eps=1e-5),
        lambda: F.leaky_relu(
            F.instance_norm(t["x64"], weight=t["s16"], bias=t["b16"], eps=1e-5), 0.1, inplace=True
        ),
        lambda: F.conv_transpose3d(t["x16"], t["wt16"], t["b16"], stride=2),
        lambda: F.max_pool3d(t["x64"], 2, 2),
    ]
    return [(name, fn, tf) for (name, fn), tf in zip(ours, theirs, strict=True)]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        torch.set_num_threads(args.threads)
    rows = []
    for name, ours, theirs in cases(torch, np.random.default_rng(0)):
        t_ours = median_s(ours, args.reps)
        if theirs is None:
            rows.append((name, f"{t_ours:.4f}", "-", "-"))
            continue
        with torch.inference_mode():
            t_torch = median_s(theirs, args.reps)
        rows.append((name, f"{t_ours:.4f}", f"{t_torch:.4f}", f"{t_ours / t_torch:.2f}"))
    header = ("op", "znni s", "torch s", "ratio")
    widths = [max(len(r[i]) for r in rows + [header]) for i in range(4)]
    for r in [header] + rows:
        print(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )


if __name__ == "__main__":
    main()
