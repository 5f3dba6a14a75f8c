"""Role-named request and response bodies of the HTTP API (docs/design.md, "HTTP API")."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, RootModel

from znni.engine.job import MAX_ERROR
from znni.triple import Triple

JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
JOB_STATUSES: tuple[str, ...] = ("queued", "running", "succeeded", "failed", "cancelled")
FINISHED_STATUSES: tuple[str, ...] = ("succeeded", "failed", "cancelled")

NetworkName = Annotated[
    str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
]
UserPath = Annotated[str, Field(min_length=1, max_length=1024)]
Coordinate = Annotated[int, Field(ge=0, le=2**40)]
RoiRange = tuple[Coordinate | None, Coordinate | None]
PositiveSize = Annotated[int, Field(ge=1, le=2**20)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False, ge=-1e30, le=1e30)]
# the output options a job and a plan take alike (docs/design.md, "Labels, masks and empty
# blocks"): labels "argmax" or "threshold:T[:CHANNEL]"; a mask under the data root (or an
# allowed URL) whose shape divides the input's; the input value of empty blocks
Labels = Annotated[str, Field(pattern=r"^(argmax|threshold:.{1,40})$")]
# agglomeration thresholds (waterz's: merge while 1 - mean affinity < T); [0, 1] and distinct
# are the engine's check, answered in its sentence
Thresholds = Annotated[list[FiniteFloat], Field(min_length=1, max_length=64)]
Block = tuple[PositiveSize, PositiveSize, PositiveSize]
# POST /v1/plan's cluster fields: a rate or duration as the CLI takes it, or a number
ClusterText = Annotated[str, Field(min_length=1, max_length=32)]
PositiveFloat = Annotated[float, Field(allow_inf_nan=False, gt=0, le=1e16)]
NonNegativeFloat = Annotated[float, Field(allow_inf_nan=False, ge=0, le=1e12)]


class AgglomerateStage(BaseModel):
    """A segment job's agglomeration after its network, on the affinities it writes (the
    network's output: 3 channels, or a 1-channel boundary map), with the job's roi and
    overwrite. With several thresholds `output` holds `{threshold}`, one output each."""

    model_config = ConfigDict(extra="forbid")

    output: UserPath
    thresholds: Thresholds = [0.5]
    block: Block | None = None  # default 128^3, clipped to the region; the result is the same


class AgglomerateCreate(BaseModel):
    """An agglomeration job on existing affinities (3, z, y, x) or a boundary map, as
    `znni agglomerate` runs it: uint64 labels per threshold."""

    model_config = ConfigDict(extra="forbid")

    affinities: UserPath
    output: UserPath  # with several thresholds it holds {threshold}
    thresholds: Thresholds = [0.5]
    roi: tuple[RoiRange, RoiRange, RoiRange] | None = None
    block: Block | None = None
    mask: UserPath | None = None  # same shape as the affinities: 0 is background
    overwrite: bool = False
    output_format: Literal["zarr", "ome-zarr"] | None = None


class JobCreate(BaseModel):
    """A segmentation job: a network from the models directory over a volume under the data root."""

    model_config = ConfigDict(extra="forbid")

    network: NetworkName
    input: UserPath
    output: UserPath
    roi: tuple[RoiRange, RoiRange, RoiRange] | None = None
    border: Literal["reflect", "zero"] = "reflect"
    dtype: Literal["float32", "uint8"] = "float32"
    device: Literal["auto", "cpu", "gpu", "cpu-gpu"] = "auto"
    # arithmetic precision: fp32, or on the GPU tf32, bf16, fp16; on the CPU (ONNX models)
    # bf16, int8 (NNCF-quantized on the input's windows) and auto (--precision)
    precision: Literal["fp32", "tf32", "bf16", "fp16", "int8", "auto"] = "fp32"
    # int8 and auto: the largest error against fp32 accepted, a fraction of the fp32 output's
    # range on held-out windows of the input (--max-error); int8 above it is refused (422)
    max_error: Annotated[float, Field(ge=0.0, le=1e3, allow_inf_nan=False)] = MAX_ERROR
    # chunks: an existing output's must match (they cannot change in place)
    chunks: tuple[PositiveSize, PositiveSize, PositiveSize] | None = None
    block: tuple[PositiveSize, PositiveSize, PositiveSize] | None = None  # whole chunks
    memory_limit_bytes: Annotated[int, Field(ge=2**20, le=2**50)] | None = None
    overwrite: bool = False
    # windowed models only (None: the planned window, overlap 0.25, gaussian blending)
    window: tuple[PositiveSize, PositiveSize, PositiveSize] | None = None
    overlap: Annotated[float, Field(ge=0.0, lt=1.0)] | None = None
    blend: Literal["gaussian", "constant"] | None = None
    # ONNX models only: input x * scale + shift (default 1, 0), and which output to write
    scale: FiniteFloat | None = None
    shift: FiniteFloat | None = None
    output_name: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    # OME-Zarr (None: the existing output's format, else ome-zarr exactly for an OME input;
    # pyramid levels below level 0, default coarsest <= 256, or a precomputed:// output's
    # scales 1..N, default none; the OME input's level, default 0)
    output_format: Literal["zarr", "ome-zarr"] | None = None
    pyramid: Annotated[int, Field(ge=0, le=64)] | None = None
    level: Annotated[int, Field(ge=0, le=64)] | None = None
    # an input chunk that does not decode: fail the job (naming it), or compute on with the
    # fill value and list it in the output's provenance (--on-bad-chunk)
    on_bad_chunk: Literal["fail", "fill"] = "fail"
    # test-time flips (--tta): "flips" (z, y and x: 8 passes a window) or "flips:AXES"
    tta: Annotated[str, Field(pattern=r"^flips(:[zyx]{1,3})?$", max_length=9)] | None = None
    # labels instead of the float output (--labels), a mask (--mask) and the input value of
    # empty blocks (--skip-empty): blocks outside the mask or empty are written as 0
    labels: Labels | None = None
    mask: UserPath | None = None
    skip_empty: FiniteFloat | None = None
    # agglomeration of the network's affinities after it (a second stage of the job)
    agglomerate: AgglomerateStage | None = None


class Progress(BaseModel):
    done: int  # blocks finished (including ones finished by earlier attempts)
    total: int  # blocks in the job; 0 until the worker has started it
    voxels_done: int
    voxels_total: int


class StageRead(BaseModel):
    """One stage of a job: "network", then an agglomeration's "fragments", "faces",
    "agglomerate" (the one global step) and "relabel T" per threshold."""

    name: str
    status: Literal["pending", "running", "done", "stopped"]  # stopped: the job is not running
    progress: Progress  # blocks (the global step: one) and voxels
    voxels_per_second: float | None
    elapsed_s: float | None
    eta_s: float | None  # a running stage's; the network's from its plan's prediction at first


class JobRead(BaseModel):
    id: int
    status: JobStatus
    kind: Literal["segment", "agglomerate"]  # agglomerate: a job on existing affinities
    network: str | None  # null for an agglomeration job
    input: str  # the network's input, or the affinities
    output: str  # the output (an agglomeration's with several thresholds: its {threshold} form)
    parameters: dict[str, Any]
    progress: Progress  # a job with stages: its latest stage's
    stages: list[StageRead]  # a plain segment job: one, "network"
    voxels_per_second: float | None
    # from predicted_s at the start, then more and more the measured rate; with stages, the
    # running stage's (each stage has its own)
    eta_s: float | None
    predicted_s: float | None  # the whole run's predicted seconds (its plan's job_seconds)
    elapsed_s: float | None
    error: str | None
    plan: dict[str, Any] | None
    # the engine's SegmentReport of the finished run (with an agglomeration stage, its
    # report under "agglomerate"; an agglomeration job's: that report alone)
    report: dict[str, Any] | None
    cancel_requested: bool
    attempts: int  # how many times a worker started it (resumes after a crash count)
    created_at: float
    started_at: float | None
    finished_at: float | None
    # a neuroglancer link showing the input and output where both are URLs neuroglancer reads
    # (s3://, gs://, https://); null for local paths (`znni view --serve` serves those)
    viewer_url: str | None = None


class JobList(BaseModel):
    jobs: list[JobRead]
    total: int


class LayerNetworkRead(BaseModel):
    """A sequential network of valid convolutions and pools (a JSON spec, or an ONNX chain),
    run exactly with max-pooling fragments."""

    name: str
    mode: Literal["exact"]
    in_channels: int
    out_channels: int
    fov: Triple
    pool_product: Triple
    layers: list[dict[str, Any]]
    digest: str


class PackageRead(BaseModel):
    """A bioimage.io model package's listing: what it is, how to cite it, its channels."""

    name: str
    description: str
    cite: list[dict[str, str]]  # {"text", "doi"?, "url"?}
    channel_names: list[str]
    format_version: str


