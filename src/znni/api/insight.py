"""The /v1 routes the dashboard reads beside the job itself: a job's throughput history
and block map, and the machine. Same token and query checks as every /v1 route."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, status
from starlette.concurrency import run_in_threadpool

from znni.api.blockmap import NoBlockMapError, block_map
from znni.api.machine import machine_info
from znni.api.routes import ERRORS, JobId, ServerState, StateDep, known_query, require_token
from znni.api.schemas import BlockMapRead, MachineRead, ThroughputRead
from znni.engine.location import Location
from znni.jobs.paths import relative_to_root
from znni.jobs.throughput import MAX_POINTS

router = APIRouter(
    prefix="/v1", dependencies=[Depends(require_token), Depends(known_query)], responses=ERRORS
)


def _missing(job_id: int) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no job with id {job_id}")


@router.get("/jobs/{job_id}/throughput", response_model=ThroughputRead)
async def job_throughput(
    job_id: JobId,
    state: StateDep,
    last: Annotated[int | None, Query(ge=1, le=MAX_POINTS)] = None,
) -> ThroughputRead:
    """The job's output voxels/s over time (at most `max_points` samples, kept in the job
    database, so they outlive the server); empty before its first finished block. `last`:
    only the latest samples (the jobs table asks for the newest rate alone)."""
    return await run_in_threadpool(_throughput, job_id, state, last)


def _throughput(job_id: int, state: ServerState, last: int | None) -> ThroughputRead:
    if state.store.get_row(job_id) is None:
        raise _missing(job_id)
    points = state.store.throughput(job_id)
    if last is not None:
        points = points[-last:]
    return ThroughputRead.model_validate({"job": job_id, "max_points": MAX_POINTS,
                                          "points": points})


@router.get("/jobs/{job_id}/blocks", response_model=BlockMapRead)
async def job_blocks(job_id: JobId, state: StateDep) -> BlockMapRead:
    """The job's block grid over its region and which blocks are finished (its output's
    ledger); 409 before the job has started writing its output."""
    return await run_in_threadpool(_blocks, job_id, state)


def _blocks(job_id: int, state: ServerState) -> BlockMapRead:
    record = state.store.get(job_id)
    if record is None:
        raise _missing(job_id)
    if record.started_at is None:
        raise HTTPException(status.HTTP_409_CONFLICT,
                            detail=f"job {job_id} is {record.status} and has not started")
    try:
        edges = (record.plan or {}).get("block_edges")  # the layout the engine cut
        found = block_map(Location.parse(record.output_path, "output"), ctx=state.stores,
                          edges=edges)
    except NoBlockMapError as e:
        detail = relative_to_root(state.settings.data_root, str(e))
        raise HTTPException(status.HTTP_409_CONFLICT, detail=detail) from e
    except (ValueError, OSError) as e:
        detail = relative_to_root(state.settings.data_root, str(e))
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=detail) from e
    return BlockMapRead.model_validate({"job": job_id, **found})


@router.get("/machine", response_model=MachineRead)
def machine(state: StateDep) -> MachineRead:
    """CPU, memory, GPUs (nvidia-smi), worker processes and the queue, now."""
    counts = state.store.counts_by_status()
    return MachineRead.model_validate({
        **machine_info(state.pool.pids()),
        "workers_alive": state.pool.alive(),
        "workers": state.settings.workers,
        "jobs_queued": counts.get("queued", 0),
        "jobs_running": counts.get("running", 0),
    })
