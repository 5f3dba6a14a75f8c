"""Job server under load: while a job computes, 50 concurrent submissions and 500 status
polls must all be answered; p50/p99 latency vs the same requests on an idle server.

    .venv/bin/python benchmarks/server_load.py [--submissions 50] [--polls 500]
                                               [--pollers 10] [--size 96]

Real `znni serve` subprocesses on 127.0.0.1. Phase "idle" (the peer): a server
started with --workers 0, so nothing computes while the requests run. Phase
"busy": a server with one worker process, the same requests while a job
computes (the submitted jobs queue behind it). Every submitted job must be
stored (checked over HTTP and directly in SQLite). Goal: busy p99 < 200 ms on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np


def build_site(base: Path, size: int) -> None:
    """A compute-heavy network (fov 10) and volumes: a big one to compute, a small one to submit."""
    import zarr

    models, data = base / "models", base / "data"
    models.mkdir()
    data.mkdir()
    rng = np.random.default_rng(0)
    layers = [
        {"kind": "conv", "out_channels": 12, "kernel": [3, 3, 3]},
        {"kind": "relu"},
        {"kind": "maxpool", "window": [2, 2, 2]},
        {"kind": "conv", "out_channels": 12, "kernel": [3, 3, 3]},
        {"kind": "relu"},
        {"kind": "conv", "out_channels": 3, "kernel": [1, 1, 1]},
        {"kind": "sigmoid"},
    ]
    params, c = {}, 1
    for i, layer in enumerate(layers):
        if layer["kind"] == "conv":
            shape = (layer["out_channels"], c, *layer["kernel"])
            params[f"{i}.weight"] = (
                rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))
            ).astype(np.float32)
            params[f"{i}.bias"] = np.zeros(layer["out_channels"], np.float32)
            c = layer["out_channels"]
    (models / "net.json").write_text(
        json.dumps({"name": "net", "in_channels": 1, "weights": "net.npz", "layers": layers})
    )
    np.savez(models / "net.npz", **params)
    for name, shape in (("big.zarr", (size, size, size)), ("small.zarr", (16, 16, 16))):
        a = zarr.create_array(str(data / name), shape=shape, chunks=(16, 16, 16), dtype="float32")
        a[...] = rng.standard_normal(shape).astype(np.float32)


def start_server(base: Path, name: str, workers: int) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(base / f"{name}.log", "w")  # noqa: SIM115 - the subprocess keeps it
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "znni.server.cli",
            "serve",
            "--port",
            str(port),
            "--data-root",
            str(base / "data"),
            "--models",
            str(base / "models"),
            "--db",
            str(base / f"{name}.sqlite"),
            "--workers",
            str(workers),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).json()["workers_alive"] >= workers:
                return proc, url
        except (httpx.HTTPError, ValueError, KeyError):
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"server did not start; see {base / name}.log")


async def timed(
    client: httpx.AsyncClient, method: str, path: str, body: dict | None
) -> tuple[float, int, dict]:
    t0 = time.perf_counter()
    r = await client.request(method, path, json=body)
    return time.perf_counter() - t0, r.status_code, r.json()


async def poller(client: httpx.AsyncClient, path: str, n: int) -> list:
    return [await timed(client, "GET", path, None) for _ in range(n)]


async def load(
    url: str, tag: str, submissions: int, polls: int, pollers: int, poll_id: int
) -> dict[str, list]:
    """`submissions` POSTs all at once, while `pollers` clients share `polls` sequential GETs."""
    limits = httpx.Limits(max_connections=submissions + pollers)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        posts = [
            timed(
                client,
                "POST",
                "/v1/jobs",
                {"network": "net", "input": "small.zarr", "output": f"out/{tag}-{i}.zarr"},
            )
            for i in range(submissions)
        ]
        shares = [polls // pollers + (1 if i < polls % pollers else 0) for i in range(pollers)]
        gets = [poller(client, f"/v1/jobs/{poll_id}", n) for n in shares]
        results = await asyncio.gather(*posts, *gets)
    return {
        "submit": list(results[:submissions]),
        "poll": [r for chunk in results[submissions:] for r in chunk],
    }


def percentile_ms(values: list[float], q: float) -> float:
    return 1000 * float(np.percentile(values, q))


def summarise(phase: str, results: dict[str, list], expected: dict[str, int]) -> dict:
    rows = {}
    for kind, items in results.items():
        lat = [t for t, _, _ in items]
        bad = [code for _, code, _ in items if code != expected[kind]]
        rows[kind] = {
            "n": len(items),
            "bad": len(bad),
            "p50": percentile_ms(lat, 50),
            "p99": percentile_ms(lat, 99),
            "max": 1000 * max(lat),
            "mean": 1000 * statistics.fmean(lat),
        }
        print(
            f"{phase:<5} {kind:<7} {len(items):>5} {len(bad):>4} {rows[kind]['p50']:>9.1f} "
            f"{rows[kind]['p99']:>9.1f} {rows[kind]['max']:>9.1f}"
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--submissions", type=int, default=50)
    ap.add_argument("--polls", type=int, default=500)
    ap.add_argument("--pollers", type=int, default=10, help="clients polling job status")
    ap.add_argument("--size", type=int, default=96, help="edge of the computing job's volume")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="znni-load-") as tmp:
        base = Path(tmp)
        build_site(base, args.size)
        print(
            f"{'phase':<5} {'request':<7} {'n':>5} {'bad':>4} {'p50 ms':>9} {'p99 ms':>9} "
            f"{'max ms':>9}"
        )
        rows, ids = {}, []
        for phase, workers in (("idle", 0), ("busy", 1)):
            proc, url = start_server(base, phase, workers)
            try:
                rows[phase], stored_ok = run_phase(url, base, phase, args)
                ids.append(stored_ok)
            finally:
                proc.terminate()
                proc.wait(timeout=60)
        report(rows, all(ids))


def run_phase(url: str, base: Path, phase: str, args: argparse.Namespace) -> tuple[dict, bool]:
    """The load on one server; returns its latency rows and whether every job was stored."""
    client = httpx.Client(base_url=url, timeout=60)
    expected = {"submit": 201, "poll": 200}
    target = client.post(
        "/v1/jobs",
        json={
            "network": "net",
            "input": "big.zarr",
            "output": f"out/{phase}-big.zarr",
            "chunks": [16, 16, 16],
            "block": [16, 16, 16],
        },
    ).json()["id"]
    if phase == "busy":
        while client.get(f"/v1/jobs/{target}").json()["progress"]["done"] < 1:
            time.sleep(0.05)
    results = asyncio.run(load(url, phase, args.submissions, args.polls, args.pollers, target))
    after = client.get(f"/v1/jobs/{target}").json()
    rows = summarise(phase, results, expected)
    if phase == "busy":
        print(
            f"      computing job: {after['status']} ({after['progress']['done']}/"
            f"{after['progress']['total']} blocks, {after['voxels_per_second'] or 0:,.0f} "
            "voxels/s)"
            + (
                ""
                if after["status"] == "running"
                else "  [WARNING: it finished during the load; use a larger --size]"
            )
        )
    ids = {r[2]["id"] for r in results["submit"] if r[1] == 201}
    listed = {j["id"] for j in client.get("/v1/jobs", params={"limit": 1000}).json()["jobs"]}
    with sqlite3.connect(base / f"{phase}.sqlite") as con:
        in_db = {row[0] for row in con.execute("SELECT id FROM jobs")}
    for job_id in [*ids, target]:
        client.post(f"/v1/jobs/{job_id}/cancel")
    return rows, len(ids) == args.submissions and ids <= listed and ids <= in_db


def report(rows: dict, stored: bool) -> None:
    idle, busy = rows["idle"], rows["busy"]
    print()
    for kind in ("submit", "poll"):
        print(
            f"busy/idle {kind}: p50 {busy[kind]['p50'] / idle[kind]['p50']:.2f}x, "
            f"p99 {busy[kind]['p99'] / idle[kind]['p99']:.2f}x"
        )
    answered = all(r["bad"] == 0 for phase in rows.values() for r in phase.values())
    p99 = max(busy["submit"]["p99"], busy["poll"]["p99"])
    print(
        f"every request answered as expected: {answered}; every submitted job stored "
        f"(HTTP and SQLite): {stored}; busy p99 {p99:.1f} ms (goal < 200 ms): "
        f"{'met' if p99 < 200 else 'NOT met'}"
    )
    if not (answered and stored):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
