"""Machine profiles: what the planner knows about a computer (cores, memory, devices, rates).

A profile is detected on this machine (`detect.detect_machine`: cores,
available RAM, CUDA devices and the calibrated primitive rates), or
loaded from JSON so plans can be made for machines you do not have
(`znni plan --machine PROFILE.json`). Shipped profiles live in `profiles/`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from importlib import resources
from math import log
from pathlib import Path
from typing import Any

# Rates of the CPU primitives (whole machine, all threads), used by costs.py.
# Defaults are the ones measured on the 2-core AVX-512 CI kind (docs/benchmarks.md).
DEFAULT_CPU_RATES: dict[str, float] = {
    "fft_flops_per_s": 12e9,  # FFTW r2c/c2r at C*N*log2(N) flops per transform
    "kernel_fft_flops_per_s": 6e9,  # pruned kernel transforms (short, strided lines)
    "madd_flops_per_s": 60e9,  # complex frequency-domain matmul, compute-bound (S > 1)
    "madd_bytes_per_s": 15e9,  # the same, memory-bound at S = 1 (spectra read once)
    "direct_flops_per_s": 40e9,  # direct conv as GEMMs
    # one Conv3d compiled with OpenVINO 2026.4 at f32 (+ the instance norm after it) for
    # one window, reading and writing numpy's memory in place, fitted by the calibration
    # (graph/calibrate.py) on openvino_costs.openvino_terms: 181 GFLOP/s on the Intel host of
    # the CI kind (2026-11-24; its brgconv kernel ran 221-280 GFLOP/s alone on 16 -> 16 at
    # 64^3-96^3, the AMD host's 202 at 64^3). Fitted with the earlier terms (copies 1.8
    # passes, 2.3 ms a call) it had been 289-299; calibrated per machine
    "openvino_flops_per_s": 180e9,
    # int8 convs (FakeQuantize'd u8 input, i8 weights, as NNCF quantizes a network) over
    # fp32 ones in OpenVINO, same shapes: 1.41-1.65x at graph/calibrate.OPENVINO_SHAPES (AMD
    # EPYC Zen 4, 2 cores, 2026-11-28); a multiple of the rate above, calibrated per machine
    # where an int8 run is planned (graph/calibrate.int8_rates)
    "openvino_int8_speedup": 1.5,
    # Winograd F(4,3): the alpha^3 = 216 batched (Cout, Cin) @ (Cin, T) GEMMs, fitted with
    # planner/graph/search.WINOGRAD_PASSES on benchmarks/winograd.py's five U-Net layers
    # (16-128 channels, 16^3-64^3 outputs, 4 MiB chunks; medians of two runs, each layer
    # within 0.88-1.16 of the fit, CI kind, 2026-11-23)
    "winograd_flops_per_s": 37e9,
    # ... and its transforms' traffic over V and M (winograd_costs.WINOGRAD_PASSES); the
    # default is memory_bytes_per_s's. Both calibrated per machine (graph/calibrate.py)
    "winograd_bytes_per_s": 10e9,
    # instance and group norm: two reads and an in-place write in cache-sized row tiles
    # (graph.search.OP_TRAFFIC); the default is memory_bytes_per_s's, calibrated per machine
    "norm_bytes_per_s": 10e9,
    # graph_ops' strided, transposed and general convs: GEMMs over kernel offsets and phase
    # splits (graph/op_costs' slowdowns on top); the default is direct_flops_per_s's. A
    # rate of its own because the direct conv's fit can put its time in the gather term and
    # leave a GEMM rate no other GEMM reaches (276 GFLOP/s on an Intel host, 2026-11-24);
    # calibrated per machine (graph/calibrate.py)
    "graph_gemm_flops_per_s": 40e9,
    "gather_bytes_per_s": 30e9,  # direct conv: filling and reading the column buffers
    "memory_bytes_per_s": 10e9,  # element-wise passes: crop, bias, activation, MPF
    "pack_bytes_per_s": 5e9,  # multiply-add: input spectra gathered per output-channel chunk
    "product_overhead_s": 1e-6,  # one small per-frequency GEMM in the multiply-add
    "layer_overhead_s": 2e-4,  # fixed cost per layer call (Python, planning lookups)
    # pages of a fresh mapping, faulted in and zeroed: a sequential pass maps each tensor
    # of 64 MiB or more afresh (planner.hostsim.FRESH_ABOVE_BYTES), and a VM whose host
    # takes freed pages back pays its hypervisor for each again. n337 w22 over 135x234x71
    # (one 220x324x156 patch, 2-core AVX2 AMD EPYC VM, 2026-11-29): the layers mapping 0.7-
    # 2.4 GB each ran 0.3-3.1 s over their predicted compute, 11.7 s over the 11.6 GB the
    # pass maps (1 ns/byte); a fresh 0.5-1 GiB array touched in 0.6-4 s (0.25-0.86 GiB/s),
    # one freed within the last second in 0.1 s. That case set 1 GB/s; the reruns of the
    # held-out seeds 55-57 (nine cases, 2026-11-29) then ran 0.62-0.90x their predictions
    # but one (1.12), most with transparent huge pages faulting few pages (n337 w17: 3321
    # minor faults over a 668 MiB first layer): 4 GB/s is the rate at which their log ratios
    # average zero (7 of 9 within 20%), seeds 55-57 being its tuning set (ASSUMED_CPU_RATES)
    "fresh_page_bytes_per_s": 4.0e9,
    # FFTW_MEASURE's planning per point of a new FFT workspace's image transforms (a first
    # run's; planner/jobtime.py): the median of five first runs on an AVX-512 Zen 4, 2-core
    # VM (2026-11-28); timed per machine by its calibration (cpu_measure.planning_step)
    "fftw_measure_s_per_point": 70e-9,
}
# rates the calibration does not measure: a cached calibration takes them from
# DEFAULT_CPU_RATES as they are now (calibrate._from_cache), so a change to the model
# reaches machines calibrated before it
ASSUMED_CPU_RATES = ("fresh_page_bytes_per_s",)


# The graph planner's GPU conv rates by precision (planner/graph/gpu_costs.py), whole
# device. Defaults: NVIDIA H100 SXM5 datasheet peaks (dense, no sparsity: FP32 67 TFLOPS,
# TF32 tensor core 495, BF16/FP16 tensor core 989; "NVIDIA H100 Tensor Core GPU" datasheet)
# times an ASSUMED efficiency, not measured here: cuDNN's 3D convs at 40% of the FP32 peak
# and 30% of the tensor-core peaks; the per-offset GEMM loop's thin (Cout, Cin) @ (Cin, V)
# GEMMs at 30% of FP32 and 15% of the tensor-core peaks. Calibration on a device
# (graph/gpu_calibrate.py) replaces them.
H100_CUDNN_FLOPS_PER_S: dict[str, float] = {
    "fp32": 0.40 * 67e12, "tf32": 0.30 * 495e12, "bf16": 0.30 * 989e12, "fp16": 0.30 * 989e12,
}
H100_GEMM_FLOPS_PER_S: dict[str, float] = {
    "fp32": 0.30 * 67e12, "tf32": 0.15 * 495e12, "bf16": 0.15 * 989e12, "fp16": 0.15 * 989e12,
}
GPU_PRECISIONS = ("fp32", "tf32", "bf16", "fp16")  # primitives/precision.PRECISIONS


@dataclass(frozen=True)
class GpuProfile:
    """One CUDA device and the rates of its primitives (ZNNi's cuDNN and FFT conv)."""

    name: str
    memory_bytes: int
    direct_flops_per_s: float = 4e12  # cuDNN-style implicit GEMM
    fft_flops_per_s: float = 1.5e12  # cuFFT at C*N*log2(N) flops per transform
    madd_flops_per_s: float = 3e12  # complex frequency-domain products
    memory_bytes_per_s: float = 300e9  # device memory bandwidth for element-wise passes
    transfer_bytes_per_s: float = 12e9  # host <-> device (PCIe)
    layer_overhead_s: float = 5e-5
    # graph networks (planner/graph/gpu_search.py): whether cuDNN is installed (its convs are
    # planned only then), and the conv rates by precision (fp32, tf32, bf16, fp16)
    has_cudnn: bool = True
    cudnn_flops_per_s: dict[str, float] = field(
        default_factory=lambda: dict(H100_CUDNN_FLOPS_PER_S))
    gemm_flops_per_s: dict[str, float] = field(
        default_factory=lambda: dict(H100_GEMM_FLOPS_PER_S))
    calibrated: bool = False  # rates measured on the device (graph/gpu_calibrate.py)

    def __post_init__(self) -> None:
        for name in ("cudnn_flops_per_s", "gemm_flops_per_s"):
            rates = getattr(self, name)
            if not isinstance(rates, dict) or set(rates) != set(GPU_PRECISIONS) \
                    or any(float(v) <= 0 for v in rates.values()):
                raise ValueError(f"GPU profile {self.name!r}: {name} needs a positive rate for "
                                 f"each of {', '.join(GPU_PRECISIONS)}, found {rates!r}")

    def conv_rate(self, kind: str, precision: str) -> float:
        """FLOP/s of `kind` ("cudnn" or "gemm") at `precision`."""
        rates = self.cudnn_flops_per_s if kind == "cudnn" else self.gemm_flops_per_s
        if precision not in rates:
            raise ValueError(f"precision {precision!r} is not one of {', '.join(GPU_PRECISIONS)}")
        return float(rates[precision])


@dataclass(frozen=True)
class MachineProfile:
    """A computer as the planner sees it. Frozen; JSON round-trips via save/load."""

    name: str
    cores: int
    memory_bytes: int  # host RAM the planner may use (available, not total)
    cpu_rates: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_CPU_RATES))
    gpus: tuple[GpuProfile, ...] = ()
    # Resident bytes of a process before any patch (interpreter, numpy, FFTW, weights excluded).
    base_rss_bytes: int = 150 * 2**20
    calibrated: bool = False
    # Per CPU primitive ("direct", "fft-keep", "fft-recompute", "maxpool", "elementwise"):
    # measured / modelled time at the smallest and largest calibrated working set,
    # ((bytes_lo, factor_lo), (bytes_hi, factor_hi)). Caches make small layers faster
    # per unit of work than big ones, which one set of rates cannot express.
    cpu_scaling: dict[str, tuple[tuple[float, float], ...]] = field(default_factory=dict)
    # rates fitted from a first plan's part of the calibration (calibrate.FIRST_PLAN_SHAPES)
    partial_calibration: bool = False

    def rate(self, key: str) -> float:
        return float(self.cpu_rates.get(key, DEFAULT_CPU_RATES[key]))

    def scaling(self, key: str, working_set_bytes: float) -> float:
        """Calibrated time factor of primitive `key` at a working set: linear in
        log(bytes) between the calibrated ends, constant beyond them, 1 if uncalibrated."""
        points = self.cpu_scaling.get(key)
        if not points:
            return 1.0
        (b0, f0), (b1, f1) = points[0], points[-1]
        if b1 <= b0:
            return float(f0)
        u = (log(max(working_set_bytes, 1.0)) - log(b0)) / (log(b1) - log(b0))
        return float(f0 + min(1.0, max(0.0, u)) * (f1 - f0))

    @property
    def gpu(self) -> GpuProfile | None:
        """The device the planner uses (the first one; multi-GPU is not planned)."""
        return self.gpus[0] if self.gpus else None

    def with_memory(self, memory_bytes: int) -> MachineProfile:
        return replace(self, memory_bytes=int(memory_bytes))

    def without_gpus(self) -> MachineProfile:
        return replace(self, gpus=())

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["gpus"] = [asdict(g) for g in self.gpus]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MachineProfile:
        if not isinstance(d, dict):
            raise ValueError(f"a machine profile must be a JSON object, found {type(d).__name__}")
        missing = sorted({"name", "cores", "memory_bytes"} - set(d))
        if missing:
            raise ValueError(f"machine profile is missing key {missing[0]!r}")
        rates = {**DEFAULT_CPU_RATES, **{k: float(v) for k, v in d.get("cpu_rates", {}).items()}}
        unknown = sorted(set(rates) - set(DEFAULT_CPU_RATES))
        if unknown:
            raise ValueError(f"machine profile has unknown cpu rate {unknown[0]!r}")
        try:
            gpus = tuple(_gpu_from_json(g) for g in d.get("gpus", []))
        except TypeError as e:
            raise ValueError(f"machine profile has a malformed GPU entry ({e})") from e
        scaling = _scaling_from_json(d.get("cpu_scaling", {}))
        cores, memory = int(d["cores"]), int(d["memory_bytes"])
        if cores < 1 or memory < 1:
            raise ValueError(f"machine profile needs cores >= 1 and memory_bytes >= 1, "
                             f"found {cores} and {memory}")
        return cls(
            name=str(d["name"]),
            cores=cores,
            memory_bytes=memory,
            cpu_rates=rates,
            gpus=gpus,
            base_rss_bytes=int(d.get("base_rss_bytes", 150 * 2**20)),
            calibrated=bool(d.get("calibrated", False)),
            cpu_scaling=scaling,
            partial_calibration=bool(d.get("partial_calibration", False)),
        )

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> MachineProfile:
        """Load a profile JSON file, or a shipped profile by name (e.g. 'znni-paper')."""
        p = Path(path)
        if not p.is_file():
            shipped = resources.files("znni.planner") / "profiles" / f"{path}.json"
            if not shipped.is_file():
                raise ValueError(
                    f"machine profile {path} is neither a file nor a shipped profile "
                    f"({', '.join(shipped_profiles())})"
                )
            return cls.from_dict(json.loads(shipped.read_text()))
        try:
            return cls.from_dict(json.loads(p.read_text()))
        except json.JSONDecodeError as e:
            raise ValueError(f"machine profile {p} is not valid JSON ({e})") from e


