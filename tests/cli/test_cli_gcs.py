"""`znni segment` with gs:// volumes against a real GCS-API server (fake-gcs-server on
127.0.0.1, its own process): a run equal to the local one, refusals before compute, the
endpoint by --storage-option, SIGKILL and resume, and the server restarting mid-run.
Credentials: a service account's key file through Google's token exchange and bearer
check, played by `gcs_token_gate.TokenGate` in front of the emulator (which checks none)."""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from support.gcs_token_gate import TokenGate, service_account_file
from support.store_runs import (
    TOTAL,
    WAIT_S,
    child_env,
    down_for_good,
    kill_then_rerun,
    make_case,
    read_url,
    refused,
    restart_mid_run,
    segment_cmd,
    traced,
)

from znni.engine.context import StoreContext
from znni.engine.io.ledger import read_ledger
from znni.engine.location import Location

CTX = StoreContext()  # store options (none) and caches for this module's calls

pytestmark = pytest.mark.usefixtures("gcs_env")


@pytest.fixture()
def case(gcs, tmp_path: Path) -> dict:  # noqa: ANN001
    """A network heavy enough for a block to take a while, a gs input and the local run."""
    return make_case(gcs, tmp_path, 12)


def _refused(cmd: list[str], *words: str) -> None:
    refused(cmd, child_env(), *words)


_cmd, _env, _read, _trace = segment_cmd, child_env, read_url, traced


def test_gs_run_equals_the_local_run_and_a_rerun_computes_nothing(gcs, case, tmp_path) -> None:  # noqa: ANN001
    out = f"{case['prefix']}/out.zarr"
    trace = tmp_path / "trace"
    cmd = _cmd(case["spec"], case["input"], out)
    assert subprocess.run(cmd, env=_env(ZNNI_ENGINE_TRACE=str(trace)), timeout=WAIT_S).returncode == 0
    assert np.array_equal(_read(out), case["expected"])
    header, done = read_ledger(Location.parse(out), ctx=CTX)
    assert header is not None and len(done) == TOTAL == len(_trace(trace))
    run = header["run"]
    blocks = [k for k in gcs.keys_under(f"{out}/znni-ledger") if f"/{run}/" in k]
    assert len(blocks) == TOTAL  # one object per finished block
    assert subprocess.run(cmd, env=_env(ZNNI_ENGINE_TRACE=str(trace)), timeout=WAIT_S).returncode == 0
    assert len(_trace(trace)) == TOTAL  # the ledger says everything is done


def test_refusals_before_compute_exit_2_and_write_nothing(gcs, case) -> None:  # noqa: ANN001
    out = f"{case['prefix']}/out.zarr"
    spec, inp = case["spec"], case["input"]
    _refused(_cmd(spec, inp, "gs://no-such-bucket-znni/out.zarr"),
             "output gs://no-such-bucket-znni/out.zarr", "bucket gs://no-such-bucket-znni",
             "does not exist")
    _refused(_cmd(spec, "gs://no-such-bucket-znni/in.zarr", out),
             "input gs://no-such-bucket-znni/in.zarr", "does not exist")
    _refused(_cmd(spec, f"{case['prefix']}/missing.zarr", out), "missing.zarr", "does not exist")
    _refused(_cmd(spec, inp, "gsx://znni-test/out.zarr"), "gsx://")
    assert gcs.keys_under(out) == []


def test_storage_option_flag_gives_the_endpoint(gcs, case, monkeypatch) -> None:  # noqa: ANN001
    """Without STORAGE_EMULATOR_HOST, --storage-option endpoint_url=... reaches the emulator
    (anonymously: the default at an endpoint outside googleapis.com)."""
    monkeypatch.delenv("STORAGE_EMULATOR_HOST")
    out = f"{case['prefix']}/flags.zarr"
    cmd = _cmd(case["spec"], case["input"], out, "--storage-option",
               f"endpoint_url={gcs.endpoint}")
    assert subprocess.run(cmd, env=_env(), timeout=WAIT_S).returncode == 0
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.endpoint)
    assert np.array_equal(_read(out), case["expected"])


@pytest.mark.slow
def test_sigkill_then_rerun_recomputes_only_unfinished_blocks(case, tmp_path) -> None:  # noqa: ANN001
    kill_then_rerun(case, child_env, tmp_path)


@pytest.mark.slow
def test_store_restart_mid_run_is_retried_and_the_run_completes(gcs, case, tmp_path) -> None:  # noqa: ANN001
    restart_mid_run(gcs, case, child_env, tmp_path)  # same port, objects kept on disk


