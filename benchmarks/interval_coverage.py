"""Coverage of the sustained rate's 95% interval, estimator x stream kind, on streams whose true rate is known
(tests/streams.py): the interval before issue 25 (batch means of >= one lifetime, "unknown" on zero spread), the one
of 10 equal batches (until 2026-12-02), batches of whole lifetimes at most 10 of them (until 2026-12-03) and the one
the suite uses (measure/intervals.sustained_interval: whole lifetimes, never fewer batches as the window grows, and
phased batches below 5 of them), also told a wrong lifetime, and with 10 equal batches below 5 lifetimes (until
2026-12-04). Prints the table docs/measurement.md quotes.

    python benchmarks/interval_coverage.py [--trials 1000] [--short | --window 3,5]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sglperf.measure import intervals  # noqa: E402
from sglperf.measure.intervals import batch_rates, sustained_interval  # noqa: E402
from tests.streams import KINDS, coverage  # noqa: E402


def before(times, tokens, window):
    """The previous estimator: k = min(30, window // lifetime) batches, t(k-1), unknown when all batches agree."""
    s, e = window
    k = min(30, int(e - s))
    rates = batch_rates(times, tokens, window, k)
    sd = rates.std(ddof=1)
    if sd <= 1e-9 * abs(rates.mean()):
        return rates.mean(), None
    return rates.mean(), stats.t.ppf(0.975, k - 1) * sd / math.sqrt(k)


def equal(times, tokens, window):
    """The estimator until 2026-12-02: 10 equal batches, whatever the lifetime."""
    iv = sustained_interval(times, tokens, window)
    return iv.rate, iv.half


def now(times, tokens, window, lifetime=1.0):
    """The suite's: batches of whole lifetimes from 5 lifetimes on (the streams' lifetime is 1.0)."""
    iv = sustained_interval(times, tokens, window, lifetime=lifetime)
    return iv.rate, iv.half


def _at_most_batches(window, batches, lifetime):
    """The whole-lifetime batching until 2026-12-03: m the smallest giving at most `batches` batches (a window just
    past 10 lifetimes: 5 batches of 2)."""
    s, e = window
    if not lifetime or lifetime <= 0 or (e - s) < intervals.MIN_ALIGNED * lifetime:
        return batches, window
    per = math.ceil((e - s) / (batches * lifetime) - 1e-9) * lifetime
    k = int((e - s) // per)
    return k, (s, s + k * per)


def at_most_ten(times, tokens, window):
    """The suite's estimator with that batching put back (and, as then, no phased batches)."""
    now_rule, intervals.aligned_batches = intervals.aligned_batches, _at_most_batches
    try:
        return equal_below_aligned(times, tokens, window)
    finally:
        intervals.aligned_batches = now_rule


def equal_below_aligned(times, tokens, window):
    """The suite's with 10 equal batches below MIN_ALIGNED lifetimes, as until 2026-12-04 (no phased batches)."""
    was, intervals.MIN_PHASED = intervals.MIN_PHASED, intervals.MIN_ALIGNED
    try:
        return now(times, tokens, window)
    finally:
        intervals.MIN_PHASED = was


def misjudged(factor):
    """The suite's, told a lifetime `factor` times the true one (a service lifetime read off noisy records)."""
    return lambda times, tokens, window: now(times, tokens, window, factor)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--short", action="store_true", help="windows of 3-10 lifetimes instead of 10-40")
    ap.add_argument("--window", help="windows of A-B lifetimes (e.g. 3,5: where phased batches apply)")
    a = ap.parse_args()
    lengths = tuple(float(x) for x in a.window.split(",")) if a.window else (3.0, 10.0) if a.short else (10.0, 40.0)
    print(f"nominal 95%; {a.trials} windows of {lengths[0]:g}-{lengths[1]:g} request lifetimes per cell; "
          f"cell: coverage (mean half-width)")
    print(f"{'estimator':<38}" + "".join(f"{k:>20}" for k in KINDS))
    for name, est in (("batch means (before)", before), ("10 batches + AR(1) + resolution", equal),
                      ("lifetime batches, at most 10 (12-03)", at_most_ten),
                      ("equal batches below 5 lifetimes (12-04)", equal_below_aligned),
                      ("lifetime batches + AR(1) + res. (now)", now), ("now, lifetime read 20% short", misjudged(0.8)),
                      ("now, lifetime read 25% long", misjudged(1.25))):
        cells = [coverage(est, kind, a.trials, seed=11 + i, lengths=lengths) for i, kind in enumerate(KINDS)]
        print(f"{name:<38}" + "".join(f"{c:>11.1%} (±{w:.2%})" for c, w in cells), flush=True)


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
