"""The /v1 routes (docs/design.md, "HTTP API").

Status reads (one indexed SQLite SELECT in WAL mode, ~0.1 ms, never blocked by
writers) are `async def` and run on the event loop: under load, a thread hop per
poll costs more in GIL hand-offs than the query itself. Everything that may wait
(Zarr reads during validation, SQLite writes, loading networks, planning) runs in
the (bounded) thread pool. The job routes make that ONE explicit hop from an
`async def`: for a plain `def` route FastAPI hops twice (the route, then response
validation), and as the pool's tokens are handed out first come first served, each
of 50 simultaneous submissions' second hop queued behind all the others' first, so
every submission was answered only when the last one was validated.
A successful status poll is normally answered before it reaches this router, by
the short path in `fastpoll.py` (same bytes, from the same cache); the route below
answers the rest (errors, query strings) and is the one OpenAPI documents.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from znni.api.cluster_planning import cluster_asked, cluster_record
from znni.api.metrics import RequestCounter
from znni.api.planning import JobShape, PlannerUnavailableError, plan_summary
from znni.api.schemas import (
    ErrorRead,
    JobCreate,
    JobList,
    JobRead,
    JobStatus,
    NetworkList,
    NetworkRead,
    PlanRead,
    PlanRequest,
)
from znni.api.security import token_matches
from znni.api.views import JobJsonCache, job_read
from znni.engine.context import StoreContext
from znni.engine.location import Location
from znni.jobs.agglomeration import Site, check_stage, stage_list
from znni.jobs.catalogue import NetworkCatalogue, UnknownNetworkError, describe
from znni.jobs.events import log_event
from znni.jobs.paths import relative_to_root
from znni.jobs.settings import Settings
from znni.jobs.store import JobStore, OutputBusyError
from znni.jobs.submission import check_submission, plan_form, plan_volume
from znni.jobs.worker import WorkerPool

MAX_ID = 2**62  # SQLite integers are 64-bit; larger ids cannot exist


@dataclass
class ServerState:
    settings: Settings
    store: JobStore
    catalogue: NetworkCatalogue
    pool: WorkerPool
    requests: RequestCounter
    job_json: JobJsonCache
    # the server's store context: its caches keep opened arrays between requests
    stores: StoreContext = field(default_factory=StoreContext)

    def site(self) -> Site:
        """Where this server's jobs live, for the agglomeration checks."""
        s = self.settings
        return Site(s.data_root, s.allow_url, s.scheduler, self.stores)


async def get_state(request: Request) -> ServerState:
    """Async on purpose: trivial dependencies run on the event loop, not in the thread pool."""
    return request.app.state.znni


_bearer = HTTPBearer(auto_error=False, description="needed when the server has a token")


async def require_token(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """401 unless the configured token is given as `Authorization: Bearer TOKEN`."""
    token = request.app.state.znni.settings.token
    if token is None:
        return
    header = f"Bearer {credentials.credentials}" if credentials is not None else None
    if not token_matches(token, header):
        reason = "missing" if credentials is None else "wrong"
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail=f"{reason} bearer token: send 'Authorization: Bearer TOKEN'",
            headers={"WWW-Authenticate": "Bearer"},
        )


async def known_query(request: Request) -> None:
    """422 for a query parameter the route does not take: a misspelt filter, or `?z=10` for
    `?axis=z&index=10`, would otherwise be ignored without a word."""
    route = request.scope.get("route")
    if not request.query_params or route is None:
        return
    known = set(_query_names(route.dependant))
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        takes = ", ".join(sorted(known)) if known else "no query parameters"
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_ENTITY,
            detail=f"unknown query parameter {unknown[0]!r} for {request.method} "
            f"{route.path}; it takes {takes}",
        )


def _query_names(dependant: Any) -> list[str]:
    """The query parameter names of a route's dependant and of its sub-dependencies."""
    names = [p.alias for p in dependant.query_params]
    return names + [n for sub in dependant.dependencies for n in _query_names(sub)]


