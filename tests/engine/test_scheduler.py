"""`--scheduler` parsed once into a `Scheduler` value: its kinds, its refusals, its size."""

from __future__ import annotations

import pickle

import pytest

from znni.engine.job import SegmentJob
from znni.engine.scheduler import Scheduler


@pytest.mark.parametrize(("text", "kind", "workers", "address"), [
    ("local:3", "local", 3, None),
    ("tcp://10.0.0.5:8786", "tcp", None, "tcp://10.0.0.5:8786"),
    ("slurm:200", "slurm", 200, None),
    ("pbs:2", "pbs", 2, None),
    ("lsf:1", "lsf", 1, None),
    ("sge:4", "sge", 4, None),
])
def test_kinds(text: str, kind: str, workers: int | None, address: str | None) -> None:
    s = Scheduler.parse(text)
    assert (s.kind, s.workers, s.address, str(s)) == (kind, workers, address, text)
    assert s.is_batch == (kind in ("slurm", "pbs", "lsf", "sge"))
    assert pickle.loads(pickle.dumps(s)) == s


@pytest.mark.parametrize(("text", "said"), [
    ("slurm", "is not one of tcp://HOST:PORT, local:N, slurm:N"),
    ("kube:3", "is not one of"),
    ("tcp://host", "is not one of"),
    ("local:0", "needs at least one worker"),
    ("slurm:00", "needs at least one worker"),
])
def test_refusals_name_the_value(text: str, said: str) -> None:
    with pytest.raises(ValueError, match=said) as e:
        Scheduler.parse(text)
    assert repr(text) in str(e.value)


def test_submit_commands_and_size() -> None:
    assert [Scheduler.parse(f"{k}:1").submit_command for k in ("slurm", "pbs", "lsf", "sge")] \
        == ["sbatch", "qsub", "bsub", "qsub"]
    assert Scheduler.parse("local:2").submit_command is None
    sized = Scheduler.parse("slurm:2").sized(2**31, 8)
    assert (sized.worker_memory_bytes, sized.worker_cores, str(sized)) == (2**31, 8, "slurm:2")
    with pytest.raises(ValueError, match="local:2 starts no batch workers"):
        Scheduler.parse("local:2").sized(2**31, 8)
    with pytest.raises(ValueError, match="0 bytes and 8 cores"):
        Scheduler.parse("slurm:2").sized(0, 8)


def test_a_python_callers_text_is_parsed_by_the_job(tmp_path) -> None:
    job = SegmentJob(network=None, input_path="in.zarr", output_path="out.zarr",  # type: ignore[arg-type]
                     scheduler="slurm:3")
    assert job.scheduler == Scheduler.parse("slurm:3")
    with pytest.raises(ValueError, match="'slurm:x' is not one of"):
        SegmentJob(network=None, input_path="in.zarr", output_path="out.zarr",  # type: ignore[arg-type]
                   scheduler="slurm:x")
