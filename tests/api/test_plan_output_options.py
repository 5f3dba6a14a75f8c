"""`POST /v1/plan` takes a job's output options (`labels`, `mask`, `skip_empty`), checked as a
job checks them, against the real server: labels change the stored channels and dtype, a
mask's blocks wholly outside are not computed (the same count and whole-run time as
`znni plan --input --mask` and the engine's mask arithmetic give), skip_empty is shown but
not counted, and bad values get a 422 whose `detail` is one sentence, nothing written."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest
import zarr
from support.server_util import wait_job

from znni.api.schemas import JobCreate, PlanRequest
from znni.cli import main
from znni.engine.context import StoreContext
from znni.engine.location import Location
from znni.engine.output.form import make_form

SHAPE = (64, 64, 64)  # plan_in.zarr: (2, 64, 64, 64); chunks 16: a layout of several blocks
BODY = {"network": "tiny", "device": "cpu", "input": "plan_in.zarr", "chunks": [16, 16, 16]}
# JobCreate's fields that POST /v1/plan does not take (docs/design.md, "HTTP API")
NOT_PLANNED = {"output", "border", "block", "overwrite", "blend", "scale", "shift",
               "output_name", "output_format", "pyramid", "on_bad_chunk", "agglomerate"}


def _searchless(plan: dict) -> float:
    """The whole run predicted without the planner's search, which each process measures
    anew (planning_s): two processes planning one job agree on the rest."""
    return plan["predicted_job_seconds"] - plan["job_seconds"].get("planning_s", 0.0)


@pytest.fixture(scope="module")
def volumes(site: dict) -> dict:
    """An input, a mask off for z < 32 (a mask voxel is 2^3 input voxels) and a mask whose
    shape does not divide the input's."""
    root = site["root"]
    x = np.random.default_rng(4).standard_normal((2, *SHAPE)).astype(np.float32)
    zarr.create_array(str(root / "plan_in.zarr"), data=x, chunks=(2, 16, 16, 16))
    half = np.ones((32, 32, 32), np.uint8)
    half[:16] = 0
    zarr.create_array(str(root / "plan_mask.zarr"), data=half, chunks=(16, 32, 32))
    zarr.create_array(str(root / "plan_bad_mask.zarr"), data=np.ones((5, 32, 32), np.uint8),
                      chunks=(5, 32, 32))
    return {"root": root, "mask": "plan_mask.zarr", "bad": "plan_bad_mask.zarr"}


def _plan(client, **changes) -> dict:  # noqa: ANN001
    r = client.post("/v1/plan", json={**BODY, **changes})
    assert r.status_code == 200, r.text
    return r.json()["plan"]


