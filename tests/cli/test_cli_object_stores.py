"""`znni segment` with s3:// volumes against a real S3-API server (moto on 127.0.0.1):
refusals before compute, SIGKILL and resume, and the server restarting mid-run."""

from __future__ import annotations

import subprocess
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from support.store_runs import (
    WAIT_S,
    child_env,
    down_for_good,
    kill_then_rerun,
    make_case,
    read_url,
    refused,
    restart_mid_run,
    segment_cmd,
)

pytestmark = pytest.mark.usefixtures("s3_env")


@pytest.fixture()
def case(s3, tmp_path: Path) -> dict:  # noqa: ANN001
    """A network heavy enough for a block to take a while, an s3 input and the local run."""
    return make_case(s3, tmp_path, 11)


def _env(s3, user: str = "rw", **more: str) -> dict[str, str]:  # noqa: ANN001
    return child_env(**{**s3.env(user), **more})


_cmd, _read = segment_cmd, read_url


def test_refusals_before_compute_exit_2_and_write_nothing(s3, case) -> None:  # noqa: ANN001
    out = f"{case['prefix']}/out.zarr"
    spec, inp = case["spec"], case["input"]
    err = refused(_cmd(spec, inp, out), _env(s3, "wrong"), inp, "refused access")
    assert "credentials" in err
    refused(_cmd(spec, inp, out), _env(s3, "ro"), out, "not writable")
    refused(_cmd(spec, inp, "s3://no-such-bucket-znni/out.zarr"), _env(s3),
             "s3://no-such-bucket-znni", "does not exist")
    refused(_cmd(spec, inp, "http://127.0.0.1:9/out.zarr"), _env(s3), "only reads")
    refused(_cmd(spec, f"{case['prefix']}/missing.zarr", out), _env(s3), "does not exist")
    refused(_cmd(spec, inp, out, "--storage-option", "bogus=1"), _env(s3), inp,
            "could not be set up", "bogus")
    assert s3.keys_under(out) == []


def test_storage_option_flag_gives_the_endpoint_and_keys(s3, case) -> None:  # noqa: ANN001
    out = f"{case['prefix']}/flags.zarr"
    env = {k: v for k, v in _env(s3).items() if not k.startswith("AWS_")}
    key, secret = s3.keys["rw"]
    opts = [f"endpoint_url={s3.endpoint}", f"key={key}", f"secret={secret}"]
    cmd = _cmd(case["spec"], case["input"], out,
               *(a for o in opts for a in ("--storage-option", o)))
    assert subprocess.run(cmd, env=env, timeout=WAIT_S).returncode == 0
    assert np.array_equal(_read(out), case["expected"])


@pytest.mark.slow
def test_sigkill_then_rerun_recomputes_only_unfinished_blocks(s3, case, tmp_path) -> None:  # noqa: ANN001
    kill_then_rerun(case, partial(_env, s3), tmp_path)


@pytest.mark.slow
def test_store_restart_mid_run_is_retried_and_the_run_completes(s3, case, tmp_path) -> None:  # noqa: ANN001
    restart_mid_run(s3, case, partial(_env, s3), tmp_path)  # moto keeps its state in-process


@pytest.mark.slow
def test_store_down_for_good_fails_with_one_sentence_naming_the_url(s3, case) -> None:  # noqa: ANN001
    """znni's own 2 tries, then one sentence naming the URL. botocore retries a refused
    connection itself (4 more attempts with up to 8 s of backoff: 11 s per znni try);
    AWS_MAX_ATTEMPTS=1 turns that off, which leaves znni's retries to be seen."""
    env = partial(_env, s3, AWS_MAX_ATTEMPTS="1")
    assert "s3://znni-test/" in down_for_good(s3, case, env, 2)