StateDep = Annotated[ServerState, Depends(get_state)]
JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="job id")]
NetworkPath = Annotated[str, Path(max_length=128, description="network name")]

ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorRead} for code in (400, 401, 404, 409, 413, 422)
}

router = APIRouter(
    prefix="/v1", dependencies=[Depends(require_token), Depends(known_query)], responses=ERRORS
)


@router.post("/jobs", status_code=status.HTTP_201_CREATED, response_model=JobRead)
async def create_job(body: JobCreate, state: StateDep) -> JobRead:
    """Validate everything (nothing is stored on a 4xx), then queue the job."""
    return await run_in_threadpool(_create_job, body, state)


def _create_job(body: JobCreate, state: ServerState) -> JobRead:
    settings = state.settings
    t0 = time.perf_counter()
    params = body.model_dump(exclude={"network", "input", "output"}, mode="json")
    try:
        network, job = check_submission(
            state.catalogue,
            settings.data_root,
            network=body.network,
            input=body.input,
            output=body.output,
            params=body.model_dump(exclude={"network", "input", "output"}),
            scheduler=settings.scheduler,
            allow_url=settings.allow_url,
            store=state.stores,
        )
        if body.agglomerate is not None:  # a second stage: checked as far as it can be now
            check_stage(state.site(), network, body.network, job, params)
    except ValueError as e:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=str(e)) from e
    try:
        record = state.store.create(
            network=body.network,
            network_digest=network.digest,
            input_path=str(job.input_path),  # stored as text, parsed again by the runner
            output_path=str(job.output_path),
            parameters=params,
            stages=None if body.agglomerate is None else stage_list(params, network=True),
        )
    except OutputBusyError as e:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=f"output {body.output!r} {e}") from e
    log_event(
        "job.submitted",
        record.id,
        network=body.network,
        input=body.input,
        output=body.output,
        validate_s=round(time.perf_counter() - t0, 4),
    )
    return job_read(record, settings.data_root)


@router.get("/jobs", response_model=JobList)
async def list_jobs(
    state: StateDep,
    status_filter: Annotated[JobStatus | None, Query(alias="status")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_ID)] = 0,
) -> JobList:
    records, total = state.store.list(status_filter, limit, offset)
    return JobList(jobs=[job_read(r, state.settings.data_root) for r in records], total=total)


@router.get("/jobs/{job_id}", response_model=JobRead)
async def get_job(job_id: JobId, request: Request) -> Response:
    """The status poll: the cached JSON of the job's row while the row is unchanged.

    The state comes from `request` (not `StateDep`: each dependency costs ~10 us a poll).
    """
    state: ServerState = request.app.state.znni
    row = state.store.get_row(job_id)
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no job with id {job_id}")
    return Response(state.job_json.body(row), media_type="application/json")


@router.post("/jobs/{job_id}/cancel", response_model=JobRead)
async def cancel_job(job_id: JobId, state: StateDep) -> JobRead:
    """Queued: cancelled now. Running: stops after its current block, keeping finished ones."""
    return await run_in_threadpool(_cancel_job, job_id, state)


def _cancel_job(job_id: int, state: ServerState) -> JobRead:
    before = state.store.get(job_id)
    if before is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no job with id {job_id}")
    if before.status in ("succeeded", "failed"):
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            detail=f"job {job_id} already {before.status}; nothing to cancel",
        )
    record = state.store.request_cancel(job_id)
    if record is None:  # cannot happen while jobs are never deleted; answer sensibly anyway
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no job with id {job_id}")
    if before.status != "cancelled":
        log_event("job.cancel_requested", job_id, status=record.status)
    return job_read(record, state.settings.data_root)


@router.get(
    "/jobs/{job_id}/preview.png",
    response_class=Response,
    responses={200: {"content": {"image/png": {}}, "description": "a PNG of one slice"}},
)
async def job_preview(
    job_id: JobId,
    state: StateDep,
    axis: Annotated[Literal["z", "y", "x"], Query()] = "z",
    index: Annotated[int | None, Query(ge=0, le=2**31)] = None,
) -> Response:
    """One slice of a running or finished job's output over its input (done blocks only
    hold values; the rest read as zero). Rendering runs in the thread pool."""
    return await run_in_threadpool(_job_preview, job_id, state, axis, index)


