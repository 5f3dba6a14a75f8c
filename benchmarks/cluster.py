"""The cluster model (issue 54) against measured Dask runs on this host.

    .venv/bin/python benchmarks/cluster.py startup [--workers 1,2,4] [--reps 3]
    .venv/bin/python benchmarks/cluster.py workers [--workers 1,2,4] [--reps 2] [CASE options]
    .venv/bin/python benchmarks/cluster.py cap --rates 2MB/s,6MB/s [--workers 1,2] [CASE ...]

startup: a LocalCluster of N worker processes (threads_per_worker=1, as engine/sweep/dask.py
makes it) started in a fresh interpreter, a client connected, and on every worker a first
task importing what a block task imports (the engine, zarr, the CPU backend); wall seconds
from before the interpreter starts, median of --reps (planner/cluster.py SCHEDULER_START_S
and WORKER_START_S come from these).

workers: the case's network (a ZNNi net from benchmarks/networks at --width, random
weights) over a random uint8 volume, cut by --block into a few blocks; one untimed warm-up
run (FFTW's wisdom of the shapes saved, as a user's second run has it), then per N
`znni plan --input --workers N --json` (N processes sharing this host: the placement
`--scheduler local:N` runs) and `znni segment --scheduler local:N`, runs alternated over
the Ns --reps times; the whole segment process is timed. `none` is the plain local run
against its own whole-run prediction.

cap: the same job with its input and output on a local S3-API server (moto, in this
process) whose port is rate-limited in the kernel: a `tc` htb qdisc on the loopback with
one class at RATE (its ceiling too), fed by u32 filters on the server's port both ways, so
every byte any worker reads or writes shares RATE; other loopback traffic (Dask's) is not
classified and goes unshaped (needs root; removed at the end). The store's bandwidth
under the cap is measured first by `znni plan --measure-store` (that value predicts), then
each N runs as above.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _planner_job import write_network  # noqa: E402

ZNNI = [sys.executable, "-m", "znni.cli"]
STARTUP = """
import time, sys
t0 = float(sys.argv[1])
from distributed import Client, LocalCluster
def first():
    import zarr  # noqa: F401
    import znni.engine.segment  # noqa: F401
    from znni.primitives.cpu.backend import CpuBackend
    CpuBackend().close()
    return 0
cluster = LocalCluster(n_workers=int(sys.argv[2]), threads_per_worker=1, processes=True,
                       dashboard_address=None)