class GraphNetworkRead(BaseModel):
    """An ONNX graph model, run on a grid of windows: blended overlapping windows
    (`windowed`) or tiles of a window-independent graph (`exact`). A job's `window` must be
    `min_window` plus a multiple of `size_factor` per axis (exactly `fixed_window` when set)."""

    name: str
    mode: Literal["exact", "windowed"]
    in_channels: int
    out_channels: int
    size_factor: Triple
    min_window: Triple
    fixed_window: Triple | None
    context: Triple | None  # exact mode: input voxels a window has beyond its output
    digest: str
    package: PackageRead | None = None  # a bioimage.io package (zip or folder)


class NetworkRead(RootModel[LayerNetworkRead | GraphNetworkRead]):
    """A network of the models directory: a sequential network or an ONNX graph model."""


class NetworkList(BaseModel):
    networks: list[NetworkRead]


class PlanRequest(BaseModel):
    """What a job with these fields would run; `input` (with `roi`, `level`) plans for that
    volume's region, as a job's input is located (data root or allowed URL prefixes). Its
    fields are JobCreate's, checked alike, less output, border, block, overwrite, blend,
    scale, shift, output_name, output_format, pyramid, on_bad_chunk and agglomerate
    (docs/design.md, "HTTP API"), which it refuses as unknown fields."""

    model_config = ConfigDict(extra="forbid")

    network: NetworkName
    device: Literal["auto", "cpu", "gpu", "cpu-gpu"] = "auto"
    memory_limit_bytes: Annotated[int, Field(ge=2**20, le=2**50)] | None = None
    input: UserPath | None = None
    roi: tuple[RoiRange, RoiRange, RoiRange] | None = None
    level: Annotated[int, Field(ge=0, le=64)] | None = None
    overlap: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.25  # windowed models
    window: tuple[PositiveSize, PositiveSize, PositiveSize] | None = None  # ONNX: not chosen
    # as a job takes them: what its whole run's time (predicted_job_seconds) depends on
    precision: Literal["fp32", "tf32", "bf16", "fp16", "int8", "auto"] = "fp32"
    # as a job takes it; a plan does not quantize: int8's error is measured when the job is
    # submitted (the plan says so)
    max_error: Annotated[float, Field(ge=0.0, le=1e3, allow_inf_nan=False)] = MAX_ERROR
    dtype: Literal["float32", "uint8"] = "float32"  # the output's: its writes are timed
    chunks: tuple[PositiveSize, PositiveSize, PositiveSize] | None = None  # with input
    tta: Annotated[str, Field(pattern=r"^flips(:[zyx]{1,3})?$", max_length=9)] | None = None
    # as a job takes them: the stored channels and dtype, the blocks wholly outside the mask
    # (not computed; the mask needs an input), the empty-block value (shown, not counted)
    labels: Labels | None = None
    mask: UserPath | None = None
    skip_empty: FiniteFloat | None = None
    # with input: the job on a Dask cluster (planner/cluster.py), as `znni plan --workers`
    workers: Annotated[int, Field(ge=1, le=10**7)] | None = None
    placement: Literal["host", "nodes"] | None = None  # default: nodes with --machine
    store_bandwidth: ClusterText | PositiveFloat | None = None  # "2GB/s" or bytes/s
    queue_wait: ClusterText | NonNegativeFloat | None = None  # "10m" or seconds
    deadline: ClusterText | PositiveFloat | None = None  # "7d" or seconds


