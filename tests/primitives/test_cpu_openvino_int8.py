"""NNCF's int8 network on disk (primitives/cpu/openvino_int8.py): quantized once and found
in the cache after (same digest, files not rewritten), another calibration or other nodes
kept in float a new entry, the least recently used entries evicted beyond the limit, a lost
race keeping the winner's entry, OpenVINO compiling the IR at "int8", and NNCF missing
named in one sentence."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

from znni.primitives.cpu import openvino_int8
from znni.primitives.cpu.openvino_int8 import (
    NNCF_MISSING,
    conv_names,
    evict,
    float_convs,
    quantized_network,
)
from znni.primitives.cpu.openvino_network import OpenVinoNetwork

pytest.importorskip("openvino")
pytest.importorskip("nncf")
WINDOW = (16, 32, 32)  # the exported BasicUNet's window


@pytest.fixture(scope="module")
def unet(onnx_models, tmp_path_factory):
    """(the ONNX path, its output name, 4 calibration windows, a cache folder, the first
    quantization): one NNCF run for the module."""
    from znni.model.onnx_model import load_onnx_model

    folder = tmp_path_factory.mktemp("int8")
    path = str(onnx_models.copy("basicunet", folder / "b.onnx"))
    model = load_onnx_model(path)
    windows = np.random.default_rng(0).random((4, 1, *WINDOW), dtype=np.float32)
    output = model.graph(WINDOW).output
    first = quantized_network(path, model.digest, windows, output, cache=folder / "cache")
    return path, model.digest, output, windows, folder / "cache", first


def test_the_first_call_quantizes_and_the_second_finds_it(unet) -> None:
    path, digest, output, windows, cache, first = unet
    assert not first.cached
    xml = cache / first.digest / "model.xml"
    assert first.xml == str(xml) and xml.is_file() and (xml.with_suffix(".bin")).is_file()
    stamp = xml.stat().st_mtime_ns
    again = quantized_network(path, digest, windows.copy(), output, cache=cache)
    assert again.cached and again.digest == first.digest and again.xml == first.xml
    assert again.seconds == 0.0  # nothing quantized: no time reported for it
    assert xml.stat().st_mtime_ns == stamp  # found, not written again
    assert [p.name for p in cache.iterdir()] == [first.digest]  # no stray temporary folder


def test_the_accuracy_control_keeps_layers_in_float_and_says_which(
        unet, onnx_models, tmp_path) -> None:
    """NNCF's accuracy control aimed below plain int8's error puts layers back in float;
    the ones it kept are read off the weights (those asked for with an ignored scope read
    the same), stored with the entry and found again with it; its output is nearer fp32's.
    (The valid U-Net: few convs, so NNCF's ranking compiles few networks.)"""
    import openvino as ov

    from znni.model.onnx_model import load_onnx_model

    path, digest, output, windows, cache, first = unet
    names = conv_names(path, (1, 1, *WINDOW))
    assert float_convs(ov.Core().read_model(first.xml)) == ()
    asked = quantized_network(path, digest, windows, output, (names[0], names[-1]), cache=cache)
    assert float_convs(ov.Core().read_model(asked.xml)) == (names[0], names[-1])

    path = str(onnx_models.copy("validunet", tmp_path / "v.onnx"))
    window = onnx_models.window("validunet")
    model = load_onnx_model(path)
    output = model.graph(window).output
    xs = np.random.default_rng(1).random((2, 1, *window), dtype=np.float32)
    x = xs[:1]
    ref = OpenVinoNetwork(path, x.shape, output, "fp32").run(x)

    def error(q: openvino_int8.QuantizedNetwork) -> float:  # the largest, over the range
        got = OpenVinoNetwork(q.xml, x.shape, output, "int8").run(x)
        return float(np.abs(got - ref).max()) / float(ref.max() - ref.min())

    plain = quantized_network(path, model.digest, xs, output, preset="mixed", cache=cache)
    drop = error(plain) / 3  # some layers back in float, not all
    control = quantized_network(path, model.digest, xs, output, preset="mixed",
                                max_drop=drop, cache=cache)
    assert not control.cached and control.digest != plain.digest
    assert 0 < len(control.keep_float) < len(conv_names(path, x.shape))  # some int8 left
    assert float_convs(ov.Core().read_model(control.xml)) == control.keep_float
    again = quantized_network(path, model.digest, xs, output, preset="mixed", max_drop=drop,
                              cache=cache)
    assert again.cached and again.keep_float == control.keep_float
    assert error(control) < error(plain)
    for bad in (0.0, 1.0, -0.1):
        with pytest.raises(ValueError, match="must be in \\(0, 1\\)"):
            quantized_network(path, model.digest, xs, output, max_drop=bad, cache=cache)


def test_other_calibration_windows_are_another_entry(unet) -> None:
    path, digest, output, windows, cache, first = unet
    other = quantized_network(path, digest, windows[::-1].copy(), output, cache=cache)
    assert not other.cached and other.digest != first.digest
    assert (cache / other.digest / "model.xml").is_file()
    assert (cache / first.digest / "model.xml").is_file()  # both kept (within the limit)


def test_the_first_and_last_conv_kept_in_float_and_the_mixed_preset(unet) -> None:
    path, digest, output, windows, cache, first = unet
    names = conv_names(path, (1, 1, *WINDOW))
    assert len(names) > 2 and len(set(names)) == len(names)
    kept = quantized_network(path, digest, windows, output, (names[0], names[-1]), cache=cache)
    assert kept.digest != first.digest and kept.keep_float == (names[0], names[-1])
    mixed = quantized_network(path, digest, windows, output, preset="mixed", cache=cache)
    assert mixed.preset == "mixed" and mixed.digest not in (first.digest, kept.digest)
    with pytest.raises(ValueError, match="preset 'fast' is not one of performance, mixed"):
        quantized_network(path, digest, windows, output, preset="fast", cache=cache)
    n_quantized = _fake_quantize_inputs(kept.xml)
    assert names[0] not in n_quantized and names[-1] not in n_quantized
    assert names[1] in _fake_quantize_inputs(first.xml)


def _fake_quantize_inputs(xml: str) -> set[str]:
    """The conv nodes of an IR that read a FakeQuantize output (quantized inputs)."""
    import openvino as ov

    model = ov.Core().read_model(xml)
    out = set()
    for op in model.get_ordered_ops():
        if op.get_type_name() in openvino_int8.CONV_TYPES:
            src = op.input_value(0).get_node()
            if src.get_type_name() == "FakeQuantize":
                out.add(op.get_friendly_name())
    return out


def test_the_int8_network_compiles_and_runs(unet) -> None:
    path, _, output, windows, _, first = unet
    int8 = OpenVinoNetwork(first.xml, (2, 1, *WINDOW), output, "int8")
    fp32 = OpenVinoNetwork(path, (2, 1, *WINDOW), output, "fp32")
    assert int8.inference_precision == "int8"
    got, ref = int8.run(windows[:2]), fp32.run(windows[:2])
    assert got.shape == ref.shape and np.isfinite(got).all()
    # random weights: the bound is loose (their output's range is tiny); a trained net's
    # error is tested in tests/cli/test_int8_trained.py
    assert np.abs(got - ref).max() <= 0.5 * (ref.max() - ref.min())


def test_a_lost_race_keeps_the_winners_entry(unet, monkeypatch) -> None:
    path, digest, output, windows, cache, first = unet
    import openvino as ov

    winner = cache / first.digest
    stamp = (winner / "model.xml").stat().st_mtime_ns
    model = ov.Core().read_model(first.xml)
    openvino_int8._install(model, cache, first.digest, {"a": "late"})  # the loser renames last
    assert (winner / "model.xml").stat().st_mtime_ns == stamp
    assert "late" not in (winner / "entry.json").read_text()
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]


