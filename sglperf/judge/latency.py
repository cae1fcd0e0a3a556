"""Latency ceilings per level: TTFT, TPOT, ITL and E2E percentiles against baselines, decided by intervals.

Why intervals, and which: a percentile from one level is an order statistic; its 95% interval comes from the
binomial distribution of how many requests fall below the true percentile (distribution-free, exact coverage >= 95%).
A p99 needs at least 368 requests before its interval has an upper end (1 - 0.99^n >= 0.975), so a level with fewer
cannot pass a p99 ceiling: it is inconclusive unless even the lower end is past the ceiling. The TTFT mean has a
t-interval (at least 30 requests): where TTFT is multi-modal (a request arrives during a run of continuous decode
steps or between them) its median jumps between modes while the mean moves with every mode's share and length
(docs/measurement.md). ITL percentiles pool every token's gap; tokens of one request are correlated, so the
interval is narrower than it should be: ITL verdicts
need a margin that the baseline's run-to-run tolerance supplies.

Past the KV ceiling requests queue by design, so TTFT and E2E grow with the level; there the suite judges only TPOT and
ITL, the decode-side latencies a driver or kernel
can move, and records TTFT and E2E as information.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
from scipy import stats

from ..categories import INCONCLUSIVE, LATENCY
from ..measure.metrics import latency_values
from ..records import METRICS, LevelResult, RequestRecord

QUEUEING = ("ttft_ms", "e2e_ms", "server_ttft_ms")  # grow with the queue past the ceiling: not judged there


PREFIX = {"pass": "", "not judged": "", "regression": f"{LATENCY}: ", "inconclusive": f"{INCONCLUSIVE}: "}
MIN_FOR_MEAN = 30  # below this a t-interval of a skewed latency's mean is not trusted


def mean_interval(values, conf: float = 0.95) -> tuple[float | None, float | None, float | None]:
    """(mean, lower, upper): Student's t over the requests; no ends below MIN_FOR_MEAN values."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return None, None, None
    est = float(x.mean())
    if x.size < MIN_FOR_MEAN:
        return est, None, None
    half = float(stats.t.ppf(0.5 + conf / 2, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size))
    return est, est - half, est + half


def percentile_interval(values, q: float, conf: float = 0.95) -> tuple[float | None, float | None, float | None]:
    """(estimate, lower, upper) of the q-quantile: order statistics x(l) <= x(u) with binomial coverage >= conf.
    An end the sample cannot give (too few values) is None."""
    x = np.sort(np.asarray(values, dtype=float))
    n = x.size
    if n == 0:
        return None, None, None
    alpha = 1 - conf
    lo = int(stats.binom.ppf(alpha / 2, n, q))  # x(lo) (1-based) is below the quantile with prob <= alpha/2
    hi = int(stats.binom.ppf(1 - alpha / 2, n, q)) + 1
    est = float(np.percentile(x, q * 100))
    return est, (float(x[lo - 1]) if lo >= 1 else None), (float(x[hi - 1]) if hi <= n else None)


def min_requests(q: float, conf: float = 0.95) -> int:
    """How many values a q-quantile needs before its interval has an upper end."""
    return int(np.ceil(np.log((1 - conf) / 2) / np.log(q)))


def ceiling_outcome(lo: float | None, hi: float | None, ceiling: float) -> str:
    """All of the interval at or below the ceiling passes, all of it above is a regression, else inconclusive."""
    if lo is not None and lo > ceiling:
        return "regression"
    if hi is not None and hi <= ceiling:
        return "pass"
    return "inconclusive"


def window_records(records: list[RequestRecord], r: LevelResult) -> list[RequestRecord]:
    """The requests the level's latency summaries describe: successful ones sent inside its window."""
    ok = [x for x in records if x.ok]
    if r.window_start is None or r.window_end is None:
        return ok
    inside = [x for x in ok if r.window_start <= x.send_time < r.window_end]
    return inside or ok


@dataclass(frozen=True)
class LatencyVerdict:
    outcome: str  # "pass" | "regression" | "inconclusive" | "not judged"
    metric: str
    value: float | None
    lower: float | None
    upper: float | None
    ceiling: float
    n: int
    message: str

    def failure(self, where: str = "") -> str:
        return self.message


