"""Network benchmark: dense output voxels/s of znni (CpuBackend, MPF) vs PyTorch and reference.

The four ZNNi networks (benchmarks/networks/*.json, random weights written to
a temp dir at run time) run densely over one patch. The peer is the
dense-equivalent PyTorch network on the same patch: every maxpool a stride-1
max filter, later convs dilated by the product of earlier pool windows.
Run: `python benchmarks/networks.py` or `znni bench networks [--quick]`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import tracemalloc
from math import prod
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt_ratio, median_s, print_table, torch_or_none  # noqa: E402

HERE = Path(__file__).resolve().parent / "networks"
NETS = ("n337", "n537", "n726", "n926")
# Dense output edge per network: the largest we could afford on 2 busy cores (see --output).
DEFAULT_OUTPUT = {"n337": 24, "n537": 8, "n726": 12, "n926": 4}
SLOW_S = 20.0  # a peer run longer than this is timed once
TORCH_FLOPS_PER_S = 1.2e11  # only to skip a peer run that would take longer than the budget


def load_random(name: str, tmp: Path):
    """The spec with He-initialised random weights written next to a copy of it."""
    from znni.planner import load_network

    spec = json.loads((HERE / f"{name}.json").read_text())
    rng = np.random.default_rng(0)
    params, cin = {}, spec["in_channels"]
    for i, layer in enumerate(spec["layers"]):
        if layer["kind"] == "conv":
            shape = (layer["out_channels"], cin, *layer["kernel"])
            std = np.sqrt(2.0 / prod(shape[1:]))
            params[f"{i}.weight"] = (std * rng.standard_normal(shape)).astype(np.float32)
            params[f"{i}.bias"] = (0.01 * rng.standard_normal(shape[0])).astype(np.float32)
            cin = shape[0]
    (tmp / f"{name}.json").write_text(json.dumps(spec))
    np.savez(tmp / spec["weights"], **params)
    return load_network(tmp / f"{name}.json"), spec, params


def torch_dense(torch, spec: dict, params: dict):
    """The dense-equivalent PyTorch network (stride-1 dilated max filters and convs)."""
    nn = torch.nn
    mods, dil, cin = [], 1, spec["in_channels"]
    for i, layer in enumerate(spec["layers"]):
        kind = layer["kind"]
        if kind == "conv":
            conv = nn.Conv3d(cin, layer["out_channels"], layer["kernel"], dilation=dil)
            conv.weight.data = torch.from_numpy(params[f"{i}.weight"])
            conv.bias.data = torch.from_numpy(params[f"{i}.bias"])
            mods.append(conv)
            cin = layer["out_channels"]
        elif kind == "maxpool":
            mods.append(nn.MaxPool3d(layer["window"], stride=1, dilation=dil))
            dil *= layer["window"][0]
        else:
            mods.append(nn.ReLU())
    return nn.Sequential(*mods).eval()


def torch_flops(net, size) -> float:
    return sum(
        2.0 * s.channels_in * s.channels_out * prod(s.kernel) * prod(s.size_out) * s.batch_in
        for s in net.layer_shapes(size)
        if s.kind == "conv"
    )


def torch_slabbed_s(torch, spec: dict, params: dict, size, budget_s: float) -> float:
    """Seconds of the dense-equivalent torch network, each layer timed on a z-slab.

    Used when the whole network would take longer than the budget: every layer runs
    on random input of its true (y, x) extent but only as many output z-planes as the
    budget allows (at least one), and its time is scaled by (all planes / timed planes).
    A conv or max filter costs the same per output plane, so this is an honest
    per-voxel normalisation of the same work, not a model.
    """
    nn, f = torch.nn, torch.nn.functional
    n, dil, cin, total = list(size), 1, spec["in_channels"], 0.0
    convs = sum(layer["kind"] == "conv" for layer in spec["layers"])
    for i, layer in enumerate(spec["layers"]):
        if layer["kind"] == "relu":
            continue
        k = layer["kernel"] if layer["kind"] == "conv" else layer["window"]
        out = [a - dil * (kk - 1) for a, kk in zip(n, k, strict=True)]
        cout = layer["out_channels"] if layer["kind"] == "conv" else cin
        plane_flops = 2.0 * cin * cout * prod(k) * out[1] * out[2]
        planes = int(max(1, min(out[0], budget_s / convs * TORCH_FLOPS_PER_S / plane_flops)))
        x = torch.randn(1, cin, planes + dil * (k[0] - 1), n[1], n[2])
        if layer["kind"] == "conv":
            w, b = torch.from_numpy(params[f"{i}.weight"]), torch.from_numpy(params[f"{i}.bias"])
            run = lambda x=x, w=w, b=b, d=dil: torch.relu(f.conv3d(x, w, b, dilation=d))  # noqa: E731
        else:
            pool = nn.MaxPool3d(k, stride=1, dilation=dil)
            run = lambda x=x, pool=pool: pool(x)  # noqa: E731
        with torch.inference_mode():
            total += median_s(run, 1, warmup=1) * out[0] / planes
        n, cin = out, cout
        if layer["kind"] == "maxpool":
            dil *= k[0]
    return total


def bench_net(name: str, args, torch) -> list[str]:
    from znni.primitives import ReferenceBackend, dense_forward
    from znni.primitives.cpu import CpuBackend

    with tempfile.TemporaryDirectory() as tmp:
        net, spec, params = load_random(name, Path(tmp))
    p = net.pool_product[0]
    edge = args.output or (p if args.quick else DEFAULT_OUTPUT[name])
    size = net.input_size_for((edge, edge, edge))
    out_vox = prod(net.output_size(size))
    x = np.random.default_rng(1).random((1, 1, *size), dtype=np.float32)
    backend = CpuBackend(
        threads=args.threads,
        fft_effort=args.effort,
        spectra_cache_bytes=int(args.spectra_gib * 2**30),
        persist_choices=False,
    )
    tracemalloc.start()
    t0 = time.perf_counter()
    out = dense_forward(net.ops, x, backend)  # plans, spectra, per-layer choice
    first_s = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    t_z = median_s(lambda: dense_forward(net.ops, x, backend), args.reps, warmup=0)
    chosen = sorted(set(backend.chooser.choices.values()))
    backend.close()
    t_t, agree = None, "-"
    if torch is not None and torch_flops(net, size) / TORCH_FLOPS_PER_S <= args.torch_budget_s:
        model = torch_dense(torch, spec, params)
        tx = torch.from_numpy(x)
        with torch.inference_mode():
            t0 = time.perf_counter()
            ref = model(tx).numpy()
            t_t = time.perf_counter() - t0
            if t_t <= SLOW_S:
                t_t = median_s(lambda: model(tx), args.reps, warmup=0)
        agree = "yes" if np.abs(out - ref).max() <= 1e-4 * max(1.0, np.abs(ref).max()) else "NO"
    elif torch is not None:  # too slow whole: the same network per layer on z-slabs, scaled
        t_t = torch_slabbed_s(torch, spec, params, size, args.torch_budget_s)
        agree = "slabs"
    t_r = None
    if args.reference:
        t_r = median_s(lambda: dense_forward(net.ops, x, ReferenceBackend()), 1, warmup=0)
    rate = lambda t: "-" if t is None else f"{out_vox / t:,.0f}"  # noqa: E731
    return [
        name,
        "x".join(map(str, size)),
        f"{edge}^3",
        f"{first_s:.1f}",
        f"{t_z:.2f}",
        rate(t_z),
        rate(t_t),
        rate(t_r),
        fmt_ratio(t_t, t_z),
        fmt_ratio(t_r, t_z),
        f"{peak / 2**30:.2f}",
        agree,
        ",".join(chosen),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smallest valid patches, a smoke run")
    ap.add_argument("--nets", default=None, help="comma-separated names (quick: n337 only)")
    ap.add_argument("--output", type=int, default=None, help="dense output edge (multiple of P)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--effort", default="FFTW_MEASURE")
    ap.add_argument("--spectra-gib", type=float, default=8.0, help="kept spectra bound (16 total)")
    ap.add_argument(
        "--torch-budget-s",
        type=float,
        default=240.0,
        help="skip the PyTorch peer when its model time exceeds this",
    )
    ap.add_argument("--reference", action="store_true", help="also time the (slow) reference")
    args = ap.parse_args(argv)
    torch = torch_or_none()
    if torch is not None:
        torch.set_num_threads(args.threads or len(__import__("os").sched_getaffinity(0)))
    print(
        f"# dense networks, batch 1, torch {torch.__version__ if torch else 'not installed'}, "
        f"{args.effort}; median of {args.reps}; voxels/s of dense output"
    )
    rows = []
    names = args.nets.split(",") if args.nets else (["n337"] if args.quick else list(NETS))
    for name in names:
        rows.append(bench_net(name, args, torch))
        print("  done", name, file=sys.stderr, flush=True)
    print_table(
        [
            "net",
            "input",
            "output",
            "first_s",
            "znni_s",
            "znni vox/s",
            "torch vox/s",
            "ref vox/s",
            "znni/torch",
            "znni/ref",
            "peak GiB",
            "agree",
            "primitives",
        ],
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
