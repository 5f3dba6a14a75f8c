"""Schemathesis generates requests from the live server's OpenAPI schema: none may get a 5xx.

On the session's read-only server: generated requests are refused or read, they create no job.
Driven through Hypothesis directly (one test per operation, bounded examples), because
schemathesis' pytest plugin does not support this pytest version.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

MAX_EXAMPLES = 30


@pytest.fixture(scope="module")
def operations(read_server) -> dict:
    schema = schemathesis.openapi.from_url(f"{read_server.url}/openapi.json")
    ops = {}
    for result in schema.get_all_operations():
        op = result.ok()
        ops[f"{op.method.upper()} {op.path}"] = op
    return ops


EXPECTED = [
    "POST /v1/jobs",
    "POST /v1/agglomerate",
    "GET /v1/jobs",
    "GET /v1/jobs/{job_id}",
    "POST /v1/jobs/{job_id}/cancel",
    "GET /v1/jobs/{job_id}/preview.png",
    "GET /v1/jobs/{job_id}/throughput",
    "GET /v1/jobs/{job_id}/blocks",
    "GET /v1/machine",
    "GET /v1/networks",
    "GET /v1/networks/{name}",
    "POST /v1/plan",
    "GET /healthz",
    "GET /metrics",
]


def test_schema_lists_every_route(operations) -> None:
    assert sorted(operations) == sorted(EXPECTED)


@pytest.mark.parametrize("name", EXPECTED)
def test_no_server_errors(operations, read_server, name) -> None:
    operation = operations[name]

    @given(case=operation.as_strategy())
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    def run(case) -> None:
        case.call_and_validate(base_url=read_server.url, checks=[not_a_server_error])

    run()


def test_zz_fuzzing_really_sent_requests(read_server) -> None:
    import httpx

    text = httpx.get(f"{read_server.url}/metrics").text
    sent = sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("znni_http_responses_total")
    )
    assert sent >= 100
