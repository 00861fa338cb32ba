"""The window-looks bound: how much wider a budget bound must be to hold over the minute-by-minute
looks of one sliding window, and the first time whose bound that wide is within the budget (rule
5 lowers a value no further). Behind the facade :mod:`hedgerow.controller.policy._policy_rules`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import numpy as np
from scipy import optimize, stats

if TYPE_CHECKING:
    from hedgerow.controller.policy.estimation import KMCurve

__all__ = [
    "looks_target",
    "window_scan_ratio",
]


@functools.lru_cache(maxsize=64)  # pure in its scalar
def window_scan_ratio(confidence: float) -> float:
    """``z_scan / z``: how much wider a bound must be to hold over one window's looks, > 1.

    The budget target is a pointwise bound: ``S(target) <= budget`` is wrong with probability
    ``alpha = (1 - confidence) / 2`` (``z = Phi^-1(1 - alpha)``, 1.960 at 95%) at *one* look.
    The tick looks again every minute at a window that slides: two looks ``tau`` apart share
    all but a share ``tau / W`` of the window's calls, so the standardized error of the
    window's ``S(t)`` is close to a Slepian process (correlation ``1 - |tau| / W``). For it the
    chance that the error passes ``u`` at some look within one window span is about
    ``Phi_bar(u) + u phi(u)`` (the first look, plus upcrossings at rate ``u phi(u) / W``:
    Pickands' constant 1 for correlations linear at 0; Shepp, Ann. Math. Statist. 42, 1971).
    ``z_scan`` solves ``Phi_bar(z_scan) + z_scan phi(z_scan) = alpha``: 2.795 at 95%, ratio
    1.426 (``tests/controller/policy/test_policy.py`` checks both). A check on the scenario
    suite: ``docs/evaluation.md``, "Rule 5: window looks".
    """
    alpha = (1.0 - confidence) / 2.0
    z = float(stats.norm.isf(alpha))
    scan = optimize.brentq(lambda u: stats.norm.sf(u) + u * stats.norm.pdf(u) - alpha, z, z + 10.0)
    return float(scan) / z


def looks_target(curve: KMCurve, budget: float, confidence: float) -> float | None:
    """The first first-token time whose window-looks upper bound on ``S`` is ``<= budget``, or None.

    The curve's two-sided log-log bound ``upper = S ** exp(-z sigma)`` (``estimation.km_curve``)
    gives the log-log standard error ``sigma`` at each time; the window-looks bound widens its
    half-width by :func:`window_scan_ratio`: ``S ** exp(-z_scan sigma)``. Where ``S = 0`` the
    curve's own (exact binomial) upper bound is kept; where ``S = 1`` or the bound is undefined
    nothing is proven (1). Rule 5 lowers a published value no further than this time.
    Worked number (``tests/controller/policy/test_policy.py``): 1,000 samples, none censored, 900 at
    1.0 s, 20 at 2.5 s and 80 at 5.0 s: at 2.5 s ``S = 0.080``, the target's bound 0.0979
    (the budget target is 2.5 s) and the window-looks bound 0.1061, so the window-looks time
    is 5.0 s (``S = 0``, exact bound 0.0044).
    """
    survival, upper = curve.survival, curve.upper
    inside = (survival > 0.0) & (survival < 1.0) & np.isfinite(upper) & (upper < 1.0) & (upper > 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_s = np.log(-np.log(np.where(inside, survival, 0.5)))
        log_u = np.log(-np.log(np.where(inside, upper, 0.5)))
        wide = np.exp(-np.exp(log_s - window_scan_ratio(confidence) * (log_s - log_u)))
    bound = np.where(inside, wide, np.where((survival <= 0.0) & np.isfinite(upper), upper, 1.0))
    ok = np.flatnonzero(curve.event & (bound <= budget + 1e-12))
    return float(curve.times_s[ok[0]]) if ok.size else None
