"""Between-start noise: how much a level moves from one server start to the next, as a baseline keeps it, and what
that means for a floor: the tolerance for a run of k starts, the smallest drop it catches, the runs that would
tighten it.

Why its own module: on a real GPU a level's own interval says almost nothing about what a re-run measures (a
deterministic closed loop repeats itself within a start, not across starts); every decision against a baseline, and
the A/B between two servers started one after the other, carries this noise, and three runs alone estimate it
badly. So a level's variance is pooled with the other levels of its profile and hardware class by empirical Bayes
(the moderated variance of limma: Smyth 2004), which gives its estimate the degrees of freedom of the whole
calibration where the levels agree and keeps a level's own where it stands apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy import optimize, special, stats

FALSE_ALARM = 0.01  # a floor's false regressions per level
POWER = 0.95
# the smallest tolerance a floor has whatever the noise: a level's own interval at the default +/-1% target makes two
# measurements of an unchanged system differ by up to 1.96 x sqrt(2) x 1% = 2.8%
MIN_TOLERANCE = 0.03
MAX_DF = 1000.0  # "the levels agree": the prior's degrees of freedom are capped here


@dataclass(frozen=True)
class Noise:
    """A level's run-to-run noise, relative: `cv` of one run's value (between starts and within the run, moderated),
    its degrees of freedom `df`, the calibration runs' own within-run part `within` (the relative standard error of
    their intervals) and the number of runs `runs` the baseline value is the mean of."""

    cv: float
    df: float
    within: float = 0.0
    runs: int = 1
    # the part of the run-to-run noise that stays with the host: restarts on one host do not average it away. Not
    # capped by `between`: at c8 the calibration runs' own intervals (lockstep counting) exceed their spread
    host: float = 0.0
    hosts: int = 0  # the calibration's hosts, where its runs said which (0: not known, `host` is then 0)
    # the part a restart inside one run draws afresh (the calibration runs' replicate starts, pooled over the
    # levels). Restarts minutes apart share the host's state of those minutes, so they differ less than runs do.
    # None: not measured, each start is
    # taken as a fresh draw of all but the host's part
    restart: float | None = None

    @property
    def between(self) -> float:
        """What differs between server starts alone: the run-to-run variance less the runs' own within-run part."""
        return math.sqrt(max(0.0, self.cv ** 2 - self.within ** 2))

    def spread(self, starts: float = 1) -> float:
        """Relative SD of (a run of `starts` starts, less the baseline value), its within-run part left out: that
        part is the run's own interval, which the verdict uses beside the floor. A run on another host keeps the
        host's part whatever its starts; the baseline's mean carries it once per calibration host."""
        host = min(self.host, self.cv)
        mean_var = (host ** 2 / self.hosts + (self.cv ** 2 - host ** 2) / self.runs) if self.hosts else \
            self.cv ** 2 / self.runs
        stays, fresh = self.parts()
        return math.sqrt(stays + fresh / starts + mean_var)

    def parts(self) -> tuple[float, float]:
        """(variance that stays with a run whatever its restarts, variance each restart draws afresh), of the
        between-start noise: the host's part always stays; of the rest, what `restart` does not cover stays too."""
        host2, b2 = min(self.host, self.cv) ** 2, self.between ** 2
        fresh = max(0.0, b2 - host2)
        if self.restart is not None:
            fresh = min(fresh, self.restart ** 2)
        return max(host2, b2 - fresh), fresh

    def tolerance(self, starts: float = 1, *, false_alarm: float = FALSE_ALARM, floor: float = MIN_TOLERANCE) -> float:
        """The floor's distance below the baseline for a run of `starts` server starts: a one-sided prediction bound,
        t(1 - false_alarm, df) x spread, never below `floor`."""
        return max(floor, float(stats.t.ppf(1 - false_alarm, max(self.df, 1.0))) * self.spread(starts))

    def detectable(self, starts: int = 1, *, power: float = POWER, **kw) -> float:
        """The smallest drop a floor over `starts` starts catches with probability `power`: its interval wholly
        below the floor, or, at the last start allowed, its value below the bound for both noises together
        (judge/floor.check_floor), whichever catches the smaller."""
        own = 1.96 * self.within / math.sqrt(starts)  # the run's own half-width
        stays, fresh = self.parts()
        run_sd = math.sqrt(stays + (fresh + self.within ** 2) / starts)
        tol = self.tolerance(starts, **kw)
        z = float(stats.norm.ppf(power))
        point = max(tol, float(stats.t.ppf(1 - FALSE_ALARM / 2, max(self.df, 1.0)))
                    * math.hypot(self.spread(starts), self.within / math.sqrt(starts)))
        return min(tol + own, point) + z * run_sd

    def runs_for(self, drop: float, starts: int = 1, most: int = 100, **kw) -> int | None:
        """How many calibration runs (of this noise) would make `drop` detectable; None where no number of runs
        would (the between-start part alone is too large: measure more starts per run)."""
        for n in range(max(2, self.runs), most + 1):
            more = Noise(self.cv, self.df + (n - self.runs), self.within, n, self.host, self.hosts, self.restart)
            if more.detectable(starts, **kw) <= drop:
                return n
        return None


