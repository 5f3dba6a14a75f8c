"""Server jobs meeting a corrupt input chunk (a real chunk file overwritten with random
bytes): the job fails with the CLI's one sentence as its error, a resubmission after the
repair resumes, and `on_bad_chunk: fill` computes on and lists the chunk."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import zarr
from support.server_util import wait_job, write_volume

BAD = "c/0/1/0/1"  # channels 0:2, z 8:14, y 0:8, x 8:11


def _submit(client, output: str, **extra) -> dict:
    r = client.post("/v1/jobs", json={"network": "tiny", "input": "bad.zarr", "output": output,
                                      "chunks": [4, 4, 4], "block": [4, 8, 4], **extra})
    assert r.status_code == 201, r.text
    return r.json()


def test_corrupt_chunk_fails_the_job_in_one_sentence_then_resumes(server, site) -> None:
    write_volume(site["root"] / "bad.zarr", (2, 14, 13, 11), seed=4, chunks=(2, 8, 8, 8))
    chunk = Path(site["root"]) / "bad.zarr" / BAD
    good = chunk.read_bytes()
    chunk.write_bytes(np.random.default_rng(3).bytes(100))
    with server.client() as client:
        failed = wait_job(client, _submit(client, "out/bad.zarr")["id"], ("failed",))
        assert BAD in failed["error"] and "bad.zarr" in failed["error"]
        assert "Traceback" not in failed["error"] and "does not decode" not in failed["error"]
        assert 0 < failed["progress"]["done"] < failed["progress"]["total"]

        filled = wait_job(client, _submit(client, "out/filled.zarr", on_bad_chunk="fill")["id"],
                          ("succeeded",))
        assert filled["error"] is None
        chunk.write_bytes(good)
        again = wait_job(client, _submit(client, "out/bad.zarr")["id"], ("succeeded",))
        assert again["report"]["blocks_computed"] < again["progress"]["total"]  # resumed
    record = zarr.open_array(str(site["root"] / "out/filled.zarr")).attrs["znni"]
    assert record["bad_chunks"]["chunks"] == [BAD]
