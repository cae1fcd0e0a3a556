"""The sustained rate's 95% interval over a steady-state window, from the token arrivals inside it, and words for a
rate that changed regime inside the window.

Why its own module: the interval is what every floor, plateau and A/B decision rests on; how it is estimated (and
how well it covers on independent, autocorrelated, lockstep and deterministic streams) is measured in
tests/test_intervals.py and docs/measurement.md.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats


def batch_means(times: np.ndarray, tokens: np.ndarray, window: tuple[float, float], batch_min_s: float,
                min_batches: int, max_batches: int) -> tuple[float, float | None, int]:
    """(rate, CI half-width or None when fewer than min_batches fit, number of batches)."""
    s, e = window
    length = e - s
    inside = (times >= s) & (times < e)
    rate = float(tokens[inside].sum() / length) if length > 0 else 0.0
    k = min(max_batches, int(length // batch_min_s)) if batch_min_s > 0 else max_batches
    if k < min_batches:
        return rate, None, k
    rates = batch_rates(times, tokens, window, k)
    sd = rates.std(ddof=1)
    if sd <= 1e-9 * abs(rates.mean()):  # identical batches (to rounding): lockstep cohorts, not precision; unknown
        return float(rates.mean()), None, k
    half = float(stats.t.ppf(0.975, k - 1) * sd / math.sqrt(k))
    return float(rates.mean()), half, k


def batch_rates(times: np.ndarray, tokens: np.ndarray, window: tuple[float, float], k: int) -> np.ndarray:
    s, e = window
    inside = (times >= s) & (times < e)
    # np.histogram's bins, without its sort (given edges, it sorts every chunk time at every check)
    batch = np.searchsorted(np.linspace(s, e, k + 1), times[inside], side="right") - 1
    per_batch = np.bincount(np.minimum(batch, k - 1), weights=tokens[inside], minlength=k)
    return per_batch / ((e - s) / k)


def regime_shift(times: np.ndarray, tokens: np.ndarray, window: tuple[float, float], k: int, *,
                 min_side: int = 5, alpha: float = 1e-3, min_shift: float = 0.05) -> str | None:
    """Words for a throughput that moved from one steady rate to another inside the window, else None.

    A server can switch regime mid-level (docs/measurement.md): the interval then covers both and its mean is
    neither. The best single split of the window's k batch rates,
    by Welch's t-test (scipy), Bonferroni-corrected over the splits tried, at least `min_side` batches each side and
    a shift of at least `min_shift`: named in the level's warnings, so a wide interval says why it is wide."""
    if k < 2 * min_side:
        return None
    rates = batch_rates(times, tokens, window, k)
    splits = range(min_side, k - min_side + 1)
    best = None
    for i in splits:
        a, b = rates[:i], rates[i:]
        if min(a.std(), b.std()) <= 1e-9 * abs(rates.mean()):  # a side with no spread: a lockstep cohort, no test
            continue
        p = stats.ttest_ind(a, b, equal_var=False).pvalue
        if best is None or p < best[0]:
            best = (p, i)
    if best is None or not best[0] * len(splits) < alpha:
        return None
    p, i = best
    before, after = float(rates[:i].mean()), float(rates[i:].mean())
    shift = after / before - 1 if before > 0 else math.inf
    if abs(shift) < min_shift:
        return None
    at = (window[1] - window[0]) * i / k
    return (f"throughput changed inside the window: {before:,.0f} tok/s for its first {at:.0f} s, then {after:,.0f} "
            f"({shift:+.0%}; Welch p = {min(1.0, p * len(splits)):.0e} over {k} batches): the server ran in two "
            f"regimes, and the interval spans both")