def host_share(groups: dict[tuple, dict[str, list[float]]]) -> tuple[float, int]:
    """(relative SD, hosts): the part of the levels' run-to-run variance that stays with the host, from runs whose
    host is known: per level a one-way random-effects estimate on log values ((MS between hosts - MS within) / n0),
    averaged over the levels (one number for the profile: a few hosts say little per level). (0, 0) unless some
    host has 2+ runs and there are 2+ hosts."""
    estimates, hosts = [], 0
    for per_host in groups.values():
        sizes = [len(v) for v in per_host.values()]
        n, g = sum(sizes), len(sizes)
        if g < 2 or n - g < 1:
            continue
        logs = {h: [math.log(x) for x in v] for h, v in per_host.items()}
        grand = sum(sum(v) for v in logs.values()) / n
        means = {h: sum(v) / len(v) for h, v in logs.items()}
        msw = sum((x - means[h]) ** 2 for h, v in logs.items() for x in v) / (n - g)
        msb = sum(len(v) * (means[h] - grand) ** 2 for h, v in logs.items()) / (g - 1)
        n0 = (n - sum(k * k for k in sizes) / n) / (g - 1)
        estimates.append((msb - msw) / n0)
        hosts = max(hosts, g)
    if not estimates:
        return 0.0, 0
    return math.sqrt(max(0.0, sum(estimates) / len(estimates))), hosts


def restart_share(runs: list[list[tuple[float, float]]]) -> tuple[float, float] | None:
    """(relative SD, df) of what a restart inside one run draws afresh, from runs' levels measured over 2+ kept
    server starts (each start: value, its own relative SE): their pooled within-run variance of log values, less
    the starts' own window variance. None where no level of any run had two starts. It errs high: a level is
    re-measured when its first start came out near the floor, so that start is more often low than a random one
    (a larger restart part tightens floors over several starts: the verdicts then err towards the old model)."""
    ss = df = own = 0.0
    count = 0
    for starts in runs:
        if len(starts) < 2:
            continue
        logs = [math.log(v) for v, _ in starts]
        m = sum(logs) / len(logs)
        ss += sum((x - m) ** 2 for x in logs)
        df += len(logs) - 1
        own += sum(se ** 2 for _, se in starts)
        count += len(starts)
    if not df:
        return None
    return math.sqrt(max(0.0, ss / df - own / count)), df


def prior(variances: list[float], dfs: list[float]) -> tuple[float, float]:
    """(s0^2, d0): the pooled variance the levels' variances scatter around, and how many degrees of freedom that
    prior is worth (limma's fitFDist by moments of log variances). d0 is MAX_DF where the levels agree within
    their sampling noise, 0 where there are too few levels to tell."""
    pts = [(max(v, 1e-12), d) for v, d in zip(variances, dfs) if d >= 1]
    if len(pts) < 3:
        return (sum(v * d for v, d in pts) / sum(d for _, d in pts), 0.0) if pts else (0.0, 0.0)
    e = [math.log(v) - special.digamma(d / 2) + math.log(d / 2) for v, d in pts]
    mean = sum(e) / len(e)
    excess = sum((x - mean) ** 2 for x in e) / (len(e) - 1) - sum(special.polygamma(1, d / 2) for _, d in pts) / len(e)
    if excess <= 0:
        d0 = MAX_DF
    else:
        d0 = min(MAX_DF, 2 * _trigamma_inverse(excess))
    s0 = math.exp(mean + special.digamma(d0 / 2) - math.log(d0 / 2))
    return s0, d0


def _trigamma_inverse(y: float) -> float:
    return optimize.brentq(lambda x: special.polygamma(1, x) - y, 1e-8, 1e8)


def moderate(variance: float, df: float, s0: float, d0: float) -> tuple[float, float]:
    """A level's variance shrunk toward the pool: (d0 s0^2 + d s^2) / (d0 + d), with d0 + d degrees of freedom."""
    if d0 <= 0:
        return variance, df
    return (d0 * s0 + df * variance) / (d0 + df), d0 + df


def of(entry) -> Noise | None:
    """A baseline entry's between-start noise, where it was calibrated (store/baselines.Entry; schema 1 files:
    runs - 1 df, no pool); None where it was not."""
    if entry.noise_cv is None or entry.runs < 2:
        return None
    return Noise(entry.noise_cv, entry.noise_df or entry.runs - 1, entry.within_cv or 0.0, entry.runs,
                 entry.host_cv or 0.0, entry.hosts or 0, entry.restart_cv)
