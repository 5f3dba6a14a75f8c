"""`POST /v1/agglomerate`: an agglomeration job on existing affinities (docs/design.md,
"HTTP API"). It is a job like any other once queued: polled, listed and cancelled under
`/v1/jobs`, run by the same workers, resumed from its ledgers."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, HTTPException, status
from starlette.concurrency import run_in_threadpool

from znni.api.routes import ERRORS, ServerState, StateDep, known_query, require_token
from znni.api.schemas import AgglomerateCreate, JobRead
from znni.api.views import job_read
from znni.jobs.agglomeration import KIND, check_job, stage_list, stored_output
from znni.jobs.events import log_event
from znni.jobs.store import OutputBusyError

router = APIRouter(
    prefix="/v1", dependencies=[Depends(require_token), Depends(known_query)], responses=ERRORS
)


@router.post("/agglomerate", status_code=status.HTTP_201_CREATED, response_model=JobRead)
async def create_agglomeration(body: AgglomerateCreate, state: StateDep) -> JobRead:
    """Check everything `znni agglomerate` checks (nothing is stored or written on a 4xx),
    then queue the job (kind "agglomerate")."""
    return await run_in_threadpool(_create, body, state)


def _create(body: AgglomerateCreate, state: ServerState) -> JobRead:
    t0 = time.perf_counter()
    params = body.model_dump(exclude={"affinities"}, mode="json")
    site = state.site()
    try:
        affinities, _ = check_job(site, body.affinities, params)
        output = stored_output(site, params)
    except ValueError as e:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=str(e)) from e
    try:
        record = state.store.create(
            network="", network_digest="", input_path=str(affinities),
            output_path=str(output), parameters=params, kind=KIND,
            stages=stage_list(params, network=False))
    except OutputBusyError as e:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=f"output {body.output!r} {e}") from e
    log_event("job.submitted", record.id, kind=KIND, input=body.affinities, output=body.output,
              validate_s=round(time.perf_counter() - t0, 4))
    return job_read(record, state.settings.data_root)
