"""Linear fits of relative errors under bounds, as linear programs: the solvers of ``hexflow calibrate`` (the
published steps, the live probes) and of the online profile refit (completed calls)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import sparse
from scipy.optimize import linprog

Vector = tuple[float, float, float, float]
"""``(iter_base_s, token_s, ctx_s, request_overhead_s)``."""


def _abs_lp(m: Any, slack: Any, cost: np.ndarray, bounds: Sequence[tuple[float, float | None]]) -> Any:
    """HiGHS's solution of ``min cost . [z, s]`` subject to ``-slack s <= m z - 1 <= slack s``, row by row."""
    m, slack = sparse.csr_matrix(m), sparse.csr_matrix(slack)
    ones = np.ones(m.shape[0])
    a_ub = sparse.vstack([sparse.hstack([m, -slack]), sparse.hstack([-m, -slack])], format="csr")
    return linprog(cost, A_ub=a_ub, b_ub=np.r_[ones, -ones], bounds=bounds, method="highs")


def l1_relative_fit(
    a: np.ndarray,
    y: np.ndarray,
    lower: Sequence[float] | None = None,
    upper: Sequence[float] | None = None,
) -> tuple[float, ...]:
    """Coefficients ``x`` within ``[lower, upper]`` (default ``[0, inf)``) minimising the sum of ``|a x / y - 1|``
    over the rows: an L1 fit of relative errors (a disturbed row pulls by its sign, not its size), as a sparse
    linear program. Raises ``ValueError`` for nothing to fit, a latency not positive, or a solver failure.
    """
    k = a.shape[1] if a.ndim == 2 else 0
    if len(y) == 0 or k == 0 or a.shape[0] != len(y) or not np.all(y > 0):
        raise ValueError("nothing to fit (no rows, or a latency that is not positive)")
    lo = np.zeros(k) if lower is None else np.asarray(lower, dtype=float)
    hi = np.full(k, np.inf) if upper is None else np.asarray(upper, dtype=float)
    if lo.shape != (k,) or hi.shape != (k,) or np.any(lo > hi):
        raise ValueError("the bounds must give one [lower, upper] per column, lower <= upper")
    m = a / y[:, None]
    # Solve for u = x * scale with columns of unit magnitude: the constants span 8 orders of magnitude.
    scale = np.max(np.abs(m), axis=0)
    scale[scale == 0] = 1.0
    n = len(y)
    bounds = [(lo_i * s, None if math.isinf(hi_i) else hi_i * s) for lo_i, hi_i, s in zip(lo, hi, scale, strict=True)]
    res = _abs_lp(m / scale, sparse.identity(n), np.r_[np.zeros(k), np.ones(n)], bounds + [(0.0, None)] * n)
    if res.status != 0:
        raise ValueError(f"the fit failed: {res.message}")
    # The solver keeps its bounds only to its tolerance (a constant at 0 can come back as -6e-20): clip to them.
    return tuple(float(v) for v in np.clip(res.x[:k] / scale, lo, hi))


def minimax_fit(
    a: np.ndarray, y: np.ndarray, lower: Sequence[float], upper: Sequence[float], scale: Sequence[float], where: str
) -> tuple[Vector, float]:
    """Constants ``x`` within ``[lower, upper]`` minimising ``max |a x / y - 1|``; then, among those,
    the sum of ``|a x / y - 1|``. Returns ``(x, max error)``.

    ``scale`` is each constant's order of magnitude (the LP solves for ``x / scale``, well conditioned).
    """
    n = len(y)
    sc = np.asarray(scale, dtype=float)
    m = a / y[:, None] * sc
    bounds = [(lo / s, hi / s) for lo, hi, s in zip(lower, upper, sc, strict=True)]
    # Phase 1: min e  subject to  -e <= m z - 1 <= e.
    r1 = _abs_lp(m, np.ones((n, 1)), np.r_[np.zeros(4), 1.0], [*bounds, (0.0, None)])
    if r1.status != 0:
        raise ValueError(f"{where}: the fit failed: {r1.message}")
    e = float(r1.x[4])
    # Phase 2: min sum d  subject to  -d <= m z - 1 <= d,  d <= e (the minimax error stays reached).
    r2 = _abs_lp(m, np.eye(n), np.r_[np.zeros(4), np.ones(n)], [*bounds] + [(0.0, e * (1 + 1e-9) + 1e-12)] * n)
    x = r2.x[:4] * sc if r2.status == 0 else r1.x[:4] * sc
    err = float(np.max(np.abs(a @ x / y - 1.0)))
    return (float(x[0]), float(x[1]), float(x[2]), float(x[3])), err
