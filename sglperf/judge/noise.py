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

    @property
    def between(self) -> float:
        """What differs between server starts alone: the run-to-run variance less the runs' own within-run part."""
        return math.sqrt(max(0.0, self.cv ** 2 - self.within ** 2))

    def spread(self, starts: int = 1) -> float:
        """Relative SD of (a run of `starts` starts, less the baseline value), its within-run part left out: that
        part is the run's own interval, which the verdict uses beside the floor."""
        return math.sqrt(self.between ** 2 / starts + self.cv ** 2 / self.runs)

    def tolerance(self, starts: int = 1, *, false_alarm: float = FALSE_ALARM, floor: float = MIN_TOLERANCE) -> float:
        """The floor's distance below the baseline for a run of `starts` server starts: a one-sided prediction bound,
        t(1 - false_alarm, df) x spread, never below `floor`."""
        return max(floor, float(stats.t.ppf(1 - false_alarm, max(self.df, 1.0))) * self.spread(starts))

    def detectable(self, starts: int = 1, *, power: float = POWER, **kw) -> float:
        """The smallest drop that falls wholly below the floor (its interval included) with probability `power`."""
        own = 1.96 * self.within / math.sqrt(starts)  # the run's own half-width
        run_sd = math.sqrt((self.between ** 2 + self.within ** 2) / starts)
        return self.tolerance(starts, **kw) + own + float(stats.norm.ppf(power)) * run_sd

    def runs_for(self, drop: float, starts: int = 1, most: int = 100, **kw) -> int | None:
        """How many calibration runs (of this noise) would make `drop` detectable; None where no number of runs
        would (the between-start part alone is too large: measure more starts per run)."""
        for n in range(max(2, self.runs), most + 1):
            more = Noise(self.cv, self.df + (n - self.runs), self.within, n)
            if more.detectable(starts, **kw) <= drop:
                return n
        return None


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
