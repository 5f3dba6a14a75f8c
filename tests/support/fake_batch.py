"""A fake SLURM for tests: `sbatch`, `squeue` and `scancel` that run a submitted job script
as a local background process, so dask-jobqueue's real job script starts a real Dask
worker here.

`install(bin_dir, state)` writes the three commands into `bin_dir` (put it first on PATH);
each runs this file with the state folder, where:
- `sbatch SCRIPT` copies the script to `job-ID.sh` (dask-jobqueue deletes its own at once),
  starts `bash job-ID.sh` in a new session (its process group is the "batch job"; output in
  `job-ID.log`), records the group in `job-ID.pgid` and prints `Submitted batch job ID`;
- `scancel ID...` ends each job's process group (SIGTERM, then SIGKILL after 10 s) and
  waits until none of it is left;
- `squeue` lists the jobs whose process group still has a live process;
- every call is a line of `calls.log`: `sbatch ID`, `scancel ID`, `squeue`;
- with FAKE_SBATCH_REFUSE=TEXT in its environment, `sbatch` refuses: TEXT on stderr, exit 1
  (as SLURM does for an unknown account or partition; logged as `sbatch refused`).
Linux only (process groups are read from /proc).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = ("sbatch", "squeue", "scancel")


def install(bin_dir: Path, state: Path) -> None:
    """The three commands in `bin_dir`, keeping their state in `state`."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    state.mkdir(parents=True, exist_ok=True)
    for name in COMMANDS:
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" '
                        f'"{state}" {name} "$@"\n')
        path.chmod(0o755)


def calls(state: Path) -> list[tuple[str, ...]]:
    """The logged calls, each (command, job id...)."""
    log = state / "calls.log"
    return [tuple(line.split()) for line in log.read_text().splitlines()] if log.exists() else []


def job_ids(state: Path) -> list[str]:
    """Every job submitted, in order."""
    return sorted((p.stem.split("-", 1)[1] for p in state.glob("job-*.pgid")), key=int)


def pgid(state: Path, job: str) -> int:
    return int((state / f"job-{job}.pgid").read_text())


def live_pids(group: int) -> list[int]:
    """The processes of process group `group` that are not zombies."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # state, ppid, pgrp, ...
        if fields[0] != "Z" and int(fields[2]) == group:
            found.append(int(entry.name))
    return found


def _log(state: Path, *words: str) -> None:
    with open(state / "calls.log", "a") as f:
        f.write(" ".join(words) + "\n")


def _new_id(state: Path) -> str:
    n = 1
    while True:
        try:
            os.close(os.open(state / f"id-{n}", os.O_CREAT | os.O_EXCL))
            return str(n)
        except FileExistsError:
            n += 1


def sbatch(state: Path, args: list[str]) -> int:
    if refusal := os.environ.get("FAKE_SBATCH_REFUSE"):
        _log(state, "sbatch", "refused")
        print(f"sbatch: error: {refusal}", file=sys.stderr)
        return 1
    job = _new_id(state)
    script = state / f"job-{job}.sh"
    script.write_text(Path(args[-1]).read_text())
    with open(state / f"job-{job}.log", "w") as log:
        proc = subprocess.Popen(["bash", str(script)], stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "SLURM_JOB_ID": job})
    (state / f"job-{job}.pgid").write_text(str(proc.pid))
    _log(state, "sbatch", job)
    print(f"Submitted batch job {job}")
    return 0


def scancel(state: Path, args: list[str]) -> int:
    for job in args:
        _log(state, "scancel", job)
        if not (state / f"job-{job}.pgid").exists():
            print(f"scancel: error: Invalid job id specified: {job}", file=sys.stderr)
            return 1
        group = pgid(state, job)
        for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait_s
            while live_pids(group) and time.monotonic() < deadline:
                time.sleep(0.05)
            if not live_pids(group):
                break
    return 0


def squeue(state: Path, args: list[str]) -> int:
    _log(state, "squeue")
    print("JOBID")
    for job in job_ids(state):
        if live_pids(pgid(state, job)):
            print(job)
    return 0


if __name__ == "__main__":
    state_dir, command, rest = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
    sys.exit({"sbatch": sbatch, "scancel": scancel, "squeue": squeue}[command](state_dir, rest))
