"""Server fixtures: a data root with small volumes, models, and one shared live server."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from support.server_util import Server, write_models, write_volume


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A data root with volumes, a models directory and a directory outside the root."""
    base = tmp_path_factory.mktemp("site")
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


@pytest.fixture(scope="module")
def server(site: dict) -> Iterator[Server]:
    # a shipped machine profile: /v1/plan answers without calibrating this machine
    srv = Server(
        site["root"],
        site["models"],
        site["base"] / "jobs.sqlite",
        extra=["--machine", "znni-paper"],
    ).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def token_server(site: dict) -> Iterator[Server]:
    """A live server that requires the bearer token "s3cret"."""
    srv = Server(site["root"], site["models"], site["base"] / "token.sqlite", token="s3cret")
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
