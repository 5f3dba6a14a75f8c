"""Which precisions a CUDA device computes in (by compute capability), and the one-sentence
refusal of a precision the device lacks (a fake CuPy: no GPU here)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from znni.primitives.gpu import compute_capability, supported_precisions


def fake_cupy(capability: str) -> SimpleNamespace:
    device = SimpleNamespace(compute_capability=capability)
    return SimpleNamespace(cuda=SimpleNamespace(Device=lambda i: device))


@pytest.mark.parametrize("capability, expected", [
    ("90", ("fp32", "tf32", "bf16", "fp16")),  # H100
    ("80", ("fp32", "tf32", "bf16", "fp16")),  # A100
    ("75", ("fp32", "fp16")),  # T4
    ("53", ("fp32", "fp16")),
    ("52", ("fp32",)),  # Maxwell Titan X
])
def test_precisions_follow_the_compute_capability(monkeypatch, capability, expected) -> None:
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(capability))
    assert compute_capability(0) == (int(capability[0]), int(capability[1]))
    assert supported_precisions(0) == expected


def test_no_cupy_no_precisions(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    assert compute_capability(0) is None and supported_precisions(0) == ()


def test_a_precision_the_device_lacks_is_one_sentence(monkeypatch) -> None:
    from znni.engine.compute import execution

    monkeypatch.delenv("ZNNI_GPU_STANDIN", raising=False)
    monkeypatch.setattr(execution, "check_device", lambda device: None)
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy("75"))
    execution.check_precision("gpu", "fp16")
    with pytest.raises(ValueError, match=r"--precision bf16 needs a GPU of compute capability "
                                         r"8\.0 or more; device 0 has 7\.5"):
        execution.check_precision("gpu", "bf16")
