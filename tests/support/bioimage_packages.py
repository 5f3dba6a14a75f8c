"""bioimage.io model packages built for tests with `bioimageio.spec`, and an independent
numpy reference of the spec's processing ops (format 0.5 text, written from the spec's
docstrings, not from znni's code).

A package is a tiny 3D U-Net-ish torch module (2 channels in, 2 out, one 2x down- and
upsampling, padded convs) exported to ONNX, an rdf.yaml of format 0.5 (or 0.4), and test
tensors that the reference computes: the spec's preprocessing on the test input, the
ONNX model through onnxruntime, the spec's postprocessing.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

SHAPE = (1, 2, 8, 16, 16)  # the test tensor (b, c, z, y, x)
CHANNELS = ("raw0", "raw1")
OUT_NAMES = ("fg", "boundary")


def tiny_net(in_channels: int = 2) -> Any:
    import torch

    nn = torch.nn

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Conv3d(in_channels, 4, 3, padding=1)
            self.b = nn.Conv3d(4, 4, 3, padding=1)
            self.up = nn.ConvTranspose3d(4, 4, 2, stride=2)
            self.c = nn.Conv3d(8, 2, 1)

        def forward(self, x):
            a = torch.relu(self.a(x))
            u = self.up(torch.relu(self.b(nn.functional.max_pool3d(a, 2))))
            return self.c(torch.cat([a, u], 1))

    torch.manual_seed(5)
    return Net().eval()


def export_onnx(path: Path) -> Path:
    import torch

    torch.onnx.export(tiny_net(), (torch.zeros(*SHAPE),), path, input_names=["x"],
                      dynamo=False, dynamic_axes={"x": {2: "z", 3: "y", 4: "x"}})
    return path


def run_onnx(path: Path, x: np.ndarray) -> np.ndarray:
    """(N, C, Z, Y, X) float32 through onnxruntime."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {sess.get_inputs()[0].name: x.astype(np.float32)})[0]


# ---- the reference: the spec's ops on a (C, Z, Y, X) sample ---------------------------

def _reduce(axes: list[str] | None) -> tuple[int, ...]:
    """numpy axes to reduce for spec axes over (c, z, y, x); batch is the only sample."""
    if axes is None:
        return (0, 1, 2, 3)
    names = {"channel": 0, "z": 1, "y": 2, "x": 3}
    return tuple(names[a] for a in axes if a in names)


def _chan(v: Any) -> np.ndarray:
    return np.asarray(v, np.float64).reshape(-1, 1, 1, 1)


