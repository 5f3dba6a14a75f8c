"""Server fixtures: a data root with small volumes, models, and live servers.

`server` and `token_server` are each module's own: tests that submit, cancel or kill jobs
use them. `read_server` is one server for the whole session, for tests that only read
(networks, plans, metrics, refused requests): nothing may submit a job to it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.server_util import Server, write_models, write_volume


def _site(base: Path) -> dict:
    """A data root with volumes, a models directory and a directory outside the root."""
    root, models, outside = base / "data", base / "models", base / "outside"
    root.mkdir()
    outside.mkdir()
    params = write_models(models)
    small = write_volume(root / "small.zarr", (2, 14, 13, 11), seed=1, chunks=(2, 8, 8, 8))
    write_volume(outside / "secret.zarr", (2, 14, 13, 11), seed=2, chunks=(2, 8, 8, 8))
    write_volume(root / "one_channel.zarr", (14, 13, 11), seed=3, chunks=(8, 8, 8))
    os.symlink(outside, root / "escape")
    return {
        "base": base,
        "root": root,
        "models": models,
        "outside": outside,
        "params": params,
        "small": small,
    }


def _serve(site: dict, db: str, **kw) -> Iterator[Server]:
    srv = Server(site["root"], site["models"], site["base"] / db, **kw).start()
    try:
        yield srv
    finally:
        srv.stop()


# a shipped machine profile: /v1/plan answers without calibrating this machine
PLAN_MACHINE = ["--machine", "znni-paper"]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """This module's data root (its tests may add volumes and write outputs)."""
    return _site(tmp_path_factory.mktemp("site"))


@pytest.fixture(scope="module")
def server(site: dict) -> Iterator[Server]:
    """This module's live server on `site`."""
    yield from _serve(site, "jobs.sqlite", extra=PLAN_MACHINE)


@pytest.fixture(scope="module")
def token_server(site: dict) -> Iterator[Server]:
    """A live server that requires the bearer token "s3cret"."""
    yield from _serve(site, "token.sqlite", token="s3cret")


@pytest.fixture(scope="session")
def read_site(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The session's read-only data root: the same volumes and models as `site`."""
    return _site(tmp_path_factory.mktemp("read-site"))


@pytest.fixture(scope="session")
def read_server(read_site: dict) -> Iterator[Server]:
    """One live server on `read_site` for the whole session: only reads and refused
    requests, never a job (its job table stays empty)."""
    yield from _serve(read_site, "jobs.sqlite", extra=PLAN_MACHINE)
