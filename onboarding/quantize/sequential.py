"""Group-sequential boundaries: how wide an interval must be at each look at the same data.

The accuracy gate re-evaluates an inconclusive task on more items and judges it again. Judging
every look at the single-look `z` lets a variant whose true drop sits at the limit pass more
often than the configured α, because it gets several chances. Here each look spends part of α
by the Lan–DeMets Pocock-type spending function `α(t) = α·ln(1 + (e − 1)·t)`, `t` the look's
information fraction (items judged ÷ the most the task may be judged on), and the look's `z` is
the exact boundary for that spending: the chance of crossing at this look and at no earlier one,
for the correlated statistics `Z_k` of nested item sets (`corr(Z_i, Z_j) = sqrt(t_i / t_j)`), is
the spent increment. It is computed by recursive numerical integration over the region where
the earlier looks did not cross (Armitage–McPherson–Rowe), on a fine grid.

A single look at `t = 1` spends all of α, so its `z` is the configured one; an early look is
stricter; the last look, at `t = 1`, is less strict than a Bonferroni split would make it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from itertools import pairwise
from statistics import NormalDist

import numpy as np

_NORMAL = NormalDist()
_GRID_STEP = 0.01  # in z; boundaries come out to about 1e-3
_GRID_LOW = -9.0  # the density below is negligible (< 1e-18)


def spent(alpha: float, t: float) -> float:
    """α spent by information fraction t (Pocock-type: much of it early, all of it at t = 1)."""
    return alpha * math.log1p((math.e - 1.0) * min(max(t, 0.0), 1.0))


def _phi(x: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def _upper_tail(x: np.ndarray) -> np.ndarray:
    return 0.5 * np.vectorize(math.erfc)(x / math.sqrt(2.0))


def boundaries(alpha: float, fractions: Sequence[float]) -> list[float]:
    """One-sided boundaries `c_1 … c_k` for looks at increasing information fractions (the
    last at most 1): `P(Z_j > c_j, Z_i ≤ c_i for i < j) = α(t_j) − α(t_{j−1})` under the null.
    Fractions are rounded to 1e-6 and must increase strictly."""
    key = tuple(round(float(t), 6) for t in fractions)
    if not key or any(not 0 < t <= 1 for t in key) or any(b <= a for a, b in pairwise(key)):
        raise ValueError(f"information fractions must increase strictly within (0, 1]: {key}")
    if not 0 < alpha < 0.5:
        raise ValueError(f"one-sided alpha must be in (0, 0.5): {alpha}")
    return list(_boundaries(round(alpha, 12), key))


@lru_cache(maxsize=256)
def _boundaries(alpha: float, ts: tuple[float, ...]) -> tuple[float, ...]:
    c = [_NORMAL.inv_cdf(1.0 - spent(alpha, ts[0]))]
    z = _grid(c[0])
    density = _phi(z)  # of Z_1 on the continuation region z <= c_1
    for prev, now in pairwise(ts):
        target = spent(alpha, now) - spent(alpha, prev)
        weight = density * _trapezoid(z)
        root_d, root_prev, root_now = math.sqrt(now - prev), math.sqrt(prev), math.sqrt(now)

        lo, hi = -2.0, 12.0
        for _ in range(60):  # bisection: the crossing chance falls as the boundary rises
            mid = 0.5 * (lo + hi)
            crossing = float(weight @ _upper_tail((mid * root_now - z * root_prev) / root_d))
            lo, hi = (mid, hi) if crossing > target else (lo, mid)
        c.append(0.5 * (lo + hi))
        y = _grid(c[-1])
        kernel = _phi((np.outer(y, np.full_like(z, root_now)) - z * root_prev) / root_d)
        density = kernel @ weight * (root_now / root_d)
        z = y
    return tuple(c)


def _grid(top: float) -> np.ndarray:
    """Points from far below to exactly the boundary, about _GRID_STEP apart."""
    return np.linspace(_GRID_LOW, top, max(2, math.ceil((top - _GRID_LOW) / _GRID_STEP) + 1))


def _trapezoid(z: np.ndarray) -> np.ndarray:
    step = z[1] - z[0]
    w = np.full_like(z, step)
    w[0] = w[-1] = step / 2
    return w


def looks_before(earlier: Sequence[float], now: float) -> list[float]:
    """The distinct looks in `earlier` made before one at fraction `now` (the same look judged
    again is not an earlier one), rounded as `boundaries` keys them."""
    return sorted({round(t, 6) for t in earlier if round(t, 6) < round(now, 6)})


def look_z(z_single: float, earlier: Sequence[float], now: float) -> float:
    """The half-width (in standard errors) for a look at fraction `now` after looks at
    `earlier`, for a gate whose single-look half-width is `z_single` (one-sided α = 1 − Φ(z))."""
    fractions = [*looks_before(earlier, now), round(now, 6)]
    if fractions == [1.0]:
        return z_single  # one look with every item: all of α, the configured interval
    return boundaries(1.0 - _NORMAL.cdf(z_single), fractions)[-1]
