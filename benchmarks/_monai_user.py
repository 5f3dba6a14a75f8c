"""What a MONAI user runs today: one script, one process, from the Zarr volume to a Zarr
output, with MONAI's `sliding_window_inference` driving torch, onnxruntime or OpenVINO.

    python benchmarks/_monai_user.py FOLDER INPUT.zarr OUTPUT.zarr --runtime openvino
        [--precision f32|bf16|int8] [--window 64] [--overlap 0.25]
        [--model basicunet|unet] [--features 16,16,32,64,128,16] [--calibration 16]

`benchmarks/unets.py` times this whole process against a whole `znni segment` process
(the issue's comparison: imports, compile, reading, windows, blending, writing). The
model is FOLDER/basicunet.onnx (onnxruntime, OpenVINO) or MONAI's network with the
weights FOLDER/basicunet.pt (torch); the input is scaled by 1/255 as znni's
`--scale`. Prints one JSON line: the seconds of the sliding-window loop alone and of
the runtime's import and compile. `--precision int8` quantizes the OpenVINO model with
NNCF's default post-training quantization, as its documentation shows it
(`nncf.quantize(model, nncf.Dataset(windows))`), on `--calibration` random windows of the
volume itself (fixed seed), before the loop: the quantization is part of the setup.
"""

from __future__ import annotations

import argparse
import json
import time

T0 = time.perf_counter()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import zarr  # noqa: E402
from monai.inferers import sliding_window_inference  # noqa: E402


def quantized(folder: str, x: np.ndarray, window: int, count: int):  # type: ignore[no-untyped-def]
    """The ONNX model read by OpenVINO at a window's static shape and quantized by NNCF on
    `count` windows of `x` (1, 1, Z, Y, X) at random places."""
    import nncf
    import openvino as ov

    model = ov.Core().read_model(f"{folder}/basicunet.onnx")
    model.reshape([1, 1, window, window, window])
    rng = np.random.default_rng(0)
    hi = [max(1, s - window + 1) for s in x.shape[2:]]
    windows = []
    for _ in range(count):
        z, y, w = (int(rng.integers(0, h)) for h in hi)
        windows.append(np.ascontiguousarray(x[:, :, z:z + window, y:y + window, w:w + window]))
    return nncf.quantize(model, nncf.Dataset(windows), subset_size=count)


def predictor(runtime: str, folder: str, precision: str, kind: str, features: str,
              model=None):  # type: ignore[no-untyped-def]
    """A callable from a (1, C, *W) torch tensor to the network's output tensor."""
    if runtime == "torch":
        from monai.networks.nets import BasicUNet, UNet

        chans = tuple(int(v) for v in features.split(","))
        net = (UNet(spatial_dims=3, in_channels=1, out_channels=2, channels=chans,
                    strides=(2,) * (len(chans) - 1), num_res_units=2) if kind == "unet" else
               BasicUNet(spatial_dims=3, in_channels=1, out_channels=2, features=chans))
        net.load_state_dict(torch.load(f"{folder}/basicunet.pt"))
        return net.eval()
    if runtime == "onnxruntime":
        import onnxruntime as ort

        session = ort.InferenceSession(f"{folder}/basicunet.onnx")
        return lambda t: torch.from_numpy(session.run(None, {"x": t.numpy()})[0])
    import openvino as ov

    # the hint is explicit: on a CPU with bf16 units OpenVINO's default computes in bf16
    hint = "f32" if precision == "int8" else precision  # int8: where NNCF's quantizers are
    compiled = ov.Core().compile_model(model or f"{folder}/basicunet.onnx", "CPU",
                                       {"INFERENCE_PRECISION_HINT": hint})
    return lambda t: torch.from_numpy(compiled(t.numpy())[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folder")
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--runtime", choices=("torch", "onnxruntime", "openvino"), default="torch")
    ap.add_argument("--precision", choices=("f32", "bf16", "int8"), default="f32")
    ap.add_argument("--calibration", type=int, default=16, help="int8: calibration windows")
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--overlap", type=float, default=0.25)
    ap.add_argument("--model", choices=("basicunet", "unet"), default="basicunet")
    ap.add_argument("--features", default="16,16,32,64,128,16")
    args = ap.parse_args()
    if args.precision == "int8" and args.runtime != "openvino":
        raise SystemExit("--precision int8: OpenVINO only")
    vol = zarr.open_array(args.input, mode="r")[:]
    x = torch.from_numpy(vol[None, None].astype(np.float32) / 255)  # (1, 1, Z, Y, X)
    t_setup = time.perf_counter()
    model = (quantized(args.folder, x.numpy(), args.window, args.calibration)
             if args.precision == "int8" else None)
    predict = predictor(args.runtime, args.folder, args.precision, args.model, args.features,
                        model)
    setup_s = time.perf_counter() - t_setup
    t_loop = time.perf_counter()
    with torch.inference_mode():
        y = sliding_window_inference(x, (args.window,) * 3, 1, predict, overlap=args.overlap,
                                     mode="gaussian", sigma_scale=0.125)
    loop_s = time.perf_counter() - t_loop
    out = y[0].numpy()  # (C, Z, Y, X)
    zarr.create_array(args.output, data=out, chunks=(out.shape[0], 64, 64, 64),
                      overwrite=True)
    print(json.dumps({"loop_seconds": loop_s, "setup_seconds": setup_s,
                      "in_process_seconds": time.perf_counter() - T0}))


if __name__ == "__main__":
    main()
