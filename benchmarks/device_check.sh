#!/usr/bin/env bash
# shellcheck disable=SC2329  # the step functions run through `export -f` and bash -c
# The GPU device check (issue 37), one script for a CUDA 12 or 13 machine, run from the
# repository root:   bash benchmarks/device_check.sh
#
#   1. env      nvidia-smi, python and package versions; installs the wheels in .whl/
#               (benchmarks/fetch_gpu_wheels.sh) into /tmp/site without network, and puts
#               /tmp/site and src/ on PYTHONPATH (znni itself needs no install)
#   2. imports  CuPy sees the device, the cuDNN frontend loads its library, znni imports
#   3. tests    what `make test-gpu` runs: every @pytest.mark.gpu test, ZNNI_REQUIRE_GPU=1
#   4. bench    benchmarks/gpu.py --quick
#
# Every step runs under `timeout`; a failed step does not stop the later ones, and the
# script exits 1 if any failed. Logs go to $OUT when it is set (the device tool), else to
# results/device-check-DATE/: env.log, tests.log, tests.xml, bench.log, bench.json,
# summary.txt. The step limits (seconds) add up to 7.7 minutes: T_ENV, T_IMPORTS, T_TESTS,
# T_BENCH, and T_CHILD for each of gpu.py's child runs. PYTHON picks the interpreter
# (default python3); STEPS the steps (default "env imports tests bench"; a second call on a
# still-warm machine can run STEPS="env bench" alone); WHEELS the wheel folder (.whl).
# A dry run of the script itself without a GPU: STANDIN=1 STEPS="env bench" WHEELS=none
# PYTHON=.venv/bin/python bash benchmarks/device_check.sh (the bench step then runs
# gpu.py --standin; its figures are not GPU figures).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python3}
T_ENV=${T_ENV:-45} T_IMPORTS=${T_IMPORTS:-45} T_TESTS=${T_TESTS:-100} T_BENCH=${T_BENCH:-270}
T_CHILD=${T_CHILD:-120}
WHEELS=${WHEELS:-.whl}
BENCH_MODE=(--quick)
[[ ${STANDIN:-0} == 1 ]] && BENCH_MODE=(--standin --quick)
STEPS=" ${STEPS:-env imports tests bench} "
RESULTS=${OUT:-results/device-check-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/znni-device-cache}  # calibration, once
# FFTW_MEASURE plans for 200^3 patches take minutes on a fresh machine; the CPU rows of the
# benchmark then use cheaper plans (slower CPU figures), and say so
export ZNNI_FFT_EFFORT=${ZNNI_FFT_EFFORT:-FFTW_ESTIMATE}
export PYTHONPATH="$PWD/src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
unset ZNNI_GPU_STANDIN
SUMMARY="$RESULTS/summary.txt"
: >"$SUMMARY"
FAILED=0
START=$(date +%s)

step() {  # step NAME LIMIT LOG COMMAND...: run it under timeout, append to LOG, note rc
  local name=$1 limit=$2 log=$3; shift 3
  local t0 rc
  [[ $STEPS == *" $name "* ]] || return 0
  t0=$(date +%s)
  echo "=== $name (limit ${limit}s) $(date -u +%H:%M:%S)" | tee -a "$log"
  # a new bash runs the step (functions below are exported), so `timeout` can stop it
  timeout --kill-after=10 "$limit" bash -c '"$@"' step "$@" >>"$log" 2>&1
  rc=$?
  (( rc == 124 || rc == 137 )) && echo "$name: TIMED OUT after ${limit}s" >>"$log"
  (( rc != 0 )) && FAILED=1
  printf '%-8s rc=%-3s %4ss  %s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$log" \
    | tee -a "$SUMMARY"
}

env_step() {
  nvidia-smi || echo "nvidia-smi: not found or failed"
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv || true
  uname -a; nproc; free -g || true
  "$PY" --version
  if compgen -G "$WHEELS/*.whl" >/dev/null; then
    ls -l "$WHEELS"/
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "$WHEELS"/*.whl || return 1
  else
    echo "no wheels in $WHEELS/: using what $PY already has"
  fi
  "$PY" -m pip list 2>/dev/null | grep -iE '^(cupy|nvidia-cudnn|nvidia-cufft|nvidia-cublas|cuda-toolkit|torch |numpy|monai|onnx |pytest |zarr|pyfftw)' || true
}

imports_step() {
  "$PY" - <<'EOF'
import cupy, znni, zarr, pyfftw, monai, torch
from znni.primitives.gpu.cupy_device import require_cuda
require_cuda()
print("cupy", cupy.__version__, "runtime", cupy.cuda.runtime.runtimeGetVersion(),
      "driver", cupy.cuda.runtime.driverGetVersion(),
      "devices", cupy.cuda.runtime.getDeviceCount())
props = cupy.cuda.runtime.getDeviceProperties(0)
print("device 0:", props["name"], "cc", props["major"], props["minor"],
      "memory GiB", round(props["totalGlobalMem"] / 2**30, 1))
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())
print("znni from", znni.__file__, "| zarr", zarr.__version__, "| monai", monai.__version__)
try:
    import cudnn
    print("cudnn frontend", cudnn.__version__, "backend", cudnn.backend_version())
except Exception as e:  # the benchmark names the fallback (gemm-loop) where this fails
    print("cudnn frontend NOT usable:", type(e).__name__, e)
    raise SystemExit(1)
EOF
}

tests_step() {  # what `make test-gpu` runs (Makefile), on this interpreter
  local files extra=()
  files=$(grep -rlE 'pytest\.mark\.gpu' tests --include='test_*.py' | sort)
  "$PY" -c "import pytest_timeout" 2>/dev/null && extra=(--timeout 120)
  # shellcheck disable=SC2086 # one word per test file
  ZNNI_REQUIRE_GPU=1 "$PY" -m pytest -q -m gpu -p no:cacheprovider -rfEs "${extra[@]}" \
    --junitxml "$RESULTS/tests.xml" $files
}

export PY RESULTS WHEELS
export -f env_step imports_step tests_step
step env "$T_ENV" "$RESULTS/env.log" env_step
step imports "$T_IMPORTS" "$RESULTS/env.log" imports_step
step tests "$T_TESTS" "$RESULTS/tests.log" tests_step
step bench "$T_BENCH" "$RESULTS/bench.log" "$PY" benchmarks/gpu.py "${BENCH_MODE[@]}" \
  --json "$RESULTS/bench.json" --timeout "$T_CHILD"

echo
[[ -f "$RESULTS/tests.log" ]] && { echo "=== tests (last lines)"; tail -n 15 "$RESULTS/tests.log"; }
echo "=== bench summary"
if [[ ! -f "$RESULTS/bench.log" ]]; then
  echo "(not run)"
elif grep -q '^=====' "$RESULTS/bench.log"; then
  sed -n '/^=====/,$p' "$RESULTS/bench.log" | cut -c1-220
else
  tail -n 25 "$RESULTS/bench.log" | cut -c1-220
fi
echo "=== device check: $(( $(date +%s) - START ))s, results in $RESULTS" | tee -a "$SUMMARY"
cat "$SUMMARY"
exit "$FAILED"
