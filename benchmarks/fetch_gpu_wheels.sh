#!/usr/bin/env bash
# Download into .whl/ exactly the Python wheels that the lent GPU machines' image ('cuda',
# python 3.12, x86_64; /work/.library/device/KINDS.md) lacks for benchmarks/device_check.sh:
# the cuDNN frontend, znni's own dependencies on the GPU paths (pyFFTW, zarr and what zarr
# needs) and MONAI. CuPy (cupy-cuda13x 14.2), the cuDNN runtime (nvidia-cudnn-cu13), torch,
# onnx, onnxscript, numpy, scipy and pytest are in that image already. Run it here, with
# pip's internet, from the repository root:   bash benchmarks/fetch_gpu_wheels.sh
# The device tool carries the working tree and .whl/ together in at most 64 MiB; this
# stops if the wheels alone pass LIMIT_MIB (default 48).
set -euo pipefail
cd "$(dirname "$0")/.." || exit 2
DEST=${DEST:-.whl}
LIMIT_MIB=${LIMIT_MIB:-48}
if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
# name==version: the versions `make test` runs with here; keep one version of each.
WHEELS=(
  nvidia-cudnn-frontend==1.28.0  # 1.29+ require the CuTe DSL stack (pyproject.toml)
  pyfftw==0.15.1
  zarr==3.1.6
  numcodecs==0.16.6
  donfig==0.8.1.post1
  google-crc32c==1.9.0
  monai==1.6.0
)
mkdir -p "$DEST"
rm -f "$DEST"/*.whl
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 -d "$DEST" "${WHEELS[@]}"
got=("$DEST"/*.whl)
ls -l "${got[@]}"
total=$(du -cb "${got[@]}" | tail -1 | cut -f1)
echo "${#got[@]} wheels, $((total / 1048576)) MiB in $DEST"
if (( total > LIMIT_MIB * 1048576 )); then
  echo "fetch_gpu_wheels: $DEST holds more than $LIMIT_MIB MiB; the device tool carries 64 MiB" >&2
  exit 1
fi
