"""A catalogue of bad requests: each gets a 4xx whose `detail` names the problem, nothing is
written (inside or outside the data root), no job is stored, and the server keeps serving."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import zarr
from support.server_util import wait_job

OK = {"network": "tiny", "input": "small.zarr", "output": "new.zarr"}


def job(**changes: object) -> dict:
    body = {**OK, **changes}
    return {k: v for k, v in body.items() if v is not None}


# (name, method, path, json body or raw bytes, expected status, words the detail must contain)
CASES: list[tuple[str, str, str, object, int, tuple[str, ...]]] = [
    ("unknown network", "POST", "/v1/jobs", job(network="nope"), 422, ("unknown network", "nope")),
    ("network name with a path", "POST", "/v1/jobs", job(network="../tiny"), 422, ("network",)),
    ("broken network spec", "POST", "/v1/jobs", job(network="broken"), 422, ("broken", "JSON")),
    (
        "missing input",
        "POST",
        "/v1/jobs",
        job(input="missing.zarr"),
        422,
        ("missing.zarr", "does not exist"),
    ),
    ("input not a Zarr array", "POST", "/v1/jobs", job(input="plain_dir"), 422, ("plain_dir",)),
    ("input is a file", "POST", "/v1/jobs", job(input="notes.txt"), 422, ("notes.txt",)),
    ("wrong channel count", "POST", "/v1/jobs", job(input="one_channel.zarr"), 422, ("channel",)),
    (
        "ROI outside the volume",
        "POST",
        "/v1/jobs",
        job(roi=[[0, 99], [0, 5], [0, 5]]),
        422,
        ("ROI", "outside"),
    ),
    ("ROI with two ranges", "POST", "/v1/jobs", job(roi=[[0, 5], [0, 5]]), 422, ("roi",)),
    ("'..' escapes the root", "POST", "/v1/jobs", job(output="../outside/x.zarr"), 422, ("'..'",)),
    ("absolute path", "POST", "/v1/jobs", job(input="/etc/passwd"), 422, ("absolute",)),
    (
        "symlink out of the root",
        "POST",
        "/v1/jobs",
        job(input="escape/secret.zarr"),
        422,
        ("outside the data root",),
    ),
    (
        "output through a symlink out",
        "POST",
        "/v1/jobs",
        job(output="escape/new.zarr"),
        422,
        ("outside the data root",),
    ),
    ("output is the data root", "POST", "/v1/jobs", job(output="."), 422, ("data root itself",)),
    ("NUL byte in a path", "POST", "/v1/jobs", job(output="a\x00b.zarr"), 422, ("NUL",)),
    ("output is the input", "POST", "/v1/jobs", job(output="small.zarr"), 422, ("overlap",)),
    (
        "output exists without overwrite",
        "POST",
        "/v1/jobs",
        job(output="existing.zarr"),
        422,
        ("existing.zarr", "overwrite"),
    ),
    (
        "chunks other than the existing output's",
        "POST",
        "/v1/jobs",
        job(output="existing.zarr", overwrite=True, chunks=[4, 4, 4]),
        422,
        ("chunks (4, 4, 4)", "existing.zarr", "(8, 8, 8)"),
    ),
    ("malformed JSON", "POST", "/v1/jobs", b'{"network": "tiny",', 400, ("not valid JSON",)),
    ("body is a list", "POST", "/v1/jobs", [OK], 422, ("body",)),
    ("wrong type", "POST", "/v1/jobs", job(input=5), 422, ("input", "string")),
    ("missing field", "POST", "/v1/jobs", job(output=None), 422, ("output", "required")),
    ("unknown field", "POST", "/v1/jobs", job(colour="red"), 422, ("colour",)),
    ("bad border mode", "POST", "/v1/jobs", job(border="mirror"), 422, ("border",)),
    ("zero chunk size", "POST", "/v1/jobs", job(chunks=[0, 4, 4]), 422, ("chunks",)),
    (
        "oversized body",
        "POST",
        "/v1/jobs",
        job(output="x" * 1000, pad="y" * 70_000),
        413,
        ("exceeds",),
    ),
    ("unknown job", "GET", "/v1/jobs/999999", None, 404, ("999999",)),
    ("job id not a number", "GET", "/v1/jobs/abc", None, 422, ("job_id",)),
    ("job id too large", "GET", "/v1/jobs/99999999999999999999999", None, 422, ("job_id",)),
    ("cancel unknown job", "POST", "/v1/jobs/424242/cancel", None, 404, ("424242",)),
    ("unknown status filter", "GET", "/v1/jobs?status=lost", None, 422, ("status",)),
    (
        "misspelt query parameter",
        "GET",
        "/v1/jobs?stauts=running",
        None,
        422,
        ("unknown query parameter 'stauts'", "limit, offset, status"),
    ),
    (
        "the CLI's --z as a query parameter",
        "GET",
        "/v1/jobs/1/preview.png?z=3",
        None,
        422,
        ("'z'", "axis, index"),
    ),
    ("unknown network page", "GET", "/v1/networks/nope", None, 404, ("nope",)),
    ("plan for unknown network", "POST", "/v1/plan", {"network": "nope"}, 422, ("nope",)),
]


def listing(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


@pytest.fixture(scope="module")
def prepared(site: dict) -> dict:
    root = site["root"]
    (root / "plain_dir").mkdir()
    (root / "notes.txt").write_text("not an array")
    existing = zarr.create_array(
        str(root / "existing.zarr"), shape=(2, 14, 13, 11), chunks=(2, 8, 8, 8), dtype="float32"
    )
    existing[...] = 0.5
    return site


def send(client: httpx.Client, method: str, path: str, body: object) -> httpx.Response:
    if isinstance(body, bytes):
        return client.request(
            method, path, content=body, headers={"content-type": "application/json"}
        )
    return client.request(method, path, json=body)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_request_gets_4xx_naming_the_problem(server, prepared, case) -> None:
    name, method, path, body, code, words = case
    root, outside = prepared["root"], prepared["outside"]
    before_root, before_outside = listing(root), listing(outside)
    with server.client() as client:
        jobs_before = client.get("/v1/jobs").json()["total"]
        r = send(client, method, path, body)
        assert r.status_code == code, f"{name}: {r.status_code} {r.text}"
        detail = r.json()["detail"]
        assert isinstance(detail, str)
        for word in words:
            assert word.lower() in detail.lower(), f"{name}: {detail!r} lacks {word!r}"
        assert client.get("/v1/jobs").json()["total"] == jobs_before  # nothing stored
        assert client.get("/healthz").status_code == 200  # still serving
    assert listing(root) == before_root and listing(outside) == before_outside


def test_catalogue_is_large_enough() -> None:
    assert len(CASES) >= 15


def test_oversized_chunked_body_is_refused(server) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"network": "tiny", "pad": "'
        for _ in range(100):
            yield b"z" * 1024
        yield b'"}'

    with server.client() as client:
        r = client.post("/v1/jobs", content=chunks(), headers={"content-type": "application/json"})
        assert r.status_code == 413 and "exceeds" in r.json()["detail"]
        assert client.get("/healthz").status_code == 200


def test_busy_output_and_finished_job_conflicts(server, prepared) -> None:
    with server.client() as client:
        first = client.post("/v1/jobs", json=job(output="busy.zarr", chunks=[2, 2, 2]))
        assert first.status_code == 201, first.text
        clash = client.post("/v1/jobs", json=job(output="busy.zarr", overwrite=True))
        assert clash.status_code == 409 and "being written by job" in clash.json()["detail"]
        wait_job(client, first.json()["id"], ("succeeded",))
        r = client.post(f"/v1/jobs/{first.json()['id']}/cancel")
        assert r.status_code == 409 and "already succeeded" in r.json()["detail"]
        again = client.post("/v1/jobs", json=job(output="busy.zarr"))
        assert again.status_code == 201  # its own finished run: a no-op resume


def test_overwrite_true_replaces_an_existing_output(server, prepared) -> None:
    with server.client() as client:
        r = client.post("/v1/jobs", json=job(output="existing.zarr", overwrite=True))
        assert r.status_code == 201, r.text
        wait_job(client, r.json()["id"], ("succeeded",))
    out = zarr.open_array(str(prepared["root"] / "existing.zarr"), mode="r")[...]
    assert not np.any(out == 0.5)


@pytest.mark.parametrize(
    ("headers", "word"),
    [
        ({}, "missing"),
        ({"Authorization": "Bearer wrong"}, "wrong"),
        ({"Authorization": "Basic czNjcmV0"}, "missing"),
        ({"Authorization": "Bearer s3cret0"}, "wrong"),
    ],
)
def test_token_required_on_v1(token_server, headers, word) -> None:
    for method, path in (("GET", "/v1/jobs"), ("GET", "/v1/networks"), ("POST", "/v1/jobs")):
        r = httpx.request(method, token_server.url + path, headers=headers, json=OK)
        assert r.status_code == 401, (method, path, r.text)
        assert word in r.json()["detail"] and r.headers["www-authenticate"] == "Bearer"
    assert httpx.get(token_server.url + "/healthz").status_code == 200  # probes stay open
    good = httpx.get(token_server.url + "/v1/networks", headers={"Authorization": "Bearer s3cret"})
    assert good.status_code == 200


def test_env_token_is_read(token_server) -> None:
    assert "ZNNI_TOKEN" not in os.environ  # the server got it from its own environment
    assert httpx.get(token_server.url + "/v1/jobs").status_code == 401
