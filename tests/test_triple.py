"""znni.triple: the one (z, y, x) conversion every package uses."""

from __future__ import annotations

import numpy as np
import pytest

from znni.triple import as_triple


def test_as_triple_gives_plain_ints_from_any_three_values() -> None:
    got = as_triple(np.array([4, 5, 6], dtype=np.int64))
    assert got == (4, 5, 6) and all(type(v) is int for v in got)
    assert as_triple(v + 1 for v in (0, 1, 2)) == (1, 2, 3)


def test_as_triple_names_what_was_wrong() -> None:
    with pytest.raises(ValueError, match=r"window must have 3 entries .* \(1, 2\)"):
        as_triple([1, 2], "window")
