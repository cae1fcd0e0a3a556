"""The throughput floor: a level's sustained throughput, over one server start or several, against its baseline's
floor, decided by the interval. Pure functions over LevelResults: nothing here knows HTTP or pytest.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from scipy import stats
from ..store.baselines import Entry
from .noise import FALSE_ALARM, MIN_TOLERANCE
from .noise import of as noise_of
from ..categories import ACCEPTANCE, FASTER, INCONCLUSIVE, PREFIX_CACHE, REGRESSION
from ..environment.gpu import describe as gpu_describe
from ..records import METRICS, LevelResult, half_width, value_format
from .disturbance import STEAL_NAMED, steal_share


@dataclass(frozen=True)
class FloorVerdict:
    outcome: str  # "pass" | "regression" | "inconclusive"
    metric: str
    value: float | None
    ci95: float | None
    floor: float
    baseline: float
    tolerance: float
    message: str
    set_aside: tuple[int, ...] = ()  # the starts (0-based) left out of the judged mean as outliers

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"

    def failure(self, where: str = "") -> str:
        return self.message

    @property
    def detail(self) -> str:
        """The message without its category prefix: what an INVALID (disturbed) level quotes of its measurement,
        so the failure carries one category, not a REGRESSION inside an INVALID."""
        for prefix in (REGRESSION, PREFIX_CACHE, ACCEPTANCE, INCONCLUSIVE):
            if self.message.startswith(prefix + ": "):
                return self.message[len(prefix) + 2:]
        return self.message


def faster(v: FloorVerdict, where: str) -> str | None:
    """News for a passed throughput floor whose whole 95% interval lies above the baseline by more than its
    tolerance: as sure as a regression would be, the other way. It fails nothing (a faster stack is no fault) but
    says the baseline no longer describes this stack, so a later drop back to it would pass unseen."""
    if v.outcome != "pass" or v.metric != "sustained_output_tps" or not v.value or not v.baseline:
        return None
    low, ceiling = v.value - (v.ci95 or 0.0), v.baseline * (1 + v.tolerance)
    if low <= ceiling:
        return None
    return (f"{FASTER}: {where}: {v.value:,.1f} ± {v.ci95 or 0.0:,.1f} tok/s is {v.value / v.baseline - 1:+.1%} over "
            f"the baseline's {v.baseline:,.1f}, all of its 95% interval past baseline x (1 + {v.tolerance:.1%}) = "
            f"{ceiling:,.1f}: the stack or the workload got faster, or the baseline is stale; review it "
            f"(`sglperf baseline update`), else a drop back to the old speed passes unseen")


def floor_outcome(value: float | None, ci95: float | None, floor: float, slack: float = 0.0) -> str:
    """Decided by the interval: all of it at or above the floor passes, all of it below is a regression, one that
    straddles the floor is inconclusive. A metric without an interval (whole-run) is compared as a point. `slack`:
    a share the host may have taken from the value without being named a disturbance (the simulator's lateness
    below its limit): a regression must stand below the floor even with it given back."""
    if value is None:
        return "inconclusive"
    half = ci95 or 0.0
    if value - half >= floor:
        return "pass"
    if value * (1 + slack) + half < floor:
        return "regression"
    return "inconclusive"


def floor_of(entry: Entry, starts: float = 1) -> tuple[float, float]:
    """(floor, tolerance) for a value measured over `starts` server starts: the calibrated noise's prediction bound
    for that many starts (judge/noise.py), else the entry's own tolerance."""
    noise = noise_of(entry)
    if noise is None or starts == 1:
        return entry.floor, entry.tolerance
    tol = noise.tolerance(starts, floor=entry.min_tolerance if entry.min_tolerance is not None else MIN_TOLERANCE)
    return entry.value * (1 - tol), tol


def weights(levels: list[LevelResult], metric: str, noise=None) -> list[float]:
    """Each start's weight in a level's value over its starts: the inverse of its variance, its own interval's and
    the between-start noise's together (the random-effects mean, with the baseline's between-start CV as the
    between-start variance). Starts as precise as each other weigh the same; a start with a dip in its window weighs
    less, so one imprecise start does not leave the level undecided."""
    values = [v for r in levels if (v := getattr(r, metric)) is not None]
    halves = [h for r in levels if (h := half_width(r, metric)) is not None]
    if len(levels) < 2 or len(halves) < len(levels) or len(values) < len(levels):
        return [1.0] * len(levels)
    mean = sum(values) / len(values)
    tau2 = ((noise.between if noise is not None else 0.0) * mean) ** 2
    var = [(h / 1.96) ** 2 + tau2 for h in halves]
    if any(v <= 0 for v in var):
        return [1.0] * len(levels)
    return [1.0 / v for v in var]


