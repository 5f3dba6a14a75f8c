"""Dask workers as batch jobs: `--scheduler slurm:N` (pbs, lsf, sge) through dask-jobqueue.

The cluster is the user's own: dask-jobqueue reads `jobqueue.KIND` of their Dask
configuration (`~/.config/dask/jobqueue.yaml`, `$DASK_CONFIG`, `DASK_JOBQUEUE__...`
variables): queue, account, walltime, `job-extra-directives` (a GPU request),
`job-script-prologue` (modules, a virtual environment), `interface`, `log-directory`. znni
decides only what the run decides:
- each job is one worker process (`processes=1`) that computes one block at a time (its
  Dask `--nthreads 1`; the block's own compute uses the cores the job asks for), with the
  run's memory budget as the job's memory (`--memory-limit`, else `jobqueue.KIND.memory`,
  which the run is then planned within) and `jobqueue.KIND.cores`, else the cores the plan
  assumes (`engine/cluster.py` decides both before anything is written);
- Dask's spilling and pausing are off in the job (a block task holds nothing between
  tasks; a worker paused at 80% of its memory would wait for good), its restart at 95%
  kept;
- at most N jobs, never more than the blocks left (`scale`), a job whose worker is gone
  asked for again while blocks are left (`keep_batch`), all released (`scancel`, `qdel`,
  `bkill`) when the sweep ends, fails or is interrupted (`sweep/dask.py` closes the
  cluster in a `finally`).
"""

from __future__ import annotations

import importlib
import shutil
from typing import Any

from znni.engine.scheduler import BATCH_KINDS, Scheduler

INSTALL = "pip install 'znni[dask]'"
# environment of the worker job: Dask's memory management for data-holding workloads off
_MEMORY_OFF = tuple(f"export DASK_DISTRIBUTED__WORKER__MEMORY__{k}=False"
                    for k in ("TARGET", "SPILL", "PAUSE"))


def jobqueue_module(scheduler: Scheduler) -> Any:
    """dask_jobqueue; ValueError naming the install when it is missing."""
    try:
        return importlib.import_module("dask_jobqueue")
    except ImportError:
        raise ValueError(f"--scheduler {scheduler} needs dask-jobqueue: {INSTALL}") from None


def check_batch(scheduler: Scheduler) -> None:
    """ValueError of one sentence when workers cannot be asked for from here: dask-jobqueue
    missing, or the batch system's submit command not on PATH."""
    jobqueue_module(scheduler)
    command = scheduler.submit_command
    if command is not None and shutil.which(command) is None:
        raise ValueError(f"--scheduler {scheduler} submits its workers with {command}, "
                         f"which is not on PATH; run znni where the {scheduler.kind.upper()} "
                         f"commands are (a login node) or install them")


def configured_size(scheduler: Scheduler) -> tuple[int | None, int | None]:
    """(memory in bytes, cores) of each job in the user's `jobqueue.KIND` configuration;
    None where unset. ValueError naming the key of a value that does not parse."""
    import dask.config
    from dask.utils import parse_bytes

    jobqueue_module(scheduler)  # its defaults join the configuration on import
    key = f"jobqueue.{scheduler.kind}"
    memory, cores = dask.config.get(f"{key}.memory", None), dask.config.get(f"{key}.cores", None)
    try:
        memory_bytes = None if memory is None else int(parse_bytes(memory))
    except (ValueError, TypeError):
        raise ValueError(f"{key}.memory {memory!r} in your Dask configuration is not a size "
                         "such as 24GB") from None
    if cores is not None and (not isinstance(cores, int) or cores < 1):
        raise ValueError(f"{key}.cores {cores!r} in your Dask configuration is not a "
                         "positive whole number")
    return memory_bytes, cores


