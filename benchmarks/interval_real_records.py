"""The sustained interval on real records: for every level of the run files given, the interval of each half of its
recorded window, and whether the two halves agree within their intervals (|r1 - r2| <= hypot(h1, h2): about 95% of
levels should, if the intervals are honest and the level stationary), for the estimator before and the one the
suite uses. Prints one row per level and a summary.

    python benchmarks/interval_real_records.py RUN.json [RUN.json ...]
"""

from __future__ import annotations

import gzip
import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sglperf.measure.intervals import batch_rates, sustained_interval  # noqa: E402


def before(times, tokens, window, lifetime):
    s, e = window
    k = min(30, int((e - s) // lifetime)) if lifetime else 0
    if k < 5:
        return None, None
    rates = batch_rates(times, tokens, window, k)
    sd = rates.std(ddof=1)
    if sd <= 1e-9 * abs(rates.mean()):
        return rates.mean(), None
    return rates.mean(), stats.t.ppf(0.975, k - 1) * sd / math.sqrt(k)


def now(times, tokens, window, lifetime):
    iv = sustained_interval(times, tokens, window, lifetime=lifetime)  # as the suite calls it (measure/level.py)
    return iv.rate, iv.half


def arrivals(path: Path) -> tuple[np.ndarray, np.ndarray]:
    ts, ns = [], []
    for line in gzip.decompress(path.read_bytes()).splitlines():
        r = json.loads(line)
        if r.get("error") is None and r.get("chunk_times"):
            ts += r["chunk_times"]
            ns += r["chunk_tokens"]
    return np.array(ts), np.array(ns, float)


def levels(run_file: Path):
    doc = json.loads(run_file.read_text())
    base = run_file.parent
    for cname, c in doc["configs"].items():
        for lv, r in c["levels"].items():
            if r.get("records_file") and r.get("window_start") is not None:
                path = base / r["records_file"]
                if not path.exists():  # a run file moved without its reports dir: records beside it
                    path = base / doc["run_id"] / Path(r["records_file"]).name
                if path.exists():
                    yield f"{doc['profile']}/{cname} c{lv}", path, (r["window_start"], r["window_end"]), r["lifetime_s"]


def main() -> None:
    agree = {"before": [], "now": []}
    print(f"{'level':<28} {'window s':>8} {'before: halves, ±':>30} {'now: halves, ±':>30}")
    for f in sys.argv[1:]:
        for name, path, (s, e), life in levels(Path(f)):
            times, tokens = arrivals(path)
            mid = (s + e) / 2
            cells = []
            for est_name, est in (("before", before), ("now", now)):
                (r1, h1), (r2, h2) = est(times, tokens, (s, mid), life), est(times, tokens, (mid, e), life)
                if h1 is None or h2 is None:
                    cells.append(f"{'unknown':>30}")
                    agree[est_name].append(False)
                    continue
                ok = abs(r1 - r2) <= math.hypot(h1, h2)
                agree[est_name].append(ok)
                cells.append(f"{r1:>9,.0f} {r2:>9,.0f} ±{math.hypot(h1, h2) / r1:>6.2%} {'ok' if ok else 'NO':>3}")
            print(f"{name:<28} {e - s:>8.1f} " + " ".join(cells))
    for k, v in agree.items():
        if v:
            print(f"{k}: the halves agree within their intervals at {sum(v)} of {len(v)} levels "
                  f"({sum(v) / len(v):.0%})")


if __name__ == "__main__":
    main()