def effective_starts(levels: list[LevelResult], metric: str, noise=None) -> float:
    """How many starts a weighed mean is worth against the between-start noise: (sum w)^2 / sum w^2 (Kish)."""
    w = weights(levels, metric, noise)
    return sum(w) ** 2 / sum(x * x for x in w)


def combined(levels: list[LevelResult], metric: str, noise=None) -> tuple[float | None, float | None]:
    """The mean of a level's values over its server starts, weighed by their precision (`weights`), and its 95%
    interval: the starts' own intervals together. Where the starts disagree beyond the baseline's run-to-run noise
    (`noise`, judge/noise.py: their variance above its CV's at F(0.99)), the baseline's model is refuted for this
    run and the interval is what their spread, pooled with the baseline's between-start CV, says of their mean (two
    starts 30% apart are no ±1% mean). Starts that agree keep the floor's own accounting of
    between-start noise, and three or more that agree closer than their intervals say cap the interval at what
    their spread says."""
    values = [getattr(r, metric) for r in levels]
    if any(v is None for v in values):
        return None, None
    n, w = len(values), weights(levels, metric, noise)
    mean = sum(x * v for x, v in zip(w, values)) / sum(w)
    halves = [h for r in levels if (h := half_width(r, metric)) is not None]
    half = None if len(halves) < n else math.sqrt(sum((x * h) ** 2 for x, h in zip(w, halves))) / sum(w)
    if n >= 2 and mean:
        observed = sum((v - mean) ** 2 for v in values) / (n - 1)
        cv, between, df = (noise.cv, noise.between, noise.df) if noise is not None else (0.0, 0.0, 0.0)
        expected = (cv * mean) ** 2
        if expected == 0 or observed / expected > float(stats.f.ppf(0.99, n - 1, max(df, 1.0))):
            mean = sum(values) / n  # disagreeing starts: none is the better measure of the level
            observed = sum((v - mean) ** 2 for v in values) / (n - 1)
            pooled = (df * (between * mean) ** 2 + (n - 1) * observed) / (df + n - 1)
            spread_half = float(stats.t.ppf(0.975, df + n - 1)) * math.sqrt(pooled / n)
            half = spread_half if half is None else max(half, spread_half)
        elif half is not None and n >= 3:
            # agreeing starts bound the within-run error of their mean from above: their spread holds it and the
            # between-start part (a one-second dip read as autocorrelation widens each start's interval, not their
            # spread).
            half = min(half, float(stats.t.ppf(0.975, n - 1)) * math.sqrt(observed / n))
    return mean, half


OUTLIER_FALSE = 0.001  # a healthy start set aside as an outlier, per level judged over 3+ starts


def outlier_start(levels: list[LevelResult], metric: str, noise=None) -> tuple[int | None, str]:
    """(index, why) of the one start of 3+ that lies apart from the others while they agree among themselves,
    else (None, ""). Apart: further from the others' median than t(1 - OUTLIER_FALSE / 2n, df) baseline run-to-run
    SDs. A server may run one start in another mode (llama.cpp's step time doubling partway through a level and
    staying there): that is a mode of the start, not the server's speed. A regression moves every start."""
    values = [getattr(r, metric) for r in levels]
    n = len(values)
    if n < 3 or noise is None or noise.cv <= 0 or any(not v for v in values):
        return None, ""
    limit = float(stats.t.ppf(1 - OUTLIER_FALSE / (2 * n), max(noise.df, 1.0)))
    best, best_z, best_ref = None, 0.0, 0.0
    for i, v in enumerate(values):
        ref = statistics.median(values[:i] + values[i + 1:])
        z = abs(v - ref) / (noise.cv * ref * math.sqrt(1 + 1 / (n - 1)))
        if z > best_z:
            best, best_z, best_ref = i, z, ref
    if best is None:  # every start read the same: none lies apart
        return None, ""
    others = values[:best] + values[best + 1:]
    m = sum(others) / len(others)
    spread = sum((x - m) ** 2 for x in others) / (len(others) - 1) / (noise.cv * m) ** 2
    if best_z <= limit or spread > float(stats.f.ppf(0.99, len(others) - 1, max(noise.df, 1.0))):
        return None, ""
    return best, (f"start {best + 1} ({values[best]:,.1f}) set aside: {values[best] / best_ref - 1:+.1%} from the "
                  f"other starts' {best_ref:,.1f}, {best_z:.1f} x the baseline's run-to-run SD (limit {limit:.1f}), "
                  f"while they agree: the server ran in another mode on that start")


