"""Train issue 53's test U-Net on the demo's synthetic EM and export it to ONNX.

    .venv/bin/python benchmarks/train_unet.py [--steps 400] [--seed 0]
        [--out benchmarks/networks/trained_unet.onnx]

Why: quantization errors measured on random weights mean nothing (the output's range is
tiny), so int8, bf16 and the other precisions are judged on a network that has learned
something. This one is small and quick to train on a CPU: MONAI's `BasicUNet(features=
FEATURES)` (instance norm, LeakyReLU, padded 3^3 convs, transposed-conv upsampling) with a
sigmoid, so its output is a membrane probability in [0, 1] and the sigmoid is in the graph.

Data: `znni.cli.demo_data.synthetic_em` volumes of the demo's shape (64, 192, 192);
targets are their true membrane masks. Training volumes use seeds 1 and 2, validation
the demo's own volume (seed 0), so it is held out. The input is fed as znni feeds it with
`--scale 0.00392156862745098` (1/255): uint8 cast to float32 times float32(1/255).

Training: random 32x64x64 crops (batch 2; z is 3x coarser, so about cubic in space;
a quarter of a window's voxels, for 4x the steps), BCE + soft Dice on the logits, Adam
with a cosine schedule, seeded (torch, numpy, deterministic algorithms, 2 threads). At
the end: the validation F1 of (output > 0.5) against the true mask over the whole
volume, run as `znni segment` runs it by default (64^3 windows, overlap 0.25, Gaussian
blending; here MONAI's `sliding_window_inference`), next to an intensity-threshold
baseline.

Export: TorchScript exporter, opset 17, input "x" with dynamic spatial axes (a windowed
model in znni: instance norm over each window). The training record (seed, steps,
seconds, F1, torch version, command) is stored in the ONNX file's metadata_props; run it
in znni as

    znni segment benchmarks/networks/trained_unet.onnx em.zarr/raw out.zarr \
        --window 64,64,64 --scale 0.00392156862745098
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

FEATURES = (8, 8, 16, 16, 32, 8)
CROP = 64  # the window it is exported and validated at
TRAIN_CROP = (32, 64, 64)  # a quarter of a window's voxels: 4x the steps per second
SCALE = np.float32(1 / 255)  # what `--scale 0.00392156862745098` multiplies by in znni
TRAIN_SEEDS = (1, 2)
VAL_SEED = 0  # the demo's own volume
OUT = Path(__file__).resolve().parent / "networks" / "trained_unet.onnx"


def make_net(features: tuple[int, ...] = FEATURES) -> Any:
    """BasicUNet (1 -> 1 channel) producing logits; the sigmoid is added for export."""
    from monai.networks.nets import BasicUNet

    with contextlib.redirect_stdout(open(os.devnull, "w")):  # it prints its features
        return BasicUNet(spatial_dims=3, in_channels=1, out_channels=1, features=features)


def volume(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(float32 input as znni feeds it, float32 membrane target) of one synthetic volume."""
    from znni.cli.demo_data import synthetic_em

    image, membrane = synthetic_em(seed=seed)
    return image.astype(np.float32) * SCALE, membrane.astype(np.float32)


def crops(rng: np.random.Generator, vols: list[tuple[np.ndarray, np.ndarray]], batch: int
          ) -> tuple[np.ndarray, np.ndarray]:
    """`batch` random TRAIN_CROP (input, target) pairs, each from a random volume."""
    xs, ys = [], []
    for _ in range(batch):
        x, y = vols[int(rng.integers(len(vols)))]
        lo = [int(rng.integers(0, s - c + 1)) for s, c in zip(x.shape, TRAIN_CROP, strict=True)]
        box = tuple(slice(a, a + c) for a, c in zip(lo, TRAIN_CROP, strict=True))
        xs.append(x[box])
        ys.append(y[box])
    return np.stack(xs)[:, None], np.stack(ys)[:, None]


def loss_fn(logits: Any, target: Any) -> Any:
    """BCE plus soft Dice: BCE for calibrated probabilities, Dice against the class
    imbalance (membranes are a minority of voxels)."""
    import torch

    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, target)
    p = torch.sigmoid(logits)
    dice = 1 - (2 * (p * target).sum() + 1) / (p.sum() + target.sum() + 1)
    return bce + dice