def test_eviction_takes_the_least_recently_used_first(tmp_path) -> None:
    now = time.time()
    for i, name in enumerate(("old", "mid", "new")):
        entry = tmp_path / name
        entry.mkdir()
        (entry / "model.bin").write_bytes(b"\0" * 1000)
        (entry / "entry.json").write_text("{}")
        os.utime(entry / "entry.json", (now - 100 + i, now - 100 + i))
    assert evict(tmp_path, 2500) == ["old"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mid", "new"]
    assert evict(tmp_path, 0, keep="new") == ["mid"]  # the entry just made stays
    assert [p.name for p in tmp_path.iterdir()] == ["new"]


def test_bad_calibration_windows_are_refused(unet) -> None:
    path, digest, output, windows, cache, _ = unet
    with pytest.raises(ValueError, match=r"float32 \(N, C, Z, Y, X\)"):
        quantized_network(path, digest, windows[0], output, cache=cache)
    with pytest.raises(ValueError, match="float32"):
        quantized_network(path, digest, windows.astype(np.float64), output, cache=cache)


def test_nncf_missing_is_one_sentence_naming_the_install(unet, tmp_path) -> None:
    """NNCF made unimportable in a fresh interpreter (not a mock of its behaviour)."""
    path, digest, output, windows, _, _ = unet
    np.save(tmp_path / "w.npy", windows)
    code = (
        "import sys; sys.modules['nncf'] = None\n"
        "import numpy as np\n"
        "from pathlib import Path\n"
        "from znni.primitives.cpu.openvino_int8 import nncf_available, quantized_network\n"
        f"w = np.load({str(tmp_path / 'w.npy')!r})\n"
        "try:\n"
        f"    quantized_network({path!r}, {digest!r}, w, {output!r}, "
        f"cache=Path({str(tmp_path / 'c')!r}))\n"
        "except ValueError as e:\n"
        "    print(nncf_available(), e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.strip()
    assert out == f"False {NNCF_MISSING}" and "pip install nncf" in out
    assert not (tmp_path / "c").exists()  # nothing made
