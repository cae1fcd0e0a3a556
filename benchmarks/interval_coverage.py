"""Coverage of the sustained rate's 95% interval, estimator x stream kind, on streams whose true rate is known
(tests/streams.py): the interval before this change (batch means of >= one lifetime, "unknown" on zero spread) and
the one the suite uses (measure/intervals.sustained_interval). Prints the table docs/measurement.md quotes.

    python benchmarks/interval_coverage.py [--trials 1000] [--short]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

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


def now(times, tokens, window):
    iv = sustained_interval(times, tokens, window)
    return iv.rate, iv.half


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--short", action="store_true", help="windows of 3-10 lifetimes instead of 10-40")
    a = ap.parse_args()
    lengths = (3.0, 10.0) if a.short else (10.0, 40.0)
    print(f"nominal 95%; {a.trials} windows of {lengths[0]:g}-{lengths[1]:g} request lifetimes per cell; "
          f"cell: coverage (mean half-width)")
    print(f"{'estimator':<34}" + "".join(f"{k:>20}" for k in KINDS))
    for name, est in (("batch means (before)", before), ("batches + AR(1) + resolution (now)", now)):
        cells = [coverage(est, kind, a.trials, seed=11 + i, lengths=lengths) for i, kind in enumerate(KINDS)]
        print(f"{name:<34}" + "".join(f"{c:>11.1%} (±{w:.2%})" for c, w in cells))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
