"""Reference outputs: four `znni segment` runs whose outputs must stay byte-equal across a
refactor (issue 50: n337, n726, a BasicUNet ONNX, a valid U-Net).

`prepare DIR` writes the inputs once (seeded volumes, seeded weights, the ONNX exports);
`run DIR OUT.json` runs the four jobs as a user types them and records, per run, the
SHA-256 of the decoded output array and of every stored chunk object (metadata files,
which carry the provenance's version and timings, and the ledger, which holds times, are
left out) and the plan's
primitives; `compare A.json B.json` says which differ. Plans come from this machine's
cached calibration, so compare runs made on one machine with one cache.
Run: `python benchmarks/reference_outputs.py prepare /tmp/ref && ... run /tmp/ref a.json`.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(HERE))

# name -> (model file in DIR, extra `znni segment` options)
RUNS: dict[str, tuple[str, list[str]]] = {
    "n337": ("n337.json", ["--block", "32,32,32"]),
    "n726": ("n726.json", ["--block", "32,32,32", "--border", "zero"]),
    "basicunet": ("basicunet.onnx", ["--window", "16,32,32", "--overlap", "0.25",
                                     "--scale", "0.0039215686"]),
    "validunet": ("validunet.onnx", ["--window", "12,24,24", "--scale", "0.0039215686",
                                     "--dtype", "uint8"]),
}
SHAPE = (40, 48, 56)


def _spec_with_weights(name: str, out: Path) -> None:
    from networks import he_params

    spec = json.loads((HERE / "networks" / f"{name}.json").read_text())
    params = he_params(spec, seed=7)
    spec["weights"] = f"{name}.npz"
    spec["input"] = {"scale": 1 / 255, "shift": 0.0}
    np.savez(out / f"{name}.npz", **params)
    (out / f"{name}.json").write_text(json.dumps(spec))


def prepare(out: Path) -> None:
    import zarr
    from support.onnx_models import MODELS, export

    out.mkdir(parents=True, exist_ok=True)
    vol = np.random.default_rng(3).integers(0, 256, SHAPE, dtype=np.uint8)
    arr = zarr.create_array(store=str(out / "em.zarr"), shape=SHAPE, chunks=(16, 16, 16),
                            dtype="uint8", zarr_format=3)
    arr[...] = vol
    for name in ("n337", "n726"):
        _spec_with_weights(name, out)
    for name in ("basicunet", "validunet"):
        build, window = MODELS[name]
        export(build(), out / f"{name}.onnx", window)


def _digest(path: Path) -> dict[str, object]:
    import zarr

    arr = zarr.open_array(str(path), mode="r")
    chunks = sorted(p for p in path.rglob("*") if p.is_file() and p.name not in
                    ("zarr.json", ".zarray", ".zattrs", ".zgroup")
                    and not p.name.startswith("znni-ledger"))  # the ledger holds times
    h = hashlib.sha256()
    for p in chunks:
        h.update(str(p.relative_to(path)).encode())
        h.update(p.read_bytes())
    plan = arr.attrs.get("znni", {}).get("plan", {})
    return {"array": hashlib.sha256(np.ascontiguousarray(arr[...]).tobytes()).hexdigest(),
            "chunks": h.hexdigest(), "n_chunks": len(chunks), "dtype": str(arr.dtype),
            "shape": list(arr.shape),
            "primitives": plan.get("primitives") if isinstance(plan, dict) else None}


def run(folder: Path, out_json: Path) -> None:
    results = {}
    for name, (model, extra) in RUNS.items():
        out = folder / "out" / f"{name}.zarr"
        subprocess.run(["rm", "-rf", str(out)], check=True)
        cmd = [sys.executable, "-m", "znni.cli", "segment", str(folder / model),
               str(folder / "em.zarr"), str(out), "--device", "cpu", "--memory-limit", "4GiB",
               "--quiet", *extra]
        subprocess.run(cmd, check=True)
        results[name] = _digest(out)
        print(name, results[name]["array"][:16], results[name]["chunks"][:16], flush=True)
    out_json.write_text(json.dumps(results, indent=1))


def compare(a: Path, b: Path) -> int:
    ra, rb = json.loads(a.read_text()), json.loads(b.read_text())
    bad = [n for n in RUNS if ra.get(n, {}).get("array") != rb.get(n, {}).get("array")
           or ra.get(n, {}).get("chunks") != rb.get(n, {}).get("chunks")]
    for n in RUNS:
        print(f"{n:10s} {'DIFFERENT' if n in bad else 'byte-equal'}")
    return 1 if bad else 0


if __name__ == "__main__":
    verb, *args = sys.argv[1:]
    if verb == "prepare":
        prepare(Path(args[0]))
    elif verb == "run":
        run(Path(args[0]), Path(args[1]))
    elif verb == "compare":
        sys.exit(compare(Path(args[0]), Path(args[1])))
    else:
        sys.exit(f"unknown verb {verb}; prepare DIR | run DIR OUT.json | compare A B")