def ref_op(op: dict, x: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """One op of the spec on `x`; statistics of the unprocessed sample `raw`."""
    kind, kw = op["id"], op.get("kwargs", {})
    x = x.astype(np.float64)
    if kind == "scale_linear":
        return x * _chan(kw.get("gain", 1.0)) + _chan(kw.get("offset", 0.0))
    if kind == "fixed_zero_mean_unit_variance":
        return (x - _chan(kw["mean"])) / _chan(kw["std"])
    if kind == "zero_mean_unit_variance":
        ax = _reduce(kw.get("axes"))
        r = raw.astype(np.float64)
        return (x - r.mean(axis=ax, keepdims=True)) / (r.std(axis=ax, keepdims=True)
                                                       + kw.get("eps", 1e-6))
    if kind == "scale_range":
        ax = _reduce(kw.get("axes"))
        lo = np.percentile(raw.astype(np.float64), kw.get("min_percentile", 0.0), axis=ax,
                           keepdims=True)
        hi = np.percentile(raw.astype(np.float64), kw.get("max_percentile", 100.0), axis=ax,
                           keepdims=True)
        return (x - lo) / (hi - lo + kw.get("eps", 1e-6))
    if kind == "clip":
        ax = _reduce(kw.get("axes"))
        r = raw.astype(np.float64)
        lo = kw.get("min") if "min_percentile" not in kw else np.percentile(
            r, kw["min_percentile"], axis=ax, keepdims=True)
        hi = kw.get("max") if "max_percentile" not in kw else np.percentile(
            r, kw["max_percentile"], axis=ax, keepdims=True)
        return np.clip(x, lo, hi)
    if kind == "binarize":
        return (x > _chan(kw["threshold"])).astype(np.float64)
    if kind == "sigmoid":
        return 1 / (1 + np.exp(-x))
    if kind == "softmax":
        e = np.exp(x - x.max(axis=0, keepdims=True))
        return e / e.sum(axis=0, keepdims=True)
    if kind == "ensure_dtype":
        return x.astype(np.float32).astype(kw["dtype"]).astype(np.float64)
    raise AssertionError(f"no reference for {kind}")


def ref_chain(ops: list[dict], x: np.ndarray) -> np.ndarray:
    raw = x
    out = x.astype(np.float64)
    for op in ops:
        out = ref_op(op, out, raw)
    return out.astype(np.float32)


# ---- building packages ---------------------------------------------------------------

def _axes(channel_names: tuple[str, ...], sizes: list[Any], halo: int = 0,
          ids: tuple[str, ...] = ("z", "y", "x")) -> list[dict]:
    axes: list[dict] = [{"type": "batch"}, {"type": "channel",
                                            "channel_names": list(channel_names)}]
    for i, (a, s) in enumerate(zip(ids, sizes, strict=True)):
        axes.append({"type": "space", "id": a, "size": s,
                     **({"halo": halo} if halo and i > 0 else {})})
    return axes


def build(folder: Path, onnx: Path, pre: list[dict], post: list[dict], *,
          halo: int = 0, size: dict | None = None, weights: str = "onnx",
          pack: str = "folder", seed: int = 0) -> Path:
    """A package in `folder` (pack: "folder", "rdf" (its rdf.yaml) or "zip"), validated by
    bioimageio.spec; its test output from the reference."""
    import yaml
    from bioimageio.spec import InvalidDescr, load_description, save_bioimageio_package

    folder.mkdir(parents=True, exist_ok=True)
    size = size or {"min": 8, "step": 2}
    spatial = [size["min"] + -(-max(0, n - size["min"]) // size["step"]) * size["step"]
               for n in SHAPE[2:]]  # the smallest valid size from SHAPE's up
    x = np.random.default_rng(seed).integers(0, 256, (*SHAPE[:2], *spatial)).astype(np.float32)
    np.save(folder / "test_input.npy", x)
    y = ref_chain(post, run_onnx(onnx, ref_chain(pre, x[0])[None])[0])[None]
    np.save(folder / "test_output.npy", y)
    (folder / "README.md").write_text("# tiny\n\n## Validation\n\nTest tensors only.\n")
    ref = [{"tensor_id": "raw", "axis_id": a} for a in "zyx"]
    rdf = {
        "format_version": "0.5.4", "type": "model", "name": "tiny-unet",
        "description": "A tiny 3D U-Net for tests", "license": "MIT",
        "authors": [{"name": "Test Author"}], "documentation": "README.md",
        "cite": [{"text": "Ronneberger et al. 2015",
                  "doi": "10.1007/978-3-319-24574-4_28"}],
        "inputs": [{"id": "raw", "axes": _axes(CHANNELS, [size] * 3),
                    "test_tensor": {"source": "test_input.npy"}, "data": {"type": "float32"},
                    "preprocessing": pre}],
        "outputs": [{"id": "prob", "axes": _axes(OUT_NAMES, ref, halo),
                     "test_tensor": {"source": "test_output.npy"},
                     "data": {"type": "float32"}, "postprocessing": post}],
        "weights": _weights(folder, onnx, weights),
    }
    (folder / "rdf.yaml").write_text(yaml.safe_dump(rdf, sort_keys=False))
    descr = load_description(folder / "rdf.yaml", perform_io_checks=True)
    assert not isinstance(descr, InvalidDescr), descr.validation_summary.format()
    if pack == "rdf":
        return folder / "rdf.yaml"
    if pack == "zip":
        return Path(save_bioimageio_package(folder / "rdf.yaml",
                                            output_path=folder.with_suffix(".zip")))
    return folder


def _weights(folder: Path, onnx: Path, kind: str) -> dict:
    if kind == "onnx":
        shutil.copyfile(onnx, folder / "weights.onnx")
        return {"onnx": {"source": "weights.onnx", "opset_version": 17}}
    import torch

    traced = torch.jit.trace(tiny_net(), torch.zeros(*SHAPE))
    traced.save(str(folder / "weights.pt"))
    return {"torchscript": {"source": "weights.pt", "pytorch_version": torch.__version__[:4]}}


def windowed_reference(onnx: Path, vol: np.ndarray, pre: list[dict], post: list[dict],
                       window: tuple[int, int, int], overlap: float) -> np.ndarray:
    """The spec's preprocessing over the whole volume (C, Z, Y, X), MONAI's
    sliding_window_inference of onnxruntime (gaussian blending), the postprocessing."""
    import torch
    from monai.inferers import sliding_window_inference

    x = ref_chain(pre, vol)

    def predict(t: Any) -> Any:
        return torch.from_numpy(run_onnx(onnx, t.numpy()))

    out = sliding_window_inference(torch.from_numpy(x)[None], window, 1, predict,
                                   overlap=overlap, mode="gaussian", sigma_scale=0.125,
                                   padding_mode="constant", cval=0.0)[0].numpy()
    return ref_chain(post, out)


def build_v04(folder: Path, onnx: Path, pre: list[dict], post: list[dict],
              ref_pre: list[dict], ref_post: list[dict]) -> Path:
    """A format 0.4 package (axes as letters, shape min/step, `name` ids); the library
    converts it to 0.5 when read. Its test output from the reference, given the same
    processing in 0.5 form (`ref_pre`, `ref_post`)."""
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    x = np.random.default_rng(3).integers(0, 256, SHAPE).astype(np.float32)
    np.save(folder / "test_input.npy", x)
    y = ref_chain(ref_post, run_onnx(onnx, ref_chain(ref_pre, x[0])[None])[0])[None]
    np.save(folder / "test_output.npy", y)
    shutil.copyfile(onnx, folder / "weights.onnx")
    (folder / "README.md").write_text("# tiny\n\n## Validation\n\nTest tensors only.\n")
    rdf = {
        "format_version": "0.4.10", "type": "model", "name": "tiny-unet-04",
        "description": "A tiny 3D U-Net for tests, format 0.4", "license": "MIT",
        "authors": [{"name": "Test Author"}], "documentation": "README.md",
        "cite": [{"text": "Ronneberger et al. 2015", "doi": "10.1007/978-3-319-24574-4_28"}],
        "timestamp": "2026-11-27T00:00:00", "tags": ["3d"],
        "test_inputs": ["test_input.npy"], "test_outputs": ["test_output.npy"],
        "inputs": [{"name": "raw", "axes": "bczyx", "data_type": "float32",
                    "data_range": [0.0, 255.0],
                    "shape": {"min": [1, 2, 8, 8, 8], "step": [0, 0, 2, 2, 2]},
                    "preprocessing": pre}],
        "outputs": [{"name": "prob", "axes": "bczyx", "data_type": "float32",
                     "data_range": [0.0, 1.0],
                     "shape": {"reference_tensor": "raw", "scale": [1, 1, 1, 1, 1],
                               "offset": [0, 0, 0, 0, 0]},
                     "postprocessing": post}],
        "weights": {"onnx": {"source": "weights.onnx", "opset_version": 17}},
    }
    (folder / "rdf.yaml").write_text(yaml.safe_dump(rdf, sort_keys=False))
    return folder