client = Client(cluster)
client.run(first)
print(time.time() - t0)
client.close(); cluster.close()
"""


def startup(workers: list[int], reps: int) -> None:
    print("| workers | LocalCluster + first task on every worker, s (median) | runs |")
    print("|---|---|---|")
    for n in workers:
        runs = []
        for _ in range(reps):
            out = subprocess.run([sys.executable, "-c", STARTUP, str(time.time()), str(n)],
                                 check=True, capture_output=True, text=True)
            runs.append(float(out.stdout.split()[-1]))
        print(f"| {n} | {statistics.median(runs):.2f} | "
              + ", ".join(f"{r:.2f}" for r in runs) + " |", flush=True)


def write_volume(shape: tuple[int, ...], chunks: tuple[int, ...], url: str,
                 options: dict[str, str] | None = None) -> str:
    import numpy as np
    import zarr

    store: object = url
    if url.startswith("s3://"):
        from zarr.storage import FsspecStore

        store = FsspecStore.from_url(url, storage_options=options or {})
    a = zarr.create_array(store, shape=shape, chunks=chunks, dtype="uint8", overwrite=True)
    a[...] = np.random.default_rng(1).integers(0, 255, size=shape, dtype=np.uint8)
    return url


def case_args(a: argparse.Namespace) -> list[str]:
    return ["--memory-limit", a.limit, "--chunks", a.chunks, "--block", a.block,
            "--dtype", a.dtype]


def predicted(spec: Path, inp: str, a: argparse.Namespace, workers: int | None,
              extra: list[str], env: dict[str, str]) -> dict:
    cmd = [*ZNNI, "plan", str(spec), "--input", inp, *case_args(a), *extra, *a.plan_extra,
           "--json"]
    if workers is not None:
        cmd += ["--workers", str(workers)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    plan = json.loads(out.stdout)
    return plan.get("cluster") or {"total_s": plan["predicted_job_seconds"],
                                   "bottleneck": "-", "blocks": plan["job_seconds"]["blocks"]}


def timed_segment(spec: Path, inp: str, out: str, a: argparse.Namespace, workers: int | None,
                  extra: list[str], env: dict[str, str]) -> float:
    cmd = [*ZNNI, "segment", str(spec), inp, out, *case_args(a), *extra, "--overwrite",
           "--quiet"]
    if workers is not None:
        cmd += ["--scheduler", f"local:{workers}"]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env)
    return time.perf_counter() - t0


def compare(spec: Path, inp: str, out: str, a: argparse.Namespace, ns: list[int | None],
            extra: list[str], env: dict[str, str], label: str, warm_up: bool = True) -> None:
    """Warm-up, predictions, alternated measured runs; one table row per N."""
    if warm_up:
        timed_segment(spec, inp, out, a, ns[0], extra, env)  # FFTW's wisdom saved
    plans = {n: predicted(spec, inp, a, n, extra, env) for n in ns}
    runs: dict[int | None, list[float]] = {n: [] for n in ns}
    for _ in range(a.reps):
        for n in ns:
            runs[n].append(timed_segment(spec, inp, out, a, n, extra, env))
            print(f"  {label} local:{n}: {runs[n][-1]:.1f} s (load average "
                  f"{os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    base = ns[0]  # the peer: each run against the first N's, measured and predicted
    for n in ns:
        p, m = plans[n], statistics.median(runs[n])
        rel_m = m / statistics.median(runs[base])
        rel_p = p["total_s"] / plans[base]["total_s"]
        print(f"| {label} | {'none' if n is None else f'local:{n}'} | {p['blocks']} | "
              f"{p['bottleneck']} | {p['total_s']:.1f} | {m:.1f} ("
              + ", ".join(f"{r:.1f}" for r in runs[n]) + f") | **{m / p['total_s']:.2f}** | "
              f"{rel_p:.2f} | {rel_m:.2f} | **{rel_m / rel_p:.2f}** |", flush=True)


HEADER = ("| store | workers | blocks | predicted bottleneck | predicted s | measured s "
          "(median; runs) | measured/predicted | predicted / first row's | measured / first "
          "row's | ratio of the two |\n|---|---|---|---|---|---|---|---|---|---|")


def workers_run(a: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        spec = write_network(a.net, a.width, tmp)
        shape = tuple(int(v) for v in a.shape.split(","))
        inp = write_volume(shape, (64, 64, 64), str(tmp / "in.zarr"))
        print(HEADER)
        ns: list[int | None] = [None, *a.workers]
        compare(spec, inp, str(tmp / "out.zarr"), a, ns, [], dict(os.environ), "local disk")


def _tc(*args: str) -> None:
    subprocess.run(["tc", *args], check=True)


def shape_port(port: int, rate: str) -> None:
    """Every packet to or from `port` on the loopback through one token bucket at `rate`."""
    bits = f"{int(float(rate.rstrip('B/s').rstrip('M')) * 8)}mbit"  # e.g. 2MB/s -> 16mbit
    # htb without a default class: unmatched packets (Dask's own traffic) go unshaped
    _tc("qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb")
    _tc("class", "add", "dev", "lo", "parent", "1:", "classid", "1:1", "htb", "rate", bits,
        "ceil", bits, "burst", "128kb", "cburst", "128kb")
    for way in ("dport", "sport"):
        _tc("filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", "1", "u32",
            "match", "ip", way, str(port), "0xffff", "flowid", "1:1")


def unshape() -> None:
    subprocess.run(["tc", "qdisc", "del", "dev", "lo", "root"], check=False)


def cap_run(a: argparse.Namespace) -> None:
    from moto.server import ThreadedMotoServer

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from support.server_util import free_port

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
           "AWS_DEFAULT_REGION": "us-east-1"}
    os.environ.update({k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
        Bucket="bench")
    options = ["--storage-option", f"endpoint_url={endpoint}"]
    spec_dir = Path(tempfile.mkdtemp())
    spec = write_network(a.net, a.width, spec_dir)
    shape = tuple(int(v) for v in a.shape.split(","))
    inp = write_volume(shape, (64, 64, 64), "s3://bench/in.zarr",
                       {"endpoint_url": endpoint})
    print(HEADER)
    try:
        for rate in a.rates:
            shape_port(port, rate)
            try:
                measured = subprocess.run(
                    [*ZNNI, "plan", "--measure-store", "s3://bench/scratch", *options,
                     "--measure-size", a.measure_size, "--json"],
                    check=True, capture_output=True, text=True, env=env)
                bw = json.loads(measured.stdout)["store_bandwidth"]
                print(f"  cap {rate}: --measure-store {bw}", file=sys.stderr, flush=True)
                a.plan_extra = ["--store-bandwidth", bw]  # the plan's, not segment's
                compare(spec, inp, "s3://bench/out.zarr", a, list(a.workers), options, env,
                        f"S3, tc {rate} ({bw})", warm_up=a.warm_up)
            finally:
                unshape()
    finally:
        server.stop()


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("startup", "workers", "cap"))
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--net", default="n337")
    ap.add_argument("--width", type=int, default=16)
    ap.add_argument("--shape", default="192,192,192")
    ap.add_argument("--chunks", default="32,32,32")
    ap.add_argument("--block", default="96,96,64")
    ap.add_argument("--limit", default="3GiB")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rates", default="2MB/s", help="cap: tc rates, MB/s")
    ap.add_argument("--measure-size", default="16MiB")
    ap.add_argument("--no-warm-up", dest="warm_up", action="store_false",
                    help="cap: no untimed first run (FFTW's wisdom of the shapes already "
                    "saved, by a `workers` run of the same case)")
    a = ap.parse_args(argv)
    a.workers = [int(v) for v in a.workers.split(",")]
    a.rates = a.rates.split(",")
    a.plan_extra = []
    if a.what == "startup":
        startup(a.workers, max(1, a.reps))
    elif a.what == "workers":
        workers_run(a)
    else:
        cap_run(a)


if __name__ == "__main__":
    main(sys.argv[1:])
