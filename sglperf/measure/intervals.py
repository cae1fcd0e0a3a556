"""The sustained rate's 95% interval over a steady-state window, from the token arrivals inside it, and words for a
rate that changed regime inside the window.

Why its own module: the interval is what every floor, plateau and A/B decision rests on; how it is estimated (and
how well it covers on independent, autocorrelated, lockstep and deterministic streams) is measured in
tests/test_intervals.py and docs/measurement.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats


BATCHES = 10  # the window is cut into this many equal batches, whatever its length
MAX_AR1 = 0.9  # a lag-1 correlation at or above this inflates the interval no further (x 4.4)


@dataclass(frozen=True)
class Interval:
    """The sustained rate over a window and its 95% half-width, with the parts it is made of: the batch means' part
    (t over BATCHES batches, inflated for the batches' lag-1 correlation) and the counting resolution (tokens arrive
    in steps: the window's edges cut a step's cohort at some phase)."""

    rate: float
    half: float | None
    batches: int
    ar1: float = 0.0
    resolution: float = 0.0


def sustained_interval(times: np.ndarray, tokens: np.ndarray, window: tuple[float, float],
                       batches: int = BATCHES, lifetime: float | None = None) -> Interval:
    """Chosen by coverage on simulated independent, autocorrelated, lockstep and deterministic streams
    (benchmarks/interval_coverage.py, docs/measurement.md): batch means alone undercover correlated streams and give
    a zero spread on deterministic ones; the AR(1) factor and the resolution mend both. Never zero for a window that
    holds tokens: a server too steady to show spread is known to its counting resolution, no better.

    Given the service `lifetime` (metrics.service_lifetime), batches follow a closed loop's cycle: its cohorts
    prefill and decode once per lifetime, and a batch that holds part of that cycle measures where it cut it, not
    the server's rate. From MIN_ALIGNED lifetimes the batches are whole lifetimes (aligned_batches); from
    MIN_PHASED, too few for that, each whole lifetime is cut into PHASES parts and the spread is taken after each
    part's mean over the lifetimes is removed (phased_spread)."""
    s, e = window
    length = e - s
    inside = (times >= s) & (times < e)
    if length <= 0 or not inside.any():
        return Interval(0.0, None, 0)
    rate = float(tokens[inside].sum() / length)
    n = whole_lifetimes(window, lifetime)
    if MIN_PHASED <= n < MIN_ALIGNED:
        spread_window = (s, s + n * lifetime)
        k, deviations, df = n * PHASES, *phased_spread(batch_rates(times, tokens, spread_window, n * PHASES), n)
    else:
        k, spread_window = aligned_batches(window, batches, lifetime)
        rates = batch_rates(times, tokens, spread_window, k)
        deviations, df = rates - rates.mean(), k - 1
    r1 = lag1(deviations)
    # the lag-1 estimate from a few batches is biased low by about (1 + 4 rho) / k (Marriott and Pope, 1954)
    # (corrected wherever it is positive: only correcting above its own noise, 1 / sqrt(k), left correlated streams
    # at 92% coverage; independent ones pay ~7% of width for it, docs/measurement.md)
    rho = min(MAX_AR1, r1 + (1 + 4 * r1) / k) if r1 > 0 else 0.0
    # correlated batches carry fewer independent ones: the spread is inflated by the AR(1) variance factor and the t
    # quantile taken at the effective degrees of freedom; the batches' standard error is scaled from their span to
    # the window's (a tail of the window shorter than a batch is in the rate, not in the batches)
    inflation = (1 + rho) / (1 - rho)
    sd = math.sqrt(float((deviations * deviations).sum()) / df)
    covered = (spread_window[1] - spread_window[0]) / length
    spread = float(stats.t.ppf(0.975, max(2.0, df / inflation)) * sd / math.sqrt(k / covered)) * math.sqrt(inflation)
    res = resolution(times[inside], tokens[inside], window, batches, rate)
    return Interval(rate, math.hypot(spread, res), k, round(rho, 3), res)


MIN_ALIGNED = 5  # whole-lifetime batches from this many on: fewer leave the t quantile and the lag-1 estimate wild
MIN_PHASED = 3  # phased batches from this many whole lifetimes (validity's trusted window) up to MIN_ALIGNED
PHASES = 3  # parts of a lifetime in phased batches: (n - 1) x 3 degrees of freedom, 6 at 3 lifetimes


def whole_lifetimes(window: tuple[float, float], lifetime: float | None) -> int:
    return int((window[1] - window[0]) / lifetime + 1e-9) if lifetime and lifetime > 0 else 0


def phased_spread(rates: np.ndarray, n: int) -> tuple[np.ndarray, int]:
    """(deviations, degrees of freedom) of batches that cut n whole lifetimes into PHASES parts each, in time order:
    each part's deviation from the same part's mean over the n lifetimes. A closed loop's cycle repeats every
    lifetime, so what is left is what moves the rate between lifetimes; the window's mean over whole lifetimes holds
    every part equally, so the parts' own means are no error of it. (n - 1) x PHASES degrees of freedom."""
    by_lifetime = rates.reshape(n, -1)
    return (by_lifetime - by_lifetime.mean(axis=0)).ravel(), (n - 1) * by_lifetime.shape[1]


def aligned_batches(window: tuple[float, float], batches: int,
                    lifetime: float | None) -> tuple[int, tuple[float, float]]:
    """(how many batches, the span they cut): `batches` equal ones over the window; or, over a window of at least
    MIN_ALIGNED lifetimes, batches of m whole lifetimes from the window's start, as many as fit, m the whole number
    nearest window / (`batches` x lifetime): one lifetime each up to 15 lifetimes, then 7-14 batches. The smallest m
    giving at most `batches` cut a window just past 10 lifetimes into 5 batches of 2, whose t quantile and lag-1
    correction widened the interval 2.5-fold at once: a level that ran on read less precise (docs/measurement.md).
    One lifetime a batch at any length undercovers correlated streams (92.7%)."""
    s, e = window
    if whole_lifetimes(window, lifetime) < MIN_ALIGNED:
        return batches, window
    m = max(1, round((e - s) / (batches * lifetime)))
    per = m * lifetime
    k = int((e - s) / per + 1e-9)
    return k, (s, s + k * per)


def lag1(x: np.ndarray) -> float:
    d = x - x.mean()
    den = float((d * d).sum())
    return float((d[1:] * d[:-1]).sum() / den) if den > 0 else 0.0


def resolution(times: np.ndarray, tokens: np.ndarray, window: tuple[float, float], batches: int,
               rate: float) -> float:
    """How far the window's count can be off the rate by where its edges cut the arrivals: within each batch, the
    range of (tokens so far - rate x time) plus the largest single arrival; the median over batches, per second of
    window. For a periodic (lockstep) stream that is its cohort's swing; for a random one it is small next to the
    batch means' part."""
    s, e = window
    order = np.argsort(times, kind="stable")
    t, n = times[order], tokens[order]
    drift = np.cumsum(n) - rate * (t - s)
    which = np.minimum(np.searchsorted(np.linspace(s, e, batches + 1), t, side="right") - 1, batches - 1)
    starts = np.flatnonzero(np.r_[True, which[1:] != which[:-1]])
    hi, lo = np.maximum.reduceat(drift, starts), np.minimum.reduceat(drift, starts)
    step = np.maximum.reduceat(n, starts)
    return float(np.median(hi - lo + step)) / (e - s)


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