def size_workers(scheduler: Scheduler, memory_limit_bytes: int | None, default_cores: int,
                 memory_flag: str | None = "--memory-limit") -> Scheduler:
    """The batch `scheduler` with each worker's size: memory `memory_limit_bytes`, else
    `jobqueue.KIND.memory`; cores `jobqueue.KIND.cores`, else `default_cores`. ValueError of
    one sentence when it cannot be asked for (`check_batch`) or no memory is known (naming
    the key to set, and `memory_flag`, the run's own option, when there is one)."""
    check_batch(scheduler)
    if scheduler.worker_memory_bytes is not None and scheduler.worker_cores is not None:
        return scheduler  # sized already
    memory, cores = configured_size(scheduler)
    if memory_limit_bytes is not None:
        memory = memory_limit_bytes
    if memory is None:
        give = f" or give {memory_flag}" if memory_flag else ""
        raise ValueError(f"--scheduler {scheduler} needs each worker's memory: set "
                         f"jobqueue.{scheduler.kind}.memory in your Dask configuration "
                         f"(jobqueue.yaml){give}")
    return scheduler.sized(memory, cores if cores is not None else default_cores)


def start_batch_cluster(scheduler: Scheduler, blocks: int) -> tuple[Any, Any]:
    """(client, cluster): the batch cluster asked for min(N, `blocks`) workers, its
    submissions done (a refused one is a ValueError naming the command's answer)."""
    from distributed import Client

    if scheduler.worker_memory_bytes is None or scheduler.worker_cores is None:
        raise ValueError(f"scheduler {scheduler} has no worker size (engine/cluster.py)")
    jobqueue = jobqueue_module(scheduler)
    import dask.config

    key = f"jobqueue.{scheduler.kind}"
    extra = list(dask.config.get(f"{key}.worker-extra-args", None) or [])
    prologue = list(dask.config.get(f"{key}.job-script-prologue", None) or [])
    cluster = _recording(getattr(jobqueue, BATCH_KINDS[scheduler.kind][0]))(
        cores=scheduler.worker_cores, memory=f"{scheduler.worker_memory_bytes}B", processes=1,
        # one block at a time: dask-worker's last --nthreads is the one it takes
        worker_extra_args=[*extra, "--nthreads", "1"],
        job_script_prologue=[*prologue, *_MEMORY_OFF],
    )
    try:
        scale_batch(cluster, scheduler, blocks)
        return Client(cluster), cluster
    except BaseException:
        cluster.close()
        raise


def scale_batch(cluster: Any, scheduler: Scheduler, blocks: int) -> None:
    """Ask for min(N, `blocks`) jobs and wait for their submission (not their start); a
    refused one is a ValueError naming the command's answer."""
    assert scheduler.workers is not None
    cluster.scale(jobs=max(0, min(scheduler.workers, blocks)))
    # scale() submits from a callback on the cluster's loop; this waits for that round (a
    # second round waits for the first's lock and then finds nothing left to submit)
    cluster.sync(cluster._correct_state)
    refused = [w.refusal for w in cluster.workers.values() if getattr(w, "refusal", None)]
    if refused:
        raise ValueError(f"{scheduler.submit_command} refused a worker job of --scheduler "
                         f"{scheduler} ({refused[0]}); check jobqueue.{scheduler.kind} in "
                         "your Dask configuration")


def keep_batch(cluster: Any, scheduler: Scheduler, blocks_left: int) -> None:
    """Ask again for the jobs whose worker is gone (walltime, a node lost, a kill) while
    blocks are left: the cluster cancels a lost worker's job after distributed's
    `deploy.lost-worker-timeout` (15 s) and forgets it, and a scale to the same number
    submits it anew. Never fewer jobs: a scale-down could close a busy worker."""
    assert scheduler.workers is not None
    target = min(scheduler.workers, blocks_left)
    if target >= len(cluster.worker_spec):
        cluster.scale(jobs=target)


def _recording(cluster_cls: Any) -> Any:
    """`cluster_cls` whose jobs keep their submission's refusal (the submit command's last
    line) instead of raising it into the cluster's loop, where it would only be logged and
    the job taken as submitted; `scale_batch` reports it."""
    from distributed.core import Status

    class Job(cluster_cls.job_cls):
        refusal: str | None = None

        async def start(self) -> None:
            try:
                await super().start()
            except (RuntimeError, OSError) as e:  # dask-jobqueue's _call: exit status, output
                lines = [s.strip() for s in str(e).splitlines() if s.strip()]
                self.refusal = lines[-1] if lines else type(e).__name__
                self.status = Status.running  # as SpecCluster expects; closed at once

    return type(cluster_cls.__name__, (cluster_cls,), {"job_cls": Job})
