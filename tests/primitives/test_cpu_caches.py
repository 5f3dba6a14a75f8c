"""Byte bounds of the spectra and workspace caches, good FFT sizes, wisdom files."""

from __future__ import annotations

import numpy as np
import pytest

from znni.primitives.cpu import CpuBackend
from znni.primitives.cpu.spectra_cache import SpectraCache, spectra_key
from znni.primitives.fft_sizes import good_size, is_good_size, padded_shape
from znni.primitives.reference import conv3d_reference


def test_good_sizes_are_smallest_smooth_sizes():
    expected = [m for m in range(1, 400) if _brute_good(m)]
    for n in range(1, 390):
        assert good_size(n) == next(m for m in expected if m >= n)
    assert good_size(61) == 63 and good_size(97) == 98 and good_size(89) == 90
    assert is_good_size(2 * 11) and is_good_size(13 * 8) and not is_good_size(11 * 13)
    assert not is_good_size(17) and not is_good_size(11 * 11)
    assert padded_shape((17, 61, 61)) == (18, 63, 64)  # rfft axis even


def _brute_good(m):
    f = {}
    for p in range(2, m + 1):
        while m % p == 0:
            f[p] = f.get(p, 0) + 1
            m //= p
    big = {p: e for p, e in f.items() if p > 7}
    return not big or (len(big) == 1 and list(big.items())[0] in ((11, 1), (13, 1)))


def test_spectra_cache_never_exceeds_its_byte_bound():
    cache = SpectraCache(max_bytes=1000)
    for i in range(20):
        assert cache.put(("k", i), np.zeros(300, np.uint8))
        assert cache.nbytes <= 1000
    assert len(cache) == 3
    assert cache.get(("k", 19)) is not None and cache.get(("k", 0)) is None
    assert not cache.put("huge", np.zeros(1001, np.uint8))
    assert cache.nbytes <= 1000


def test_spectra_key_depends_on_values_shape_and_size():
    w = np.ones((2, 3, 3, 3, 3), np.float32)
    k = spectra_key(w, (8, 8, 8))
    assert k == spectra_key(w.copy(), (8, 8, 8))
    assert k != spectra_key(w, (8, 8, 10))
    assert k != spectra_key(w.reshape(3, 2, 3, 3, 3), (8, 8, 8))
    w2 = w.copy()
    w2[1, 2, 2, 2, 2] = 2
    assert k != spectra_key(w2, (8, 8, 8))


def test_backend_respects_spectra_and_workspace_bounds():
    rng = np.random.default_rng(3)
    # One layer's spectra: 4*5 * 16*16*9 * 8 bytes = 368,640.
    backend = CpuBackend(
        threads=2,
        fft_effort="FFTW_ESTIMATE",
        spectra_cache_bytes=500_000,
        workspace_bytes=300_000,
        persist_choices=False,
    )
    try:
        for _ in range(3):
            x = rng.standard_normal((1, 5, 16, 16, 16)).astype(np.float32)
            w = rng.standard_normal((4, 5, 3, 3, 3)).astype(np.float32)
            b = rng.standard_normal(4).astype(np.float32)
            out = backend.conv3d(x, w, b, None, "fft-keep")
            assert np.max(np.abs(out - conv3d_reference(x, w, b))) <= 1e-4 * max(
                1, np.abs(out).max()
            )
            assert backend.spectra.nbytes <= 500_000
            assert backend.plans.cached_bytes() <= 300_000
        assert len(backend.spectra) == 1
        # Spectra bigger than the whole cache are used, not kept.
        w = rng.standard_normal((20, 5, 3, 3, 3)).astype(np.float32)
        out = backend.conv3d(x, w, np.zeros(20, np.float32), None, "fft-keep")
        assert out.shape == (1, 20, 14, 14, 14)
        assert backend.spectra.nbytes <= 500_000
    finally:
        backend.close()


def test_measured_effort_saves_wisdom_in_the_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    backend = CpuBackend(threads=1, fft_effort="FFTW_MEASURE", persist_choices=True)
    try:
        x = np.ones((1, 1, 6, 6, 6), np.float32)
        w = np.ones((1, 1, 2, 2, 2), np.float32)
        backend.conv3d(x, w, np.zeros(1, np.float32), None, None)  # measured choice
        backend.conv3d(x, w, np.zeros(1, np.float32), None, "fft-keep")  # measured plans
    finally:
        backend.close()
    assert (tmp_path / "znni" / "fftw-wisdom-single.dat").stat().st_size > 0
    assert (tmp_path / "znni" / "choices.json").exists()


def test_bad_options_raise_value_error():
    with pytest.raises(ValueError):
        CpuBackend(fft_effort="FFTW_FAST")
    with pytest.raises(ValueError):
        CpuBackend(threads=0)
    with pytest.raises(ValueError):
        CpuBackend(spectra_cache_bytes=-1)


def test_effort_defaults_to_measure_and_env_overrides_it(monkeypatch):
    monkeypatch.delenv("ZNNI_FFT_EFFORT", raising=False)
    backend = CpuBackend(threads=1, persist_choices=False)
    assert backend.fft_effort == "FFTW_MEASURE"
    backend.close()
    monkeypatch.setenv("ZNNI_FFT_EFFORT", "FFTW_ESTIMATE")
    backend = CpuBackend(threads=1, persist_choices=False)
    assert backend.fft_effort == "FFTW_ESTIMATE"
    backend.close()
