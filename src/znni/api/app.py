"""The FastAPI application: `create_app(settings)` wires store, networks, workers and routes."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
from fastapi import FastAPI, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from znni.api import agglomeration, insight, metrics, pages
from znni.api.fastpoll import StatusPollFastPath
from znni.api.metrics import RequestCounter
from znni.api.routes import ServerState, router
from znni.api.schemas import Health
from znni.api.security import BodyLimitMiddleware
from znni.api.views import JobJsonCache
from znni.jobs.catalogue import NetworkCatalogue
from znni.jobs.events import log_event
from znni.jobs.settings import Settings
from znni.jobs.store import JobStore
from znni.jobs.worker import WorkerPool

log = logging.getLogger("znni.server")

SUPERVISE_INTERVAL_S = 1.0
THREADS = 2  # 4 measured slower under load: the GIL serialises them anyway, with more hand-offs


def create_app(settings: Settings, *, start_workers: bool = True) -> FastAPI:
    """The app for these settings; raises ValueError when its directories are unusable."""
    settings = settings.resolved()
    state = ServerState(
        settings=settings,
        store=JobStore(settings.db),
        catalogue=NetworkCatalogue(settings.models),
        pool=WorkerPool(settings),
        requests=RequestCounter(),
        job_json=JobJsonCache(settings.data_root),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # few threads for the blocking routes: many would only contend for the GIL
        anyio.to_thread.current_default_thread_limiter().total_tokens = THREADS
        await asyncio.to_thread(_settle_heap)
        supervisor = None
        if start_workers:
            state.pool.start()
            supervisor = asyncio.create_task(_supervise(state.pool))
        log_event(
            "server.started",
            data_root=str(settings.data_root),
            workers=settings.workers,
            auth=settings.token is not None,
        )
        try:
            yield
        finally:
            if supervisor is not None:
                supervisor.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await supervisor
            await asyncio.to_thread(state.pool.shutdown)
            log_event("server.stopped")

    app = FastAPI(
        title="znni",
        version="0.1.0",
        summary="Dense 3D ConvNet inference jobs over Zarr volumes",
        lifespan=lifespan,
    )
    app.state.znni = state
    app.include_router(router)
    app.include_router(agglomeration.router)  # POST /v1/agglomerate
    app.include_router(insight.router)
    app.include_router(pages.router)  # the dashboard: GET / and /static/*
    app.add_exception_handler(
        RequestValidationError,
        _validation_error,  # type: ignore[arg-type]  # starlette types any handler's exc as Exception
    )
    _add_health_routes(app)
    app.add_middleware(StatusPollFastPath, state=state)  # innermost: counted, body-limited
    app.add_middleware(_CountResponses, counter=state.requests)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    return app


def _settle_heap() -> None:
    """Import what validating a submission needs, then exempt the heap from the cyclic GC.

    The ~100k objects of the imported modules (FastAPI, pydantic, numpy, zarr, the
    planner) live as long as the server; a full collection walks all of them (25-60 ms
    measured here) and fell inside a burst of requests. Frozen, they are never walked
    again. Importing the engine and zarr now also spares the first submission that cost.
    """
    import znni.engine.segment  # noqa: F401 - the validation path
    from znni.engine.io.zarr_arrays import import_zarr

    import_zarr()  # the engine opens every input with it

    gc.collect()
    gc.freeze()


def _add_health_routes(app: FastAPI) -> None:
    @app.get("/healthz", response_model=Health)
    async def healthz(request: Request) -> Health:
        state: ServerState = request.app.state.znni
        return Health(status="ok", workers_alive=state.pool.alive(), workers=state.settings.workers)

    @app.get("/metrics", response_class=PlainTextResponse)
    def prometheus(request: Request) -> PlainTextResponse:
        state: ServerState = request.app.state.znni
        text = metrics.render(state.store, state.requests, state.pool.alive())
        return PlainTextResponse(text, media_type=metrics.CONTENT_TYPE)


async def _supervise(pool: WorkerPool) -> None:
    while True:
        await asyncio.sleep(SUPERVISE_INTERVAL_S)
        pool.supervise()


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    """422 with one readable `detail` sentence (400 when the body is not JSON at all)."""
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        ctx: dict[str, Any] = next(
            (e.get("ctx", {}) for e in errors if e.get("type") == "json_invalid"), {})
        detail = f"request body is not valid JSON ({ctx.get('error', 'parse error')})"
        return JSONResponse({"detail": detail}, status_code=status.HTTP_400_BAD_REQUEST)
    parts = []
    for e in errors[:5]:
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    detail = "; ".join(parts) + (f" (and {len(errors) - 5} more)" if len(errors) > 5 else "")
    safe = [
        {"loc": list(e.get("loc", ())), "msg": e.get("msg"), "type": e.get("type")} for e in errors
    ]
    return JSONResponse(
        {"detail": detail, "errors": safe}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT
    )


class _CountResponses:
    """Counts responses by status class for /metrics."""

    def __init__(self, app: ASGIApp, counter: RequestCounter) -> None:
        self.app = app
        self.counter = counter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.counter.observe(int(message["status"]))
            await send(message)

        await self.app(scope, receive, counting_send)
