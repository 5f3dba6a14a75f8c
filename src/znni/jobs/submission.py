"""Turning a submitted job into an engine `SegmentJob`, checked before anything is stored.

The API checks a submission with `check_submission`; the worker rebuilds the
same job from the stored parameters with `segment_job`, so a resumed run has
exactly the same arguments.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from znni.engine.job import SegmentJob
from znni.jobs.catalogue import NetworkCatalogue
from znni.jobs.paths import confine, relative_to_root
from znni.model.network import Network


def segment_job(
    network: Network,
    input_path: str,
    output_path: str,
    params: dict[str, Any],
    *,
    scheduler: str | None = None,
    overwrite: bool | None = None,
) -> SegmentJob:
    """The engine job for stored parameters (paths already confined and resolved)."""
    roi = params.get("roi")
    return SegmentJob(
        network=network,
        input_path=input_path,
        output_path=output_path,
        roi=tuple((lo, hi) for lo, hi in roi) if roi is not None else None,
        border=params.get("border", "reflect"),
        dtype=params.get("dtype", "float32"),
        chunks=_triple(params.get("chunks")),
        block=_triple(params.get("block")),
        device=params.get("device", "auto"),
        memory_limit_bytes=params.get("memory_limit_bytes"),
        scheduler=scheduler,
        overwrite=bool(params.get("overwrite", False)) if overwrite is None else overwrite,
    )


def check_submission(
    catalogue: NetworkCatalogue,
    data_root: Path,
    *,
    network: str,
    input: str,
    output: str,
    params: dict[str, Any],
    scheduler: str | None = None,
) -> tuple[Network, SegmentJob]:
    """Check everything a job needs; ValueError with one sentence naming the problem.

    `input` and `output` are as the user sent them (relative to `data_root`); `params`
    are the job's other fields (roi, border, dtype, ..., overwrite). Nothing is
    written: the engine's `check_and_plan` only reads (it also plans the run).
    """
    from znni.engine.segment import check_and_plan

    net = catalogue.get(network)
    input_path = confine(data_root, input, "input", must_exist=True)
    output_path = confine(data_root, output, "output")
    if output_path.is_relative_to(input_path) or input_path.is_relative_to(output_path):
        raise ValueError(
            f"output {output!r} and input {input!r} overlap; the output must be a separate array"
        )
    job = segment_job(net, str(input_path), str(output_path), params, scheduler=scheduler)
    check_overwrite(output_path, bool(params.get("overwrite", False)), output)
    try:
        check_and_plan(job)
    except (ValueError, TypeError, FileNotFoundError, NotADirectoryError) as e:
        raise ValueError(relative_to_root(data_root, str(e))) from e
    return net, job


def _triple(value: Any) -> tuple[int, int, int] | None:
    return (int(value[0]), int(value[1]), int(value[2])) if value is not None else None


def check_overwrite(output_path: Path, overwrite: bool, shown: str) -> None:
    """An existing output is only written again with overwrite, or to resume its own run.

    (The engine refuses a ledger of another job; this also refuses an output without one.)
    """
    from znni.engine.ledger import read_ledger

    if overwrite or not output_path.exists():
        return
    header, _ = read_ledger(str(output_path))
    if header is None:
        raise ValueError(f'output {shown!r} already exists; send "overwrite": true to replace it')