@pytest.mark.slow
def test_store_down_for_good_fails_with_one_sentence_naming_the_url(gcs, case) -> None:  # noqa: ANN001
    """gcsfs retries each request itself (about 30 s), so znni adds no tries of its own
    by default (5 made it 2.5 min); gcsfs logs every failure it gives up on, and stderr
    still holds only znni's one sentence. gcsfs's tries here: 2 (ZNNI_GCS_REQUEST_TRIES),
    not its 6: three requests wait out their tries one after another (the block's write,
    the lock's renewal, the lock's release), 90 s with gcsfs's own backoff."""
    env = functools.partial(child_env, ZNNI_GCS_REQUEST_TRIES="2")
    assert "gs://znni-test/" in down_for_good(gcs, case, env, None, default_tries=1)


@pytest.fixture()
def gate(gcs) -> Iterator[TokenGate]:  # noqa: ANN001
    g = TokenGate(gcs.endpoint).start()
    try:
        yield g
    finally:
        g.stop()


def test_a_service_account_key_file_reaches_the_store(gate, case, tmp_path) -> None:  # noqa: ANN001
    """--storage-option token=KEY.json: the key is exchanged for a token at the key's
    token_uri, and every request carries it (the gate refuses any other)."""
    key = service_account_file(tmp_path / "key.json", f"{gate.endpoint}/token")
    cmd, env = _key_run(case, gate, key, "account")
    assert subprocess.run(cmd, env=env, timeout=WAIT_S).returncode == 0
    assert np.array_equal(_read(f"{case['prefix']}/account.zarr"), case["expected"])
    assert gate.refused == 0 and gate.forwarded > 0


def _key_run(case: dict, gate: TokenGate, key: Path, name: str) -> tuple[list[str], dict]:
    """The command and environment of a run with the service account `key`, through `gate`."""
    cmd = _cmd(case["spec"], case["input"], f"{case['prefix']}/{name}.zarr",
               "--storage-option", f"token={key}")
    return cmd, _env(STORAGE_EMULATOR_HOST=gate.endpoint)


def test_an_account_the_token_endpoint_refuses_exits_2_at_once(gcs, gate, case, tmp_path) -> None:  # noqa: ANN001
    """A deleted account or key: the token is fetched as the client is made, so the
    refusal comes before any request (not after gcsfs's 33 s of retries on a 401)."""
    key = service_account_file(tmp_path / "unknown.json", f"{gate.endpoint}/token",
                               "nobody@znni-test.iam.gserviceaccount.com")
    refused(*_key_run(case, gate, key, "unknown"), case["input"], "refused these credentials",
            "invalid_grant", "GOOGLE_APPLICATION_CREDENTIALS")
    assert gate.refused == 1 and gate.forwarded == 0
    assert gcs.keys_under(f"{case['prefix']}/unknown.zarr") == []


def test_a_revoked_token_exits_2_at_once_and_writes_nothing(gcs, gate, case, tmp_path) -> None:  # noqa: ANN001
    """The token endpoint grants a token the store then refuses (401). The client checks a
    token it has just fetched with one request of its own, without retries, so the run
    stops in one sentence naming the input, instead of after gcsfs's 33 s of retries of
    the 401 (which it takes for an expired token)."""
    gate.accepting = False
    key = service_account_file(tmp_path / "revoked.json", f"{gate.endpoint}/token")
    refused(*_key_run(case, gate, key, "revoked"), case["input"], "refused these credentials",
            "401 Invalid Credentials", "GOOGLE_APPLICATION_CREDENTIALS")
    assert gate.refused == 1 and gate.forwarded == 0  # the check only: no retried request
    assert gcs.keys_under(f"{case['prefix']}/revoked.zarr") == []


def test_a_raw_token_that_cannot_be_checked_is_one_sentence_and_not_echoed(case) -> None:  # noqa: ANN001
    """gcsfs checks a raw token at Google's tokeninfo endpoint before any request; where
    that fails (here: no route to Google) the run stops in one sentence, the token masked."""
    token = "ya29.not-a-real-token-0123456789"
    out = f"{case['prefix']}/raw.zarr"
    err = refused(_cmd(case["spec"], case["input"], out, "--storage-option", f"token={token}"),
                  child_env(), "could not be set up", "GOOGLE_APPLICATION_CREDENTIALS")
    assert token not in err and "not-a-real-token" not in err
