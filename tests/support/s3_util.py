"""A real S3-API server on 127.0.0.1 for tests: moto's server, with IAM authentication on.

`MotoS3.start()` runs moto's `ThreadedMotoServer` in this process, creates a user with
full S3 rights (`rw`), one that may only read (`ro`) and the bucket `znni-test`, then turns
authentication on, so wrong credentials are refused as AWS refuses them. `env()` is the
environment a client (a `znni` subprocess, a Dask worker) needs: the endpoint in
AWS_ENDPOINT_URL and the keys in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY. `restart()`
stops the server and starts a new one on the same port; moto keeps its state in this
process, so buckets and objects survive, as they do when a real S3 service restarts.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

from support.server_util import free_port

BUCKET = "znni-test"
REGION = "us-east-1"


@dataclass
class MotoS3:
    port: int = 0
    keys: dict[str, tuple[str, str]] = field(default_factory=dict)
    server: Any = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> MotoS3:
        from moto.server import ThreadedMotoServer

        self.port = self.port or free_port()
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def setup(self) -> MotoS3:
        """Users rw and ro, the test bucket, then authentication on for every request."""
        self._auth("inf")
        admin = self.client("iam", ("admin", "admin"))
        for name, actions in (("rw", ["s3:*"]), ("ro", ["s3:GetObject", "s3:ListBucket"])):
            admin.create_user(UserName=name)
            policy = {"Version": "2012-10-17", "Statement": [
                {"Effect": "Allow", "Action": actions, "Resource": "*"}]}
            admin.put_user_policy(UserName=name, PolicyName="p",
                                  PolicyDocument=json.dumps(policy))
            key = admin.create_access_key(UserName=name)["AccessKey"]
            self.keys[name] = (key["AccessKeyId"], key["SecretAccessKey"])
        self.client("s3", self.keys["rw"]).create_bucket(Bucket=BUCKET)
        self._auth("0")
        return self

    def _auth(self, count: str) -> None:
        """Authenticate every request after `count` more (moto's reset-auth)."""
        httpx.post(f"{self.endpoint}/moto-api/reset-auth", content=count.encode()).raise_for_status()

    def client(self, service: str, key: tuple[str, str] | None = None) -> Any:
        import boto3

        key = key or self.keys["rw"]
        return boto3.client(service, endpoint_url=self.endpoint, region_name=REGION,
                            aws_access_key_id=key[0], aws_secret_access_key=key[1])

    def env(self, user: str = "rw") -> dict[str, str]:
        key = self.keys.get(user, ("AKIAWRONGWRONGWRONG", "wrong"))
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": key[0],
                "AWS_SECRET_ACCESS_KEY": key[1], "AWS_DEFAULT_REGION": REGION}

    def prefix(self) -> str:
        """A fresh s3:// prefix in the test bucket."""
        return f"s3://{BUCKET}/{uuid.uuid4().hex[:12]}"

    def keys_under(self, url: str) -> list[str]:
        """Every object key under an s3:// URL (listed as the rw user)."""
        prefix = url.split("/", 3)[3].rstrip("/") + "/"
        pages = self.client("s3").get_paginator("list_objects_v2").paginate(
            Bucket=BUCKET, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]
