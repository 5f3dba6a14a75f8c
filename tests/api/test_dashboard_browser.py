"""The dashboard in a real headless Chromium against a real `znni serve` running real jobs.

Skipped, with the reason, only where no chromium is installed (`make test` installs
Debian's where apt works). The job page's screenshot is written to this run's temporary
directory (its path is printed); ZNNI_DASHBOARD_SCREENSHOT=PATH copies it there too
(docs/dashboard.png is made so).
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from support.browser import Browser, dump_dom, find_chromium
from support.server_util import wait_job, write_volume

from znni.cli.demo_data import synthetic_em, write_demo_network

pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="no chromium on this machine: `make test` installs Debian's chromium where apt "
    "can (as root or with sudo); install it to run the browser tests",
)

SMALL = {"network": "tiny", "input": "small.zarr", "chunks": [4, 4, 4], "block": [4, 8, 4]}
LONG_SHAPE = (2, 40, 80, 128)  # 12800 blocks of (2, 4, 4): time to click, even on a fast machine
LONG = {"network": "tiny", "input": "long.zarr", "chunks": [2, 4, 4], "block": [2, 4, 4]}
# the demo (64, 192, 192) in 8 x 6 x 6 blocks: a chart and a block map worth a look (its
# 8 x 12 x 12 blocks of 8 x 16 x 16 took 45 s, mostly each block's margin)
DEMO = {"network": "demo-membranes", "input": "demo-em.zarr", "output": "out/demo.zarr",
        "chunks": [8, 32, 32], "block": [8, 32, 32], "dtype": "uint8"}
DEMO_BLOCKS = 8 * 6 * 6
SHOT_SIZE = (1400, 1000)


def _no_page_errors(browser: Browser, allow: tuple[int, ...] = ()) -> None:
    """No script exception, CSP violation or failed load (but answers with `allow` status)."""
    bad = [m for m in browser.console
           if "exception" in m or "Content Security Policy" in m or "log error" in m]
    bad = [m for m in bad if not any(f"status of {code}" in m for code in allow)]
    assert not bad, bad


def _row(job_id: int, cell: str) -> str:
    return f"(document.querySelector('#job-{job_id} .c-{cell}') || {{}}).textContent"


@pytest.fixture(scope="module")
def volumes(site: dict) -> None:
    write_volume(site["root"] / "long.zarr", LONG_SHAPE, seed=11, chunks=(2, 8, 8, 8))


def test_jobs_table_names_the_job_and_reaches_100_percent(server, tmp_path_factory) -> None:
    with server.client() as client:
        r = client.post("/v1/jobs", json={**SMALL, "output": "dash/first.zarr"})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        with Browser(*SHOT_SIZE) as browser:
            browser.goto(f"{server.url}/")
            browser.wait_for(f"{_row(job_id, 'progress')} === '100% · 24/24 blocks'")
            # the last block's progress lands a moment before the job's success
            browser.wait_for(f"{_row(job_id, 'status')} === 'succeeded'")
            assert browser.js(_row(job_id, "network")) == "tiny"
            assert browser.js(_row(job_id, "paths")) == "small.zarr → dash/first.zarr"
            assert browser.js(_row(job_id, "device")) == "auto → cpu · fp32"
            browser.wait_for("document.querySelector('#machine').dataset.loaded === '1'")
            assert "1 of 1 alive" in browser.text()
            shot = browser.screenshot(tmp_path_factory.mktemp("dashboard") / "jobs.png")
            _no_page_errors(browser)
        assert wait_job(client, job_id, ("succeeded",))["status"] == "succeeded"
    print(f"\ndashboard screenshot (jobs): {shot}")


def test_job_page_follows_the_demo_job(server, site, tmp_path_factory) -> None:
    """`znni demo`'s network on its synthetic EM volume, in 288 small blocks: the page is
    shot half way (the README's picture), then must show the finished job whole."""
    write_demo_network(site["models"])
    image, _ = synthetic_em()
    zarr.create_array(str(site["root"] / "demo-em.zarr"), data=image, chunks=(32, 96, 96))
    with server.client() as client, Browser(*SHOT_SIZE) as browser:
        r = client.post("/v1/jobs", json=DEMO)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        browser.goto(f"{server.url}/#job={job_id}")
        wait_job(client, job_id, ("succeeded",), min_done=DEMO_BLOCKS // 2)
        browser.wait_for("document.querySelectorAll('.blockmap rect.done').length > 0")
        browser.wait_for("document.querySelector('img.preview').naturalWidth > 0")
        browser.wait_for("document.querySelector('.preview-panel').textContent.includes("
                         "'through the latest blocks') || document.querySelector('.badge')"
                         ".textContent === 'succeeded'")  # the slice where blocks land
        shot = browser.screenshot(tmp_path_factory.mktemp("dashboard") / "job.png")
        wait_job(client, job_id, ("succeeded",))
        browser.wait_for(f"document.querySelectorAll('.blockmap rect.done').length === {DEMO_BLOCKS}")
        browser.wait_for("document.querySelector('.badge').textContent === 'succeeded'")
        text = browser.text()
        assert f"Job {job_id} · demo-membranes" in text and "out/demo.zarr" in text
        assert f"100% · {DEMO_BLOCKS}/{DEMO_BLOCKS} blocks" in text
        assert f"{DEMO_BLOCKS} of {DEMO_BLOCKS} blocks finished" in text
        assert browser.js("document.querySelector('.chart polyline.line-now') !== null")
        assert "direct" in browser.js("document.querySelector('.layers').textContent")
        # the whole run predicted against the whole run measured; a pass's rate apart
        assert browser.js("document.querySelector('.speeds .predicted').textContent").endswith("vox/s")
        measured = browser.js("document.querySelector('.speeds .measured').textContent")
        assert "vox/s" in measured and measured.endswith("x predicted)")
        speeds = browser.js("document.querySelector('.speeds').textContent")
        assert "whole run, predicted" in speeds and "steady state (one pass, not the whole run)" in speeds
        assert browser.js("document.querySelector('img.preview').src").startswith("blob:")
        _no_page_errors(browser, allow=(409,))  # the block map asked before the ledger began
    if target := os.environ.get("ZNNI_DASHBOARD_SCREENSHOT"):
        shutil.copyfile(shot, Path(target))
    print(f"\ndashboard screenshot (job page): {shot}")


def _wait_for_blocks(client, job_id: int, timeout_s: float = 60.0) -> None:
    """Until the job's progress has its block count (its plan and layout are made)."""
    deadline = time.monotonic() + timeout_s
    while client.get(f"/v1/jobs/{job_id}").json()["progress"]["total"] == 0:
        if time.monotonic() > deadline:
            raise AssertionError(f"job {job_id} counted no blocks in {timeout_s} s")
        time.sleep(0.05)


def test_cancel_button_cancels_a_running_job(server, volumes) -> None:
    with server.client() as client:
        r = client.post("/v1/jobs", json={**LONG, "output": "dash/long.zarr"})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        with Browser(*SHOT_SIZE) as browser:
            browser.goto(f"{server.url}/")
            button = f"document.querySelector('#job-{job_id} button.cancel')"
            browser.wait_for(f"{_row(job_id, 'status')} === 'running' && {button} !== null")
            _wait_for_blocks(client, job_id)  # past its set-up: the run has counted its blocks
            browser.js(f"{button}.click()")
            browser.wait_for(f"{_row(job_id, 'status')} === 'cancelled'")
            assert browser.js(button) is None  # no cancel button on a cancelled job
            assert "cancel" in browser.js("document.querySelector('#notice').textContent")
            _no_page_errors(browser)
        job = client.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "cancelled" and job["cancel_requested"] is True
    assert job["progress"]["done"] < job["progress"]["total"]


def test_without_the_token_the_page_shows_no_job(token_server) -> None:
    with token_server.client() as client:
        r = client.post("/v1/jobs", json={**SMALL, "output": "dash/secret-out.zarr"})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        wait_job(client, job_id, ("succeeded",))
    dom = dump_dom(f"{token_server.url}/", budget_ms=3000)
    assert 'id="token-form"' in dom
    for secret in ("secret-out", "small.zarr", "tiny", f"job-{job_id}"):
        assert secret not in dom, secret
    assert '<main id="app" hidden="">' in dom
    with Browser(*SHOT_SIZE) as browser:
        browser.goto(f"{token_server.url}/#token=wrong")
        browser.wait_for("document.querySelector('#login-error').textContent.includes('refused')")
        assert "secret-out" not in browser.html()
        browser.goto(f"{token_server.url}/#token=s3cret&job={job_id}")
        browser.wait_for("document.body.innerText.includes('dash/secret-out.zarr')")
        assert browser.js("location.hash") == f"#job={job_id}"  # the token left the URL
        assert browser.js("sessionStorage.getItem('znni-token')") == "s3cret"
        browser.js("document.querySelector('#forget').click()")
        browser.wait_for("!document.querySelector('#login').hidden")
        assert "secret-out" not in browser.html()
        _no_page_errors(browser, allow=(401,))


def test_failed_job_shows_its_error_and_paths_stay_text(server, site, volumes) -> None:
    """A job whose input vanished while it waited: its page shows the error; an output path
    that looks like markup is shown as text, never parsed."""
    write_volume(site["root"] / "gone.zarr", (2, 14, 13, 11), seed=3, chunks=(2, 8, 8, 8))
    odd = "dash/<img src=x onerror=alert(1)>.zarr"
    with server.client() as client:
        blocker = client.post("/v1/jobs", json={**LONG, "output": "dash/blocker.zarr"}).json()
        r = client.post("/v1/jobs", json={**SMALL, "input": "gone.zarr", "output": odd})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        shutil.rmtree(site["root"] / "gone.zarr")
        client.post(f"/v1/jobs/{blocker['id']}/cancel")
        failed = wait_job(client, job_id, ("failed",))
    with Browser(*SHOT_SIZE) as browser:
        browser.goto(f"{server.url}/#job={job_id}")
        browser.wait_for("!document.querySelector('#app').hidden"
                         " && !document.querySelector('.error-panel').hidden")
        shown = browser.js("document.querySelector('.error-text').textContent")
        assert shown == failed["error"] and "gone.zarr" in shown
        assert odd in browser.text()
        assert browser.js("document.querySelectorAll('img[src=\"x\"]').length") == 0
        browser.goto(f"{server.url}/")
        browser.wait_for(f"{_row(job_id, 'status')} === 'failed'")
        assert browser.js(_row(job_id, "paths")) == f"gone.zarr → {odd}"
        assert browser.js("document.querySelectorAll('img').length") == 0
        _no_page_errors(browser)


def test_agglomeration_job_shows_its_stages(server, site) -> None:
    """A job on existing affinities: the table names it and shows its last stage; its page
    lists every stage with a bar, all done."""
    affs = np.random.default_rng(5).random((3, 16, 16, 16)).astype(np.float32)
    zarr.create_array(str(site["root"] / "dash-affs.zarr"), data=affs, chunks=(3, 8, 8, 8))
    with server.client() as client:
        r = client.post("/v1/agglomerate", json={"affinities": "dash-affs.zarr",
                                                 "output": "dash/seg.zarr", "block": [8, 8, 8]})
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        wait_job(client, job_id, ("succeeded",))
    stage = "document.querySelector('.stages tr[data-stage=\"{}\"]').textContent"
    with Browser(*SHOT_SIZE) as browser:
        browser.goto(f"{server.url}/")
        browser.wait_for(f"{_row(job_id, 'status')} === 'succeeded'")
        assert browser.js(_row(job_id, "network")) == "agglomerate"
        assert browser.js(_row(job_id, "progress")) == "4/4 relabel 0.5 · 100% · 1/1 blocks"
        browser.goto(f"{server.url}/#job={job_id}")
        browser.wait_for("!document.querySelector('#job-view').hidden && document"
                         ".querySelectorAll('.stages tr[data-stage]').length === 4")
        statuses = browser.js("[...document.querySelectorAll('.stages tr[data-stage] "
                              ".c-status')].map((c) => c.textContent).join(',')")
        assert statuses == "done,done,done,done"
        assert "100% · 8/8 blocks" in browser.js(stage.format("fragments"))
        assert "100% · 1/1 blocks" in browser.js(stage.format("agglomerate"))
        assert f"Job {job_id} · agglomerate" in browser.text()
        _no_page_errors(browser)
