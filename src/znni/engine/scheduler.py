"""Where a job's blocks run, parsed once: the `Scheduler` value (`--scheduler`).

- `local:N`: a Dask `LocalCluster` of N worker processes on this machine;
- `tcp://HOST:PORT`: an existing Dask scheduler, joined;
- `slurm:N`, `pbs:N`, `lsf:N`, `sge:N`: a dask-jobqueue cluster of at most N workers, each
  one batch job of the user's own Dask configuration (`jobqueue.yaml`), never more than
  there are blocks left (`engine/sweep/batch.py` starts it and releases it).

As `Location`, the text is parsed at the CLI or HTTP boundary (or by the job value, for a
Python caller's text) with one sentence for anything malformed, into a frozen, picklable
value; `str()` is the text as given. A batch scheduler also carries each worker's size,
decided from the run (`sized`): its memory (the run's memory budget, which the plan fits)
and its cores.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

LOCAL = "local"
TCP = "tcp"
# batch kind -> (dask-jobqueue's cluster class, the command that submits a job)
BATCH_KINDS: dict[str, tuple[str, str]] = {
    "slurm": ("SLURMCluster", "sbatch"),
    "pbs": ("PBSCluster", "qsub"),
    "lsf": ("LSFCluster", "bsub"),
    "sge": ("SGECluster", "qsub"),
}
FORMS = "tcp://HOST:PORT, local:N, slurm:N, pbs:N, lsf:N or sge:N"
_COUNTED = re.compile(r"([a-z]+):(\d+)")
_TCP = re.compile(r"tcp://[^\s:/]+:\d+")


@dataclass(frozen=True)
class Scheduler:
    """A parsed `--scheduler` (module docstring). Build with `Scheduler.parse`."""

    kind: str  # "local", "tcp", or a batch kind of BATCH_KINDS
    workers: int | None = None  # local and batch: N (batch: at most N); tcp: None
    address: str | None = None  # tcp: the scheduler's address
    # batch: each worker's memory and cores, decided from the run (`sized`); None: not yet
    worker_memory_bytes: int | None = None
    worker_cores: int | None = None
    text: str = ""

    @classmethod
    def parse(cls, text: str | Scheduler) -> Scheduler:
        """`text` as a Scheduler; ValueError of one sentence naming it when malformed."""
        if isinstance(text, Scheduler):
            return text
        if not isinstance(text, str):
            raise TypeError(f"scheduler {text!r} is a {type(text).__name__}, not text")
        raw = text.strip()
        if _TCP.fullmatch(raw):
            return cls(TCP, address=raw, text=text)
        m = _COUNTED.fullmatch(raw)
        if m is None or (m.group(1) != LOCAL and m.group(1) not in BATCH_KINDS):
            raise ValueError(f"scheduler {text!r} is not one of {FORMS}")
        n = int(m.group(2))
        if n < 1:
            raise ValueError(f"scheduler {text!r} needs at least one worker")
        return cls(m.group(1), workers=n, text=text)

    @classmethod
    def of(cls, text: str | Scheduler | None) -> Scheduler | None:
        """`parse`, with None (no scheduler: run here) kept."""
        return None if text is None else cls.parse(text)

    @property
    def is_batch(self) -> bool:
        """A dask-jobqueue cluster (slurm, pbs, lsf, sge)."""
        return self.kind in BATCH_KINDS

    @property
    def submit_command(self) -> str | None:
        """The batch system's submit command (sbatch, qsub, bsub); None for Dask kinds."""
        return BATCH_KINDS[self.kind][1] if self.is_batch else None

    def sized(self, memory_bytes: int, cores: int) -> Scheduler:
        """This batch scheduler with each worker's memory and cores decided."""
        if not self.is_batch:
            raise ValueError(f"scheduler {self} starts no batch workers to size")
        if memory_bytes < 1 or cores < 1:
            raise ValueError(f"a worker of scheduler {self} needs memory and cores >= 1, "
                             f"not {memory_bytes} bytes and {cores} cores")
        return replace(self, worker_memory_bytes=int(memory_bytes), worker_cores=int(cores))

    def __str__(self) -> str:
        return self.text
