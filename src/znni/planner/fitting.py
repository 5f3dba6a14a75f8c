"""The calibrations' least squares (calibrate.py, graph/calibrate.py): multipliers of a cost
model's terms that make predicted over measured time 1, none of them negative."""

from __future__ import annotations

import numpy as np


def relative_multipliers(a: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """Least-squares m of  a @ m = rhs  with every m > 0.05: the smallest of a solution that
    has one below drops its column (multiplier 1) and the rest are solved again. `a` holds
    each term's seconds over the measured seconds, (runs, terms)."""
    active = [j for j in range(a.shape[1]) if a[:, j].any()]
    mult = np.ones(a.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(a[:, active], rhs, rcond=None)
        if (sol > 0.05).all():
            mult[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return mult
