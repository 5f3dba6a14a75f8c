"""One `Settings` for the job server: `znni serve` flags override ZNNI_* environment variables."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

DEFAULT_MAX_BODY_BYTES = 64 * 1024  # a job request is a few hundred bytes of JSON


class Settings(BaseSettings):
    """Where the server listens, which files it may touch, and who may call it."""

    model_config = SettingsConfigDict(env_prefix="ZNNI_", extra="ignore", frozen=True)

    host: str = "127.0.0.1"  # loopback by default: exposing the server is a deliberate act
    port: int = Field(default=8000, ge=0, le=65535)
    data_root: Path = Path(".")  # every job path is confined under this directory
    models: Path = Path("models")  # NAME.json + weights per network
    db: Path = Path("znni-jobs.sqlite")
    token: str | None = None  # bearer token for /v1 (ZNNI_TOKEN); None: no authentication
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, ge=1024)
    workers: int = Field(default=1, ge=0, le=64)  # job worker processes; 0: API only
    # every job's --scheduler (tcp://HOST:PORT, local:N, slurm:N, ...), or None: local
    scheduler: str | None = None
    machine: str | None = None  # MachineProfile JSON file or shipped name; None: detect
    poll_s: float = Field(default=0.2, gt=0, le=10)  # how often an idle worker looks for jobs
    # niceness of worker processes (and their threads and children): compute yields the cores
    # to request handling, so the API answers quickly while a job runs; 0 keeps equal priority
    worker_nice: int = Field(default=10, ge=0, le=19)
    log_level: str = "INFO"
    # URL prefixes jobs may read and write (s3://bucket/prefix, gs://..., http(s):// inputs);
    # ZNNI_ALLOW_URL separates several by spaces. Credentials: this server's environment only.
    allow_url: Annotated[tuple[str, ...], NoDecode] = ()

    @field_validator("allow_url", mode="before")
    @classmethod
    def _url_list(cls, value: object) -> object:
        """`ZNNI_ALLOW_URL="s3://b/p gs://c"`: prefixes separated by spaces."""
        return tuple(value.split()) if isinstance(value, str) else value

    @field_validator("allow_url")
    @classmethod
    def _url_prefixes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from znni.jobs.paths import check_url_prefix

        return tuple(check_url_prefix(v) for v in value)

    @field_validator("token", "scheduler", "machine")
    @classmethod
    def _blank_is_none(cls, value: str | None) -> str | None:
        """An empty environment variable (as compose passes `${VAR:-}`) means unset."""
        if value is not None and not value.strip():
            return None
        return value

    @field_validator("scheduler")
    @classmethod
    def _scheduler(cls, value: str | None) -> str | None:
        """Checked as `znni segment --scheduler` is (engine/scheduler.py); kept as text."""
        from znni.engine.scheduler import Scheduler

        Scheduler.of(value)
        return value

    def resolved(self) -> Settings:
        """The same settings with absolute, symlink-free directories (checked to exist)."""
        root = self.data_root.expanduser().resolve()
        if not root.is_dir():
            raise ValueError(f"data root {self.data_root} is not a directory")
        models = self.models.expanduser().resolve()
        if not models.is_dir():
            raise ValueError(f"models directory {self.models} is not a directory")
        db = self.db.expanduser().resolve()
        if not db.parent.is_dir():
            raise ValueError(f"the directory of the job database {self.db} does not exist")
        return self.model_copy(update={"data_root": root, "models": models, "db": db})
