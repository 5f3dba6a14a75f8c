"""TensorStore kvstore specs for the precomputed tests: a local path or an s3:// URL on the
tests' S3 server."""

from __future__ import annotations

from typing import Any


def kvstore(location: str, endpoint: str | None = None) -> dict[str, Any]:
    """TensorStore's kvstore of a local path or an s3:// URL on the test server."""
    if not location.startswith("s3://"):
        return {"driver": "file", "path": location + "/"}
    bucket, _, key = location[5:].partition("/")
    return {"driver": "s3", "bucket": bucket, "path": key + "/", "endpoint": endpoint,
            "aws_region": "us-east-1", "aws_credentials": {"type": "environment"}}