def check_ceiling(records: list[RequestRecord], r: LevelResult, entry, *, where: str, baseline_source: str,
                  past_kv_ceiling: bool = False, env_diff: str = "") -> LatencyVerdict:
    """One latency entry (value, tolerance: ceiling = value x (1 + tolerance)) against the level's requests."""
    m = METRICS[entry.metric]
    series, q = m.series, m.stat
    assert series is not None and q is not None, f"{entry.metric} is not a latency metric"
    quantile = 0.5 if q == "mean" else float(q)
    values = latency_values(window_records(records, r))[series]
    est, lo, hi = mean_interval(values) if q == "mean" else percentile_interval(values, quantile)
    ceiling = entry.ceiling
    n = len(values)

    def f(x):
        return "?" if x is None else f"{x:,.1f}"

    body = (f"{where}: {entry.metric} {f(est)} ms (95% interval {f(lo)}–{f(hi)}, {n} "
            f"{'tokens' if series == 'itl_ms' else 'requests'}); ceiling {ceiling:,.1f} = baseline {entry.value:,.1f}"
            f" x (1 + {entry.tolerance:.1%}); baseline: {baseline_source} (taken {entry.taken_at} from "
            f"{entry.source})")
    if past_kv_ceiling and series in QUEUEING:
        return LatencyVerdict("not judged", entry.metric, est, lo, hi, ceiling, n,
                              body + "; past the KV ceiling requests queue by design: recorded, not judged")
    outcome = ceiling_outcome(lo, hi, ceiling)
    if outcome == "inconclusive" and hi is None:
        what, need = ("mean", MIN_FOR_MEAN) if q == "mean" else (f"p{quantile * 100:g}", min_requests(quantile))
        body += f"; {n} are too few for an upper end of the {what} interval (it needs {need}): give the level more time"
    elif outcome == "inconclusive":
        body += "; the 95% interval straddles the ceiling: re-run, or give the level more time"
    if env_diff:
        body += f"; {env_diff}"
    return LatencyVerdict(outcome, entry.metric, est, lo, hi, ceiling, n, PREFIX[outcome] + body)


def over_starts(outcomes: list[str], allowed: int) -> str | None:
    """A latency entry's outcome over the server starts judged so far (each start's own verdict), or None where
    another start should decide. One start that passes passes; one that does not is measured again, and the outcome
    is the one a majority of the `allowed` starts give, else, once no start is left, the most frequent decided one
    (a tie is inconclusive). Why: the simulator at rr24 c16 ran one start in a mode where 10% of requests waited two
    decode steps before their prefill (server TTFT mean 10.2 ms, p90 25.9, against 7.0-7.3 on other starts), and
    the start's own interval cannot see what differs between starts. A slower prefill slows every start."""
    ok = sum(o in ("pass", "not judged") for o in outcomes)
    bad = outcomes.count("regression")
    if len(outcomes) == 1 and ok:
        return outcomes[0]
    majority = allowed // 2 + 1
    if ok >= majority:
        return "pass"
    if bad >= majority:
        return "regression"
    if len(outcomes) < allowed:
        return None
    if len(outcomes) == 1:
        return outcomes[0]
    return "pass" if ok > bad else "regression" if bad > ok else "inconclusive"


def verdict_over_starts(each: list[LatencyVerdict], decided: str | None) -> LatencyVerdict:
    """One entry's verdict over its starts (`decided`: over_starts's outcome, None left undecided): the only
    start's where one was judged, else a start's with the decided outcome, naming every start's value. An entry
    the one start failed, where the profile wanted a majority of more starts and none could be had (a server started
    by hand, the restart budget spent), is inconclusive: one start may run in another mode, as the plateau's one-start
    violation is (decide/plateau)."""
    if len(each) == 1:
        if decided is not None or each[0].outcome != "regression":
            return each[0]
        body = each[0].message.removeprefix(PREFIX["regression"])
        return replace(each[0], outcome="inconclusive", message=(
            f"{PREFIX['inconclusive']}{body}; seen on one server start only, and no fresh start could be had to "
            f"repeat it: a latency ceiling is decided by the majority of the profile's starts, since one start can "
            f"run in another mode (a larger max_starts or start_budget_s, or a server the suite starts, would decide)"))
    outcome = decided or "inconclusive"
    pick = next((v for v in each if v.outcome == outcome), each[0])
    values = ", ".join(f"{'?' if v.value is None else format(v.value, ',.1f')} ({v.outcome})" for v in each)
    body = pick.message.removeprefix(PREFIX[pick.outcome])
    return replace(pick, outcome=outcome,
                   message=f"{PREFIX[outcome]}{body}; over {len(each)} server starts: {values}")
