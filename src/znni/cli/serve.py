"""`znni serve`: the HTTP job server (FastAPI + uvicorn), bound to 127.0.0.1 by default."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when the server starts, not with the CLI
    from znni.jobs.settings import Settings

FLAGS = (
    "host",
    "port",
    "data_root",
    "models",
    "db",
    "token",
    "workers",
    "max_body_bytes",
    "scheduler",
    "machine",
    "worker_nice",
    "allow_url",
)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "serve",
        help="run the HTTP job server",
        description="Serve the job API; flags override ZNNI_* environment variables.",
    )
    p.add_argument("--host", help="address to bind (default 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, help="TCP port (default 8000)")
    p.add_argument("--data-root", type=Path, help="every job path is confined to this directory")
    p.add_argument("--models", type=Path, help="directory of NAME.json network specs + weights")
    p.add_argument("--db", type=Path, help="SQLite job database (default znni-jobs.sqlite)")
    p.add_argument("--token", help="require 'Authorization: Bearer TOKEN' (or set ZNNI_TOKEN)")
    p.add_argument("--workers", type=int, help="job worker processes (default 1)")
    p.add_argument("--max-body-bytes", type=int, help="largest accepted request body")
    p.add_argument("--scheduler", help="every job's Dask workers: tcp://HOST:PORT, local:N, "
                   "or a batch cluster from your jobqueue.yaml, slurm:N (pbs, lsf, sge) "
                   "(default: local)")
    p.add_argument("--machine", help="machine profile JSON (or shipped name) for the planner")
    p.add_argument(
        "--worker-nice",
        type=int,
        help="niceness 0-19 of the job workers (default 10: requests preempt compute)",
    )
    p.add_argument("--allow-url", action="append", metavar="PREFIX",
                   help="let jobs read and write URLs under PREFIX, e.g. s3://bucket/prefix "
                   "(repeatable; credentials from this server's environment)")
    p.set_defaults(run=run)


def settings_from_args(args: argparse.Namespace) -> Settings:
    from pydantic import ValidationError

    from znni.jobs.settings import Settings

    given = {k: getattr(args, k) for k in FLAGS if getattr(args, k, None) is not None}
    try:
        return Settings(**given)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ValueError(f"setting {where}: {first['msg']}") from None


def check_scheduler(text: str | None) -> None:
    """A batch cluster (slurm:N, ...) that cannot be asked for from here is refused before
    the server starts (its jobs' worker size is checked per job, at submission)."""
    from znni.engine.scheduler import Scheduler
    from znni.engine.sweep.batch import check_batch

    scheduler = Scheduler.of(text)
    if scheduler is not None and scheduler.is_batch:
        check_batch(scheduler)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from znni.api.app import create_app

    settings = settings_from_args(args)
    check_scheduler(settings.scheduler)
    app = create_app(settings)
    s = app.state.znni.settings
    uvicorn.run(
        app,
        host=s.host,
        port=s.port,
        log_level="debug" if args.verbose else "info",
        timeout_graceful_shutdown=15,
        access_log=args.verbose,  # per-request lines cost ~1 ms each; job events are logged
    )
    return 0
