"""The config A/B: the tuned config is not worse than the base config at any level, and gains where the base
config's cap binds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from scipy import stats
from ..categories import INCONCLUSIVE, REGRESSION
from ..records import Ceiling, LevelResult, level_name


@dataclass(frozen=True)
class ABVerdict:
    passed: bool
    lines: tuple[str, ...]
    problems: tuple[str, ...]
    gains: dict[int, float]
    unsure: tuple[str, ...] = ()  # levels whose difference's interval straddles what the A/B asks
    undecided_levels: tuple[int, ...] = ()  # the levels those claims rest on (a pooled claim: all its levels)

    @property
    def outcome(self) -> str:
        return "regression" if self.problems else "inconclusive" if self.unsure else "pass"

    def failure(self, where: str) -> str:
        if self.outcome == "inconclusive":
            return (f"{INCONCLUSIVE} (A/B): {where}: this run's intervals cannot decide:\n" + "\n".join(self.lines)
                    + "\n" + "; ".join(self.unsure))
        return f"{REGRESSION} (A/B): {where}:\n" + "\n".join(self.lines) + "\n" + "; ".join(self.problems)


def _between(noise, starts: int) -> float:
    """The between-start SD of a mean over `starts` starts on one host: the host's part stays, the rest averages."""
    if noise is None:
        return 0.0
    host = min(noise.host, noise.between)
    return math.sqrt(host ** 2 + (noise.between ** 2 - host ** 2) / max(starts, 1))


def _ab_noise(b: LevelResult, t: LevelResult, bn, tn, kb: int = 1, kt: int = 1) -> tuple[float, float]:
    """(within-run, between-start) relative SDs of log(tuned / base) at one level: the two levels' own intervals,
    and the two servers' start-to-start noise where a baseline measured it (judge/noise.py), for the `kb` and `kt`
    starts each level's value is the mean of."""
    bv, tv = b.sustained_output_tps, t.sustained_output_tps
    assert bv and tv, "the A/B compares measured levels only"
    within = math.hypot((b.sustained_output_tps_ci95 or 0) / bv, (t.sustained_output_tps_ci95 or 0) / tv) / 1.96
    return within, math.hypot(_between(bn, kb), _between(tn, kt))