def train(net: Any, vols: list[tuple[np.ndarray, np.ndarray]], steps: int, seed: int,
          batch: int, lr: float, every: int) -> float:
    """Adam on random crops; prints the mean loss every `every` steps. Returns seconds."""
    import torch

    rng = np.random.default_rng(seed)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps, eta_min=lr / 20)
    net.train()
    t0, running = time.perf_counter(), 0.0
    for step in range(1, steps + 1):
        x, y = crops(rng, vols, batch)
        loss = loss_fn(net(torch.from_numpy(x)), torch.from_numpy(y))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        running += loss.item()
        if step % every == 0 or step == steps:
            n = every if step % every == 0 else step % every
            print(f"step {step:4d}  loss {running / n:.4f}  {time.perf_counter() - t0:6.1f} s",
                  flush=True)
            running = 0.0
    net.eval()
    return time.perf_counter() - t0


def predict(model: Any, x: np.ndarray) -> np.ndarray:
    """Membrane probabilities over a whole volume, as `znni segment --window 64,64,64`
    computes them by default (overlap 0.25, Gaussian blending, sigma 0.125 W)."""
    import torch
    from monai.inferers import sliding_window_inference

    with torch.no_grad():
        out = sliding_window_inference(torch.from_numpy(x)[None, None], (CROP,) * 3, 1, model,
                                       overlap=0.25, mode="gaussian", sigma_scale=0.125)
    return out[0, 0].numpy()


def f1(pred: np.ndarray, truth: np.ndarray) -> float:
    """F1 (Dice) of two boolean masks."""
    tp = float(np.count_nonzero(pred & truth))
    return 2 * tp / max(1.0, float(np.count_nonzero(pred) + np.count_nonzero(truth)))


def export(model: Any, path: Path, meta: dict[str, str]) -> None:
    """TorchScript export, opset 17, dynamic spatial axes; `meta` into metadata_props."""
    import onnx
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.redirect_stderr(open(os.devnull, "w")):  # the exporter's warnings
        torch.onnx.export(model, (torch.zeros(1, 1, CROP, CROP, CROP),), path,
                          input_names=["x"], output_names=["membranes"], opset_version=17,
                          dynamo=False, dynamic_axes={"x": {2: "z", 3: "y", 4: "x"}})
    proto = onnx.load(str(path))
    proto.doc_string = "issue 53's test U-Net: membrane probabilities of the demo's synthetic EM"
    onnx.helper.set_model_props(proto, meta)
    onnx.save(proto, str(path))


def check_onnx(path: Path, model: Any, x: np.ndarray) -> float:
    """Max |onnxruntime - torch| on one window: the export computes what was trained."""
    import onnxruntime as ort
    import torch

    win = x[None, None, :CROP, :CROP, :CROP].copy()
    ref = ort.InferenceSession(str(path)).run(None, {"x": win})[0]
    with torch.no_grad():
        got = model(torch.from_numpy(win)).numpy()
    return float(np.max(np.abs(ref - got)))


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--out", type=Path, default=OUT)
    return p.parse_args()


def main() -> None:
    import torch

    args = parse()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    t0 = time.perf_counter()
    vols = [volume(s) for s in TRAIN_SEEDS]
    x_val, y_val = volume(VAL_SEED)
    print(f"data: {len(vols)} training volumes {vols[0][0].shape} + 1 validation, "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    net = make_net()
    seconds = train(net, vols, args.steps, args.seed, args.batch, args.lr, args.every)
    model = torch.nn.Sequential(net, torch.nn.Sigmoid()).eval()
    truth = y_val > 0.5
    score = f1(predict(model, x_val) > 0.5, truth)
    baseline = f1(x_val < np.float32(110 / 255), truth)  # dark voxels are membrane
    print(f"validation F1 {score:.4f} (seed {VAL_SEED}; intensity < 110 baseline "
          f"{baseline:.4f}; membranes {truth.mean():.1%} of voxels)")
    meta = {"seed": str(args.seed), "steps": str(args.steps), "batch": str(args.batch),
            "train_seconds": f"{seconds:.1f}", "validation_f1": f"{score:.4f}",
            "features": ",".join(map(str, FEATURES)), "torch": torch.__version__,
            "cpu": platform.processor() or platform.machine(), "threads": str(args.threads),
            "input_scale": "1/255", "command": " ".join(["benchmarks/train_unet.py",
                                                          *sys.argv[1:]])}
    export(model, args.out, meta)
    err = check_onnx(args.out, model, x_val)
    print(f"training {seconds:.1f} s, total {time.perf_counter() - t0:.1f} s; "
          f"{args.out} {args.out.stat().st_size / 1024:.0f} KiB, onnxruntime vs torch {err:.1e}")


if __name__ == "__main__":
    main()
