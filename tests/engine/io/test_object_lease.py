"""The output lock on an object store: a lease object beside the output on a real S3-API
server (moto), refused while live, taken over once expired or its holder gone, removed at
the end of a run."""

from __future__ import annotations

import json
import socket
import time

import pytest

from znni.engine.context import StoreContext
from znni.engine.io import lock
from znni.engine.io.lock import OutputBusy, hold_output
from znni.engine.io.stores import read_bytes, write_bytes
from znni.engine.location import Location

pytestmark = pytest.mark.usefixtures("s3_env")
CTX = StoreContext()


def test_lease_refuses_a_second_run_and_is_taken_over_when_expired(s3) -> None:  # noqa: ANN001
    out = Location.parse(f"{s3.prefix()}/out.zarr")
    url = Location.parse(str(out) + lock.LOCK_SUFFIX)
    taken_at = time.time()
    held = hold_output(out, ctx=CTX)
    record = json.loads(read_bytes(url, ctx=CTX))  # type: ignore[arg-type]
    # a lease of LEASE_S from when it was put (not a speed check: a lower bound by clock)
    assert record["token"] == held.token and record["expires"] >= taken_at + lock.LEASE_S
    with pytest.raises(OutputBusy, match="pid"):
        hold_output(out, ctx=CTX)
    held.release()
    assert read_bytes(url, ctx=CTX) is None  # removed at the end of the run

    other = {"host": "elsewhere", "pid": 1, "started": "t", "token": "x"}
    write_bytes(url, json.dumps({**other, "expires": time.time() + 60}).encode(), ctx=CTX)
    with pytest.raises(OutputBusy, match="host elsewhere, pid 1"):
        hold_output(out, ctx=CTX)  # another machine's live lease
    write_bytes(url, json.dumps({**other, "expires": time.time() - 1}).encode(), ctx=CTX)
    taken = hold_output(out, ctx=CTX)  # expired: its holder died unseen
    assert json.loads(read_bytes(url, ctx=CTX))["host"] == socket.gethostname()  # type: ignore[arg-type]
    taken.release()
