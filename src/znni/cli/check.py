"""`znni check PACKAGE`: a bioimage.io package's test input through znni's engine, compared
with its test output to the package's reproducibility tolerance.

The test input becomes a temporary Zarr volume that `segment` runs on the CPU in fp32
(one window, the smallest on the model's grid that holds it), with the package's
preprocessing (statistics over the test input, the whole sample) and postprocessing.
A voxel mismatches when |ours - expected| > atol + rtol * |expected| (numpy's
assert_allclose, as the spec says); the package passes when at most
`mismatched_elements_per_million` do. The tolerance is the first entry of
`config.bioimageio.reproducibility_tolerance` that applies to the output and to ONNX
weights (format 0.5; the spec's defaults otherwise: rtol 1e-3, atol 1e-3, 100 per
million). Exit 0: PASS, 1: FAIL, 2: a package znni refuses.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

DEFAULT_TOLERANCE = (1e-3, 1e-3, 100.0)  # ContinuousReproducibilityTolerance's defaults


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("check", help="run a bioimage.io package's test input and compare "
                       "with its test output")
    p.add_argument("package", help="bioimage.io package: a .zip, a folder or its rdf.yaml")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import numpy as np
    from bioimageio.spec.utils import load_array

    from znni.model.bioimage_package import load_package, read_package

    descr = read_package(args.package)
    model = load_package(args.package)
    out_descr = descr.outputs[0]
    if descr.inputs[0].test_tensor is None or out_descr.test_tensor is None:
        raise ValueError(f"bioimage.io package {args.package} has no test tensors to check")
    x = np.asarray(load_array(descr.inputs[0].test_tensor))  # (B, C, Z, Y, X)
    expected = np.asarray(load_array(out_descr.test_tensor), np.float32)
    if x.ndim != 5 or x.shape[0] != 1:
        raise ValueError(f"the test input of {args.package} has shape {x.shape}; znni checks "
                         "one sample (1, C, Z, Y, X)")
    ours = run_sample(model, x[0])[None]  # (1, Cout, Z, Y, X)
    rtol, atol, per_million = tolerance(descr, str(out_descr.id), str(out_descr.data.type))
    name = f"znni check: {model.name}: output {out_descr.id}"
    if ours.shape != expected.shape:
        print(f"{name}: shape {ours.shape} differs from the test output's {expected.shape}: "
              "FAIL")
        return 1
    diff = np.abs(ours.astype(np.float64) - expected)
    bad = int((diff > atol + rtol * np.abs(expected.astype(np.float64))).sum())
    allowed = per_million * expected.size / 1e6
    verdict = "PASS" if bad <= allowed else "FAIL"
    print(f"{name}: max abs difference {float(diff.max()):.3g}; {bad} of {expected.size} "
          f"values outside atol {atol:g} + rtol {rtol:g} * |expected| ({per_million:g} per "
          f"million allowed): {verdict}")
    return 0 if verdict == "PASS" else 1


def run_sample(model: Any, sample: Any) -> Any:
    """(Cout, Z, Y, X) output of znni's engine (CPU, fp32) for one (C, Z, Y, X) sample."""
    import numpy as np
    import zarr

    from znni.engine.job import SegmentJob
    from znni.engine.location import Location
    from znni.engine.segment import segment

    shape = tuple(int(n) for n in sample.shape[1:])
    with tempfile.TemporaryDirectory(prefix="znni-check-") as tmp:
        inp, out = str(Path(tmp) / "input.zarr"), str(Path(tmp) / "output.zarr")
        arr = zarr.create_array(inp, shape=sample.shape, chunks=sample.shape, dtype="float32",
                                zarr_format=3)
        arr[...] = np.asarray(sample, np.float32)
        job = SegmentJob(model, Location.parse(inp, "input"), Location.parse(out, "output"),
                         window=window_for(model, shape), device="cpu",
                         chunks=(shape[0], shape[1], shape[2]))
        segment(job)
        return zarr.open_array(out)[...]


def window_for(model: Any, shape: tuple[int, ...]) -> tuple[int, int, int]:
    """The smallest window on the model's grid that holds `shape` (one window)."""
    if model.fixed_window is not None:
        return model.fixed_window
    m, f = model.min_window, model.size_factor
    w = [m[a] + max(0, -(-(shape[a] - m[a]) // f[a])) * f[a] for a in range(3)]
    return (w[0], w[1], w[2])


def tolerance(descr: Any, output_id: str, dtype: str) -> tuple[float, float, float]:
    """(rtol, atol, mismatched per million) for the output, from the package's config."""
    discrete = not dtype.startswith("float")
    for t in descr.config.bioimageio.reproducibility_tolerance:
        ids = t.output_ids
        applies = (not ids or ids == ("any_discrete_output" if discrete
                                      else "any_continuous_output")
                   or (not isinstance(ids, str) and output_id in [str(i) for i in ids]))
        if applies and (not t.weights_formats or "onnx" in t.weights_formats):
            return (float(t.relative_tolerance), float(t.absolute_tolerance),
                    float(t.mismatched_elements_per_million))
    return DEFAULT_TOLERANCE
