"""The scipy whole-volume reference itself agrees with the brute-force strided network."""

from __future__ import annotations

import numpy as np
import pytest
from support.engine_ref import dense_padded, small_network
from support.naive import close, naive_dense, random_network


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dense_padded_matches_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    layers, params = random_network(rng, in_channels=2, max_pools=2)
    from support.naive import naive_fov

    fov = naive_fov(layers)
    x = rng.standard_normal((2, *(f + int(rng.integers(1, 4)) for f in fov)))
    assert close(dense_padded(layers, params, x), naive_dense(layers, params, x))


def test_small_network_matches_brute_force() -> None:
    rng = np.random.default_rng(5)
    layers, params = small_network(rng, in_channels=2)
    x = rng.standard_normal((2, 9, 7, 10))
    assert close(dense_padded(layers, params, x), naive_dense(layers, params, x))