def _job_preview(job_id: int, state: ServerState, axis: str, index: int | None) -> Response:
    from znni.engine.output.preview import preview_png

    record = state.store.get(job_id)
    if record is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no job with id {job_id}")
    if record.status not in ("running", "succeeded") and record.started_at is None:
        raise HTTPException(status.HTTP_409_CONFLICT,
                            detail=f"job {job_id} is {record.status} and has no output yet")
    try:
        png = preview_png(Location.parse(record.output_path, "output"), axis, index,
                          ctx=state.stores)
    except FileNotFoundError as e:  # started, but no output array yet
        detail = relative_to_root(state.settings.data_root, str(e))
        raise HTTPException(status.HTTP_409_CONFLICT, detail=detail) from e
    except ValueError as e:  # e.g. a slice index outside the volume
        detail = relative_to_root(state.settings.data_root, str(e))
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=detail) from e
    return Response(png, media_type="image/png")


@router.get("/networks", response_model=NetworkList)
def list_networks(state: StateDep) -> NetworkList:
    """Every loadable network in the models directory (JSON specs and ONNX models)."""
    catalogue = state.catalogue
    items = []
    for name in catalogue.names():
        try:
            items.append(NetworkRead.model_validate(describe(name, catalogue.get(name))))
        except ValueError:
            continue  # logged by the catalogue; GET /v1/networks/{name} names the problem
    return NetworkList(networks=items)


@router.get("/networks/{name}", response_model=NetworkRead)
def get_network(name: NetworkPath, state: StateDep) -> NetworkRead:
    try:
        network = state.catalogue.get(name)
    except UnknownNetworkError as e:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=str(e)) from e
    except ValueError as e:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=str(e)) from e
    return NetworkRead.model_validate(describe(name, network))


@router.post("/plan", response_model=PlanRead)
def plan(body: PlanRequest, state: StateDep) -> PlanRead:
    """What would run for this network on this server's machine: the planner's plan (exact
    mode) or the window a windowed model would use; with an input, the whole run as the
    job with these fields would make it (labels, mask and skip_empty checked as a job's)."""
    settings = state.settings
    try:
        network = state.catalogue.get(body.network)
        job, region = JobShape(1, body.dtype, body.chunks, body.precision, body.tta), None
        if body.input is not None:
            volume = plan_volume(settings.data_root, settings.allow_url, network, body.input,
                                 body.roi, body.level, store=state.stores)
            region = volume.region
            job = replace(job, in_bytes=volume.in_bytes, lo=volume.lo, volume=volume.shape)
        elif any(v is not None for v in (body.roi, body.level, body.chunks)):
            raise ValueError("roi, level and chunks need an input, the volume to plan for")
        form = plan_form(settings.data_root, settings.allow_url, network,
                         body.model_dump(include={"labels", "dtype", "mask", "skip_empty"}),
                         job.volume, store=state.stores)
        job = replace(job, form=form, labels=body.labels, mask=body.mask,
                      skip_empty=body.skip_empty)
        cluster = cluster_asked(body.workers, body.deadline, body.store_bandwidth,
                                body.queue_wait, region is not None)
        result = plan_summary(network, settings, body.device, body.memory_limit_bytes,
                              region, body.overlap, body.window, job=job)
        if cluster:  # the job on a Dask cluster, as `znni plan --workers --json` gives it
            result["cluster"] = cluster_record(
                result, network, settings, job, workers=body.workers,
                placement=body.placement, store_bandwidth=body.store_bandwidth,
                queue_wait=body.queue_wait, deadline=body.deadline,
                memory_limit_bytes=body.memory_limit_bytes)
    except ValueError as e:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=str(e)) from e
    except PlannerUnavailableError as e:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, detail=str(e)) from e
    return PlanRead(network=body.network, plan=result)