def _cli_plan(root: Path, *extra: str) -> dict:
    """`znni plan --json` for BODY on the server's machine profile (conftest.PLAN_MACHINE)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["plan", str(root.parent / "models" / "tiny.json"), "--device", "cpu",
                   "--machine", "znni-paper", "--input", str(root / "plan_in.zarr"),
                   "--chunks", "16,16,16", "--json", *extra])
    assert rc == 0
    return json.loads(out.getvalue())


def _outside(root: Path, mask: str, edges: list, shape: tuple = SHAPE) -> frozenset[int]:
    """The engine's blocks wholly outside `mask` in a plan's layout (output.form)."""
    form = make_form(None, "float32", Location.parse(root / mask), None, 2, shape,
                     ctx=StoreContext())
    return form.outside(tuple(tuple(e) for e in edges))


def test_labels_set_the_stored_channels_and_dtype(server, volumes: dict) -> None:  # noqa: ANN001
    with server.client() as client:
        floats = _plan(client)
        labels = _plan(client, labels="argmax")
        threshold = _plan(client, labels="threshold:0.5:1")
        bare = client.post("/v1/plan", json={"network": "tiny", "device": "cpu",
                                             "labels": "argmax"})
    assert "labels" not in floats and "output_dtype" not in floats
    assert (labels["labels"], labels["output_channels"], labels["output_dtype"]) == (
        "argmax", 1, "uint8")
    assert (threshold["output_channels"], threshold["output_dtype"]) == (1, "uint8")
    assert labels["mask"] is None and labels["blocks_outside_mask"] == 0
    # the whole run writes the labels: as `znni plan --labels` times them
    cli = _cli_plan(volumes["root"], "--labels", "argmax")
    assert _searchless(labels) == pytest.approx(_searchless(cli))
    assert labels["job_seconds"]["io_total_s"] != floats["job_seconds"]["io_total_s"]
    # without an input: checked and shown, nothing to time
    assert bare.status_code == 200, bare.text
    assert bare.json()["plan"]["output_dtype"] == "uint8"


def test_mask_blocks_are_not_computed(server, volumes: dict) -> None:  # noqa: ANN001
    root, mask = volumes["root"], volumes["mask"]
    with server.client() as client:
        plain = _plan(client)
        masked = _plan(client, mask=mask)
        below = _plan(client, mask=mask, roi=[[0, 32], [None, None], [None, None]])
        above = _plan(client, mask=mask, roi=[[32, 64], [None, None], [None, None]])
        empty = _plan(client, mask=mask, skip_empty=0)
    outside = _outside(root, mask, masked["block_edges"])
    assert masked["blocks_outside_mask"] == masked["job_seconds"]["skipped_blocks"]
    assert masked["blocks_outside_mask"] == len(outside) > 0
    assert masked["mask"] == mask and plain.get("blocks_outside_mask") is None
    assert _searchless(masked) < _searchless(plain)
    cli = _cli_plan(root, "--mask", str(root / mask))  # the same job from the command line
    assert masked["block_edges"] == cli["block_edges"]
    assert masked["blocks_outside_mask"] == cli["blocks_outside_mask"]
    assert _searchless(masked) == pytest.approx(_searchless(cli))
    # an ROI's blocks lie where it does in the volume (the mask is the volume's)
    assert below["blocks_outside_mask"] == below["job_seconds"]["blocks"] > 0
    assert above["blocks_outside_mask"] == 0
    assert len(_outside(root, mask, below["block_edges"])) == below["job_seconds"]["blocks"]
    # empty input is known only once read: shown, not counted
    assert empty["skip_empty"] == 0 and "once read" in empty["empty_blocks"]
    assert _searchless(empty) == pytest.approx(_searchless(masked))


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("changes, words", [
    ({"labels": "threshold:x"}, ("needs a number after threshold",)),
    ({"labels": "threshold:0.5:7"}, ("channel 7 is out of range",)),
    ({"labels": "maximum"}, ("labels",)),
    ({"labels": "argmax", "dtype": "uint8"}, ("dtype",)),
    ({"mask": "../outside/secret.zarr"}, ("mask", "'..'")),
    ({"mask": "escape/secret.zarr"}, ("mask", "outside the data root")),
    ({"mask": "/etc"}, ("mask", "absolute")),
    ({"mask": "nothing.zarr"}, ("mask", "does not exist")),
    ({"mask": "plan_bad_mask.zarr"}, ("plan_bad_mask.zarr", "does not divide")),
    ({"mask": "plan_mask.zarr", "input": None}, ("mask", "needs an input")),
    ({"skip_empty": "zero"}, ("skip_empty",)),
])
def test_bad_output_options_are_refused(server, volumes: dict, changes: dict,  # noqa: ANN001
                                        words: tuple[str, ...]) -> None:
    body = {k: v for k, v in {**BODY, "chunks": None, **changes}.items() if v is not None}
    before = _files(volumes["root"])
    with server.client() as client:
        r = client.post("/v1/plan", json=body)
        jobs = client.get("/v1/jobs").json()["total"]
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, str) and all(w in detail for w in words), detail
    assert "\n" not in detail and not re.search(r"[.;]\s+[A-Z]", detail), detail  # one sentence
    assert "--" not in detail  # the API's field names, not the CLI's flags
    assert _files(volumes["root"]) == before and jobs == 0


def test_a_jobs_body_is_a_plans_less_its_output_fields(server, volumes: dict) -> None:  # noqa: ANN001
    """The JSON POST /v1/jobs takes is what POST /v1/plan takes, less NOT_PLANNED (the
    documented list): those are refused by name, the rest plans the same job."""
    assert set(JobCreate.model_fields) - set(PlanRequest.model_fields) == NOT_PLANNED
    # a plan may also ask for the job on a cluster (issue 54); the rest is the job's body
    cluster = {"workers", "placement", "store_bandwidth", "queue_wait", "deadline"}
    assert set(PlanRequest.model_fields) - cluster <= set(JobCreate.model_fields)
    job = {**BODY, "output": "planopts/job.zarr", "block": [32, 32, 32], "labels": "argmax",
           "mask": volumes["mask"], "skip_empty": 0}
    with server.client() as client:
        whole = client.post("/v1/plan", json=job)
        r = client.post("/v1/plan", json={k: v for k, v in job.items() if k not in NOT_PLANNED})
        created = client.post("/v1/jobs", json=job)
        assert created.status_code == 201, created.text
        done = wait_job(client, created.json()["id"], ("succeeded",))
    assert whole.status_code == 422
    assert "output" in whole.json()["detail"] and "block" in whole.json()["detail"]
    assert r.status_code == 200, r.text
    plan = r.json()["plan"]
    assert (plan["labels"], plan["output_dtype"], plan["skip_empty"]) == ("argmax", "uint8", 0)
    outside = _outside(volumes["root"], volumes["mask"], plan["block_edges"])
    assert plan["blocks_outside_mask"] == len(outside) > 0
    assert done["parameters"]["mask"] == volumes["mask"]
    assert done["report"]["blocks_skipped"] == 4  # its own 2^3 blocks of 32: z < 32 outside


def test_a_graph_models_plan_shows_them_as_znni_plan_does(server, volumes: dict,  # noqa: ANN001
                                                          onnx_models) -> None:  # noqa: ANN001
    """An ONNX graph model: the labels' dtype is the one its whole run writes; its run's
    prediction computes the blocks outside the mask, so their count is null there too."""
    root = volumes["root"]
    onnx_models.copy("validunet", root.parent / "models" / "planunet.onnx")
    zarr.create_array(str(root / "plan_em.zarr"), data=np.ones(SHAPE, np.uint8),
                      chunks=(16, 16, 16))
    options = {"labels": "threshold:0.5", "mask": volumes["mask"]}
    with server.client() as client:
        plan = _plan(client, network="planunet", input="plan_em.zarr", **options)
    assert (plan["output_channels"], plan["output_dtype"]) == (1, "uint8")
    assert plan["mask"] == volumes["mask"] and plan["blocks_outside_mask"] is None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", str(root.parent / "models" / "planunet.onnx"), "--device", "cpu",
                     "--machine", "znni-paper", "--input", str(root / "plan_em.zarr"),
                     "--chunks", "16,16,16", "--labels", "threshold:0.5", "--mask",
                     str(root / volumes["mask"]), "--json"]) == 0
    cli = json.loads(out.getvalue())
    assert _searchless(plan) == pytest.approx(_searchless(cli))
    assert plan["job_seconds"] == pytest.approx(cli["job_seconds"])
