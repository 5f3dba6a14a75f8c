"""Shared test set-up: makes tests/naive.py importable as `naive` from every test folder."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

# Cheap FFTW planning, and caches (wisdom, primitive choices, calibration) in a
# throw-away folder rather than the user's ~/.cache; subprocesses inherit both.
os.environ.setdefault("ZNNI_FFT_EFFORT", "FFTW_ESTIMATE")
os.environ.setdefault("XDG_CACHE_HOME", tempfile.mkdtemp(prefix="znni-test-cache-"))