class PlanRead(BaseModel):
    network: str
    plan: dict[str, Any]


class ErrorRead(BaseModel):
    detail: str


class Health(BaseModel):
    status: Literal["ok"]
    workers_alive: int
    workers: int


class ThroughputPoint(BaseModel):
    attempt: int  # the worker's attempt (a resumed job starts its rates again)
    t: float  # unix time of the progress event
    blocks_done: int
    voxels_done: int
    rate: float  # output voxels/s now: a moving average over the last events
    average: float  # output voxels/s averaged over the attempt so far


class ThroughputRead(BaseModel):
    """A job's throughput history, bounded and evenly spread over its life (oldest first)."""

    job: int
    max_points: int
    points: list[ThroughputPoint]


class BlockMapRead(BaseModel):
    """The job's block grid over its region, from the output's ledger: `state` holds one
    character per block in z, y, x order, '1' finished and '0' not yet (null above
    `max_blocks`, when only the counts are given)."""

    job: int
    region: tuple[tuple[int, int], tuple[int, int], tuple[int, int]]
    step: Triple  # the block shape on the chunk grid (edge blocks are clipped)
    grid: Triple  # blocks along z, y, x
    # the planned layout's cuts per axis, from the region's start to its end, where the
    # plan merged a thin remainder into its neighbour (null: the plain grid of `step`)
    edges: tuple[list[int], list[int], list[int]] | None = None
    total: int
    done: int
    max_blocks: int
    state: str | None


class GpuRead(BaseModel):
    index: int
    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    utilization_percent: float | None


class MachineRead(BaseModel):
    """The server's machine now: what the dashboard's machine panel shows."""

    hostname: str
    cpu_model: str | None
    cores: int
    load_1m: float | None
    memory_total_bytes: int | None
    memory_available_bytes: int | None
    server_rss_bytes: int | None  # the API process
    workers_rss_bytes: int | None  # the job worker processes together
    gpus: list[GpuRead]  # from nvidia-smi; empty without one
    workers_alive: int
    workers: int
    jobs_queued: int
    jobs_running: int
