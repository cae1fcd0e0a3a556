"""A level over its server starts: which starts a claim keeps (undisturbed, no outlier), their judged value, the
same levels over all their starts with the between-start noise, and whether a floor needs one more start.
"""

from __future__ import annotations

import math
from dataclasses import replace
from scipy import stats
from ..store.baselines import Entry
from ..records import LevelResult, start_allowed
from .floor import FloorVerdict, combined, floor_of, outlier_start


def kept_starts(levels: list[LevelResult], noise=None) -> list[LevelResult]:
    """The starts a floor judges: the undisturbed ones (all, where every one was disturbed), less an outlier."""
    kept = [r for r in levels if not r.disturbances] or list(levels)
    aside, _ = outlier_start(kept, "sustained_output_tps", noise)
    return kept[:aside] + kept[aside + 1:] if aside is not None else kept


def first_kept(levels: list, noise=None):
    """The first of a level's server starts that its floor keeps (undisturbed, not set aside as another mode): what
    a calibration counts as one run's value, so that a start the floor would not judge is no baseline's noise."""
    return kept_starts(levels, noise)[0]


def starts_judged(levels: list[LevelResult], noise=None) -> int:
    """How many of a level's server starts `judged_start` averages."""
    return len(kept_starts(levels, noise))


def judged_start(levels: list[LevelResult], noise=None) -> LevelResult:
    """A level's sustained throughput over its server starts as the floor judged it (undisturbed starts where there
    are any, less an outlier start, their mean and interval), in the first start's record: what the A/B compares,
    so that it never decides on a start the floor set aside."""
    kept = kept_starts(levels, noise)
    if len(kept) == 1:
        return kept[0]
    value, ci = combined(kept, "sustained_output_tps", noise)
    return replace(kept[0], sustained_output_tps=value, sustained_output_tps_ci95=ci)


def over_starts(starts: dict[int, list[LevelResult]], noise: dict) -> dict[int, LevelResult] | None:
    """Each level over all its server starts, as the floor judged them, its interval widened by the baseline's
    between-start noise that a restart draws afresh (judge/noise.Noise.parts), over those starts: what a plateau
    compares when the levels of one start leave it undecided and no start measuring them together is allowed.
    Levels of different starts of one run differ by what a restart draws, so the comparison is honest only with
    that noise in it: None where the baseline calibrated none for a
    level (a plateau mixing starts without it read a healthy server +43% off flat), or where no level has a second
    start."""
    if not any(len(v) > 1 for v in starts.values()):
        return None
    out = {}
    for lv, levels in starts.items():
        n = noise.get(lv)
        if n is None:
            return None
        r = judged_start(levels, n)
        k, value = starts_judged(levels, n), r.sustained_output_tps
        if value is None or r.sustained_output_tps_ci95 is None:
            return None
        # the levels compared come from one run: what stays with the run is common to them, a restart's part is not
        between = float(stats.t.ppf(0.975, max(n.df, 1.0))) * math.sqrt(n.parts()[1]) * value / math.sqrt(k)
        out[lv] = replace(r, sustained_output_tps_ci95=math.hypot(r.sustained_output_tps_ci95, between))
    return out


def another_start(v: FloorVerdict, starts: int, entry: Entry, max_starts: int, *, disturbed: bool = False) -> bool:
    """Whether a floor needs one more server start, where the profile's `max_starts` allow it (the suite stops
    sooner when its budget is spent). Undecided: yes. A regression stands only over all the starts allowed: one
    start reads low often enough on a GPU. A pass before then must clear the floor for all the starts allowed, the
    highest: a drop that hides in one start's spread is caught by the mean of several, and a healthy level well
    above its floor still passes at once. The decision at
    the last start is the floor for that many starts (or check_floor's bound, `last`), so false regressions stay
    at that floor's rate."""
    if not start_allowed(starts, max_starts):
        return False
    if v.outcome == "inconclusive" or (v.outcome == "regression" and not disturbed):
        return True
    if v.outcome == "pass" and v.value is not None:
        return v.value - (v.ci95 or 0.0) < floor_of(entry, max_starts)[0]
    return disturbed and v.outcome not in ("pass", "not judged")
