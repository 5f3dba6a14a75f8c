"""Test-time flips' arithmetic (engine/compute/tta.py) against plain loops over the flips."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest

from znni.engine.compute.tta import (
    FlipSpec,
    flip_count,
    flipped_items,
    flipped_plan,
    tta_forward,
    tta_parts,
    unflip_mean,
    unflipped_means,
)
from znni.planner.plan import AlgorithmSummary, LayerPlan, Plan


@pytest.mark.parametrize("text, axes, count, canonical", [
    ("flips", (0, 1, 2), 8, "flips"), ("flips:zx", (0, 2), 4, "flips:zx"),
    ("flips:xz", (0, 2), 4, "flips:zx"), ("flips:y", (1,), 2, "flips:y"),
    ("flips:xyz", (0, 1, 2), 8, "flips"),
])
def test_parse(text, axes, count, canonical) -> None:
    spec = FlipSpec.parse(text)
    assert spec is not None and spec.axes == axes and spec.count == count
    assert spec.text == canonical and flip_count(text) == count
    assert tta_parts(text) == {"tta": canonical}  # the ledger's part: its recorded form
    subsets = spec.variants()
    assert subsets[0] == () and len(set(subsets)) == count  # every subset once, identity first
    assert set(subsets) == {c for k in range(len(axes) + 1)
                            for c in itertools.combinations(axes, k)}


@pytest.mark.parametrize("text", ["flips:q", "mirror", "flips:", "flips:zz", "Flips", "flips:z,x"])
def test_bad_values_are_one_sentence(text) -> None:
    with pytest.raises(ValueError, match=r"^--tta .* is not one of: flips") as e:
        FlipSpec.parse(text)
    assert str(e.value).count(". ") == 0 and "\n" not in str(e.value)


def test_no_flips() -> None:
    assert FlipSpec.parse(None) is None and flip_count(None) == 1 and tta_parts(None) == {}


def _net(x: np.ndarray) -> np.ndarray:
    """A (B, 1, Z, Y, X) -> (B, 2, Z, Y, X) map that is not flip-equivariant: ramps and a
    one-sided difference."""
    z, y, x_ = (np.arange(n, dtype=np.float32) for n in x.shape[2:])
    ramp = z[:, None, None] + 2 * y[None, :, None] + 3 * x_[None, None, :]
    diff = np.diff(x, axis=4, append=0)
    return np.concatenate([x * ramp, diff], axis=1).astype(np.float32)


def _naive(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """The mean over every subset of `axes` of flip(net(flip(x))), one window at a time."""
    outs = []
    for b in range(x.shape[0]):
        total = np.zeros((2, *x.shape[2:]), np.float64)
        subsets = [c for k in range(len(axes) + 1) for c in itertools.combinations(axes, k)]
        for sub in subsets:
            ax = tuple(2 + a for a in sub)
            y = _net(np.flip(x[b: b + 1], ax).copy())
            total += np.flip(y, ax)[0]
        outs.append(total / len(subsets))
    return np.stack(outs)


@pytest.mark.parametrize("text", ["flips", "flips:zx", "flips:y"])
@pytest.mark.parametrize("chunk", [1, 3, 8, 64])
def test_forward_equals_the_naive_flip_average(text, chunk) -> None:
    spec = FlipSpec.parse(text)
    assert spec is not None
    x = np.random.default_rng(1).standard_normal((3, 1, 4, 5, 6)).astype(np.float32)
    ref = _naive(x, spec.axes)
    got = tta_forward(_net, x, spec, chunk)
    assert got.shape == ref.shape and np.abs(got - ref).max() < 1e-4
    assert np.abs(ref - _net(x)).max() > 0.1  # the flips matter for this map
    calls: list[int] = []

    def counted(batch: np.ndarray) -> np.ndarray:
        calls.append(batch.shape[0])
        return _net(batch)

    tta_forward(counted, x, spec, chunk)
    assert sum(calls) == 3 * spec.count and max(calls) <= chunk


def test_stream_helpers_equal_the_batch_helpers() -> None:
    spec = FlipSpec.parse("flips:zy")
    assert spec is not None
    x = np.random.default_rng(2).standard_normal((2, 1, 3, 4, 5)).astype(np.float32)
    stream = list(flipped_items((x[b: b + 1] for b in range(2)), spec))
    assert len(stream) == 2 * spec.count
    outs = [_net(item)[0] for item in stream]
    means = list(unflipped_means(iter(outs), spec))
    assert np.abs(np.stack(means) - _naive(x, spec.axes)).max() < 1e-4
    assert np.abs(unflip_mean(np.stack(outs), spec) - np.stack(means)).max() == 0


def test_flipped_plan_counts_every_pass() -> None:
    layer = LayerPlan(0, "conv", "cpu", "direct", 0.5, 100)
    plan = Plan("n", "m", "cpu", (10, 10, 10), (8, 8, 8), 2, None, ("direct",), (layer,), 1000,
                0.5, 2000.0, alternatives=(AlgorithmSummary("cpu", True,
                                                             predicted_voxels_per_second=800.0),))
    flipped = flipped_plan(plan, 8)
    assert flipped.predicted_patch_s == 4.0 and flipped.predicted_voxels_per_second == 250.0
    assert flipped.layers[0].predicted_s == 4.0 and flipped.peak_bytes == plan.peak_bytes
    assert flipped.alternatives[0].predicted_voxels_per_second == 100.0  # the table's too
    assert flipped_plan(plan, 1) is plan
    net = SimpleNamespace(in_channels=2, out_channels=3)  # the batch's copies, one mean
    assert flipped_plan(plan, 8, net).peak_bytes == 1000 + 4 * (2 * 2 * 1000 + 3 * 512)