def check_ab(base: dict[int, LevelResult], tuned: dict[int, LevelResult], base_ceiling: Ceiling,
             tuned_ceiling: Ceiling, *, margin: float, base_noise: dict | None = None,
             tuned_noise: dict | None = None, confidence: float = 0.95, base_starts: dict | None = None,
             tuned_starts: dict | None = None, judge_below_cap: bool = True) -> ABVerdict:
    """Where no gain is expected, the tuned config is not worse than the base by more than `margin`: a
    non-inferiority test (one-sided, `confidence`) on log(tuned / base) whose noise is both levels' own intervals
    and, where a baseline calibrated it, the two servers' between-start noise (two servers started one after the
    other differ by more than one level's interval says). Upper bound below -margin: a regression; lower bound
    above it: passes; else undecided.

    Where the tuned config's ceiling is higher, it gains past the base's ceiling: one claim, decided over those
    levels together (their mean gain; the within-run parts averaged as independent, the between-start parts fully
    correlated: one start moves all its levels alike). A level whose own upper bound is at or below zero is a
    problem too. `base_starts`/`tuned_starts`: level -> how many server starts its value is the mean of (one where
    missing); the between-start part shrinks with them as the floor's does. `judge_below_cap` False (a profile's
    [ab] below_cap = "shown"): levels where no gain is expected are shown, not judged, and the gain is the only
    claim; with no level past the base's ceiling there is nothing to judge, and that is undecided, never a pass."""
    z = float(stats.norm.ppf(confidence))
    lines, problems, gains, unsure, undecided = [], [], {}, [], []
    pooled: list[tuple[float, float, float, int]] = []
    base_noise, tuned_noise = base_noise or {}, tuned_noise or {}
    base_starts, tuned_starts = base_starts or {}, tuned_starts or {}
    for lv in sorted(set(base) & set(tuned)):
        b, t = base[lv], tuned[lv]
        if not b.sustained_output_tps or not t.sustained_output_tps:
            problems.append(f"{level_name(lv)}: missing sustained throughput")
            continue
        gain = math.log(t.sustained_output_tps / b.sustained_output_tps)
        within, between = _ab_noise(b, t, base_noise.get(lv), tuned_noise.get(lv), base_starts.get(lv, 1),
                                    tuned_starts.get(lv, 1))
        sd = math.hypot(within, between)
        gains[lv] = math.expm1(gain)
        expect_gain = lv > base_ceiling.effective and tuned_ceiling.effective > base_ceiling.effective
        lo, hi = math.expm1(gain - z * sd), math.expm1(gain + z * sd)
        calibrated = base_noise.get(lv) is not None or tuned_noise.get(lv) is not None
        shown = not expect_gain and not judge_below_cap
        tag = (" [tuned cap binds later: gain expected]" if expect_gain else
               " [below the base's ceiling: shown, not judged ([ab] below_cap = \"shown\")]" if shown else "")
        lines.append(f"  {level_name(lv)}: base {b.sustained_output_tps:,.1f} tuned {t.sustained_output_tps:,.1f} "
                     f"({math.expm1(gain):+.1%}, {confidence:.0%} one-sided bounds {lo:+.1%} .. {hi:+.1%}; "
                     + (f"between starts ±{between:.1%})" if calibrated else
                        "between starts: no baseline noise for this host)") + tag)
        if shown:
            continue
        if hi < -margin:
            problems.append(f"{level_name(lv)}: tuned is {math.expm1(gain):+.1%} vs base (at most {hi:+.1%}), "
                            f"worse than the {margin:.0%} allowed")
        elif not expect_gain and lo < -margin:
            unsure.append(f"{level_name(lv)}: tuned is {math.expm1(gain):+.1%} vs base (down to {lo:+.1%}): "
                          f"cannot tell whether it is within the {margin:.0%} allowed")
            undecided.append(lv)
        if expect_gain and hi <= 0:
            problems.append(f"{level_name(lv)}: expected a gain (base plateaus at {base_ceiling.effective}, tuned at "
                            f"{tuned_ceiling.effective}) but got {math.expm1(gain):+.1%} (at most {hi:+.1%})")
        elif expect_gain:
            pooled.append((gain, within, between, lv))
    if pooled:
        k = len(pooled)
        mean = sum(g for g, _, _, _ in pooled) / k
        sd = math.hypot(math.sqrt(sum(w * w for _, w, _, _ in pooled)) / k, sum(r for _, _, r, _ in pooled) / k)
        where = f"{level_name(min(lv for lv in gains if lv > base_ceiling.effective))}+"
        lo, hi = math.expm1(mean - z * sd), math.expm1(mean + z * sd)
        lines.append(f"  expected gain past the base's ceiling ({where}, {k} level{'s' if k > 1 else ''}): "
                     f"{math.expm1(mean):+.1%} ({lo:+.1%} .. {hi:+.1%})")
        if hi <= 0:
            problems.append(f"{where}: expected a gain (base plateaus at {base_ceiling.effective}, tuned at "
                            f"{tuned_ceiling.effective}) but got {math.expm1(mean):+.1%} (at most {hi:+.1%}) over "
                            f"{k} levels")
        elif lo <= 0:
            unsure.append(f"{where}: a gain is expected (base plateaus at {base_ceiling.effective}, tuned at "
                          f"{tuned_ceiling.effective}); {math.expm1(mean):+.1%} ({lo:+.1%} .. {hi:+.1%}) over {k} "
                          f"levels does not decide it")
            undecided += [lv for _, _, _, lv in pooled]
    elif not judge_below_cap and not problems:
        unsure.append(f"only the gain past the base's ceiling {base_ceiling.effective} is judged, and no level "
                      f"measured gains past it (levels {sorted(set(base) & set(tuned))}; tuned ceiling "
                      f"{tuned_ceiling.effective})")
    return ABVerdict(not problems and not unsure, tuple(lines), tuple(problems), gains, tuple(unsure),
                     tuple(sorted(set(undecided))))