def _gpu_from_json(g: dict[str, Any]) -> GpuProfile:
    """A GPU entry; rates by precision that name only some precisions keep the defaults'
    others (a profile may give just fp32)."""
    g = dict(g)
    for key, default in (("cudnn_flops_per_s", H100_CUDNN_FLOPS_PER_S),
                         ("gemm_flops_per_s", H100_GEMM_FLOPS_PER_S)):
        if key in g:
            if not isinstance(g[key], dict):
                raise ValueError(f"machine profile GPU {key} must be an object of rates by "
                                 f"precision, found {g[key]!r}")
            g[key] = {**default, **{k: float(v) for k, v in g[key].items()}}
    return GpuProfile(**g)


def _scaling_from_json(d: Any) -> dict[str, tuple[tuple[float, float], ...]]:
    """Validate cpu_scaling: {primitive: [[bytes, factor], [bytes, factor]]}, factors > 0."""
    if not isinstance(d, dict):
        raise ValueError(f"machine profile cpu_scaling must be an object, found {d!r}")
    out = {}
    for key, points in d.items():
        try:
            pts = tuple((float(b), float(f)) for b, f in points)
        except (TypeError, ValueError) as e:
            raise ValueError(f"machine profile cpu_scaling[{key!r}] must be [[bytes, factor], "
                             f"...], found {points!r}") from e
        if not pts or any(b <= 0 or f <= 0 for b, f in pts):
            raise ValueError(f"machine profile cpu_scaling[{key!r}] needs positive bytes and "
                             f"factors, found {points!r}")
        out[str(key)] = pts
    return out


def shipped_profiles() -> list[str]:
    folder = resources.files("znni.planner") / "profiles"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json"))


def available_memory_bytes() -> int:
    """MemAvailable from /proc/meminfo (what can be allocated without swapping)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