def check_floor(level: LevelResult | list[LevelResult], entry: Entry, *, where: str, baseline_source: str,
                log_path: str | None, env_diff: str = "", last: bool = False,
                regression: str = REGRESSION) -> FloorVerdict:
    """`level`: the level's result, or its results over several server starts (replicates), judged by their mean
    against the floor for that many starts, less one outlier start (`outlier_start`), named. `last`: no more
    starts will be taken. An interval that still straddles the floor is then decided by its point against the
    prediction bound that carries the between-start and the within-run noise together (t(0.995) x their
    quadrature sum, never above the floor; the interval's test spent the other half of the 1%): false regressions
    stay at 1%, and a level 4% low on a slower host after three starts is not left red for want of a fourth. A
    level less precise than its floor is wide stays undecided. `regression`: the category a drop is named by (a
    prefix cache's share falls as PREFIX CACHE REGRESSION, decide/prefix.py)."""
    starts = level if isinstance(level, list) else [level]
    noise = noise_of(entry)
    aside, aside_why = outlier_start(starts, entry.metric, noise)
    if aside is not None:
        starts = starts[:aside] + starts[aside + 1:]
    value, ci = combined(starts, entry.metric, noise)
    k = effective_starts(starts, entry.metric, noise) if len(starts) > 1 else 1
    floor, tol = floor_of(entry, k)
    slack = max((r.sim_behind_share or 0.0) for r in starts)
    outcome = floor_outcome(value, ci, floor, slack)
    decided = ""
    if outcome == "inconclusive" and last and value and ci is not None and noise is not None and ci / value <= tol:
        t = float(stats.t.ppf(1 - FALSE_ALARM / 2, max(noise.df, 1.0)))  # half the rate: the interval spent its own
        bound = min(floor, entry.value * (1 - t * math.hypot(noise.spread(k), ci / 1.96 / value)))
        outcome = "pass" if value * (1 + slack) >= bound else "regression"
        decided = (f"; its interval straddles the floor at the last start allowed: decided by the value against "
                   f"{bound:,.1f}, the bound for between-start and within-run noise together (0.5% false alarms)")
    unit, fmt = METRICS[entry.metric].unit, value_format(entry.metric)
    ci_s = f" ± {ci:{fmt}}" if ci is not None else ""
    delta = f" ({value / entry.value - 1:+.1%} vs baseline)" if value else ""
    weighed = f", weighed by precision: worth {k:.1f} starts" if len(starts) > 1 and k < len(starts) - 0.05 else ""
    over = (f" (mean of {len(starts)} server starts: " + ", ".join(f"{getattr(r, entry.metric):,.1f}" for r in starts)
            + weighed + ")") if len(starts) > 1 else ""
    if aside is not None:
        over += f" ({aside_why})"
    why = (f"; between starts ±{noise.between:.1%} (CV, {noise.df:.0f} df)" if noise else "")
    if len(starts) > 1 and value:
        sd = math.sqrt(sum((getattr(r, entry.metric) - value) ** 2 for r in starts) / (len(starts) - 1))
        why += f", this run's starts ±{sd / value:.1%} (SD)"
    msg = (f"{where}: {entry.metric} {value if value is None else format(value, fmt)}{ci_s} {unit}{over}{delta}; "
           f"floor {floor:{fmt}} = baseline {entry.value:{fmt}} x (1 - {tol:.1%}){why}; "
           f"baseline: {baseline_source} (taken {entry.taken_at} from {entry.source})")
    msg += decided
    if outcome == "inconclusive":
        msg += "; the 95% interval straddles the floor"
        if slack and value is not None and value - (ci or 0) < floor:
            msg += (f" (the simulator ran {slack:.1%} late against its own step times: that much of the drop may be "
                    f"the host's)")  # over the disturbance limit the level is INVALID, and that message says so
    stolen = max(steal_share(r) for r in starts)
    if outcome != "pass" and stolen >= STEAL_NAMED:
        msg += (f"; the hypervisor stole up to {stolen:.1%} of the CPU the work wanted, under the disturbance limit "
                f"(a quiet host: under 0.5%): not set aside, named")
    if env_diff:
        msg += f"; {env_diff}"
    if outcome != "pass" and starts[-1].gpu:  # a throttling GPU is a real cause: name what the clocks did
        msg += f"; GPU telemetry: {gpu_describe(starts[-1].gpu)}"
    if log_path:
        msg += f"; server log: {log_path}"
    prefix = {"pass": "", "regression": f"{regression}: ", "inconclusive": f"{INCONCLUSIVE}: "}[outcome]
    return FloorVerdict(outcome, entry.metric, value, ci, floor, entry.value, tol, prefix + msg,
                        () if aside is None else (aside,))


def decides_floor(floor: float):
    """For the level runner: stop once the sustained interval is wholly on one side of the floor."""
    def decided(r: LevelResult) -> bool:
        return floor_outcome(r.sustained_output_tps, r.sustained_output_tps_ci95, floor) != "inconclusive" and \
            r.sustained_output_tps_ci95 is not None
    return decided
