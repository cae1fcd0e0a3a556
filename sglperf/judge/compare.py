"""Two runs compared level by level: run B's sustained throughput against run A's, the change with its 95% interval,
and a verdict in the suite's words. Pure functions over LevelResults; the command is cli/compare.py.

The interval holds each run's own within-run noise (its level's interval over its starts, judge/floor.combined) and,
where a calibrated baseline of the same stack is at hand, the between-start noise two runs draw apart (judge/noise:
what stays with a run, and what each start draws afresh). Without one, the between-start part is unknown and the
line says so: then only the margin guards against a start-to-start difference read as a change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from scipy import stats

from ..records import LevelResult
from .floor import combined
from .noise import Noise

SLOWER, FASTER, NO_CHANGE, UNDECIDED, NOT_COMPARABLE = "SLOWER", "FASTER", "NO CHANGE", "UNDECIDED", "NOT COMPARABLE"

# A change smaller than this is "no change" when its whole interval lies inside ±MARGIN. Peers gate GPU performance
# at 10% (SGLang's nightly) and 20% (vLLM's dashboard); half the tighter gate keeps a 10% drop outside the band with
# room for its interval, and keeps a real but immaterial 1-2% shift between healthy runs from being called slower.
MARGIN = 0.05


@dataclass(frozen=True)
class Side:
    """One run's value of a level: its mean over the valid starts and its 95% half-width."""

    value: float | None
    ci95: float | None
    starts: int
    invalid: tuple[str, ...] = ()  # why no valid start is left (each invalid start's first reason)


@dataclass(frozen=True)
class LevelChange:
    config: str
    level: str  # as messages name it: c32, r8
    a: Side
    b: Side
    verdict: str
    change: float | None = None  # B / A - 1
    low: float | None = None  # its 95% interval
    high: float | None = None
    why: str = ""
    between_known: bool = False

    def to_dict(self) -> dict:
        return {"config": self.config, "level": self.level, "verdict": self.verdict, "change": self.change,
                "change_low": self.low, "change_high": self.high, "why": self.why,
                "between_start_noise": self.between_known,
                **{name: {"value": s.value, "ci95": s.ci95, "starts": s.starts, "invalid": list(s.invalid)}
                   for name, s in (("a", self.a), ("b", self.b))}}


@dataclass
class Comparison:
    run_a: str
    run_b: str
    levels: list[LevelChange] = field(default_factory=list)
    not_comparable: str = ""  # the whole runs: another hardware class or workload
    changed: dict[str, str] = field(default_factory=dict)  # config -> what changed between the runs
    margin: float = MARGIN

    @property
    def slower(self) -> list[LevelChange]:
        return [c for c in self.levels if c.verdict == SLOWER]


def side(starts: list[LevelResult], metric: str, noise: Noise | None) -> Side:
    """A level's value over its valid starts (the floor's own mean and interval); invalid starts never count."""
    valid = [r for r in starts if r.valid and getattr(r, metric) is not None]
    if not valid:
        return Side(None, None, 0, tuple((r.invalid_reasons or ["no value"])[0] for r in starts))
    value, ci = combined(valid, metric, noise)
    return Side(value, ci, len(valid))


def between_var(noise: Noise | None, starts: int) -> float | None:
    """Relative variance of one run's mean of `starts` starts around the stack's own speed: what stays with a run
    whatever its restarts, and what each start draws afresh, over the starts."""
    if noise is None:
        return None
    stays, fresh = noise.parts()
    return stays + fresh / max(starts, 1)


def verdict(change: float, low: float, high: float, margin: float) -> str:
    """SLOWER: the whole interval below zero and reaching past the margin; FASTER the same above; NO CHANGE: the
    whole interval inside ±margin; UNDECIDED otherwise (the interval straddles zero or the margin: more starts
    would decide it)."""
    if high < 0 and low < -margin:
        return SLOWER
    if low > 0 and high > margin:
        return FASTER
    if -margin <= low and high <= margin:
        return NO_CHANGE
    return UNDECIDED


def change(config: str, level: str, a: Side, b: Side, noise: Noise | None, margin: float = MARGIN) -> LevelChange:
    """B's level against A's: B / A - 1, its interval by the delta method on the log ratio (each side's relative
    error, within-run and between starts, in quadrature), t(0.975) on the noise's degrees of freedom."""
    for name, s in (("A", a), ("B", b)):
        if s.value is None:
            why = f"run {name} has no valid start at {level}: " + "; ".join(s.invalid or ("not measured",))
            return LevelChange(config, level, a, b, NOT_COMPARABLE, why=why)
    va, vb = a.value or 0.0, b.value or 0.0
    if va <= 0 or vb <= 0:
        return LevelChange(config, level, a, b, NOT_COMPARABLE, why="a value of zero has no ratio")
    var = ((a.ci95 or 0.0) / 1.96 / va) ** 2 + ((b.ci95 or 0.0) / 1.96 / vb) ** 2
    between = [between_var(noise, s.starts) for s in (a, b)]
    known = None not in between
    if known:
        var += sum(x for x in between if x is not None)
    t = float(stats.t.ppf(0.975, max(noise.df, 1.0))) if known and noise is not None else 1.96
    ratio = math.log(vb / va)
    half = t * math.sqrt(var)
    chg, low, high = math.expm1(ratio), math.expm1(ratio - half), math.expm1(ratio + half)
    v = verdict(chg, low, high, margin)
    why = {SLOWER: "all of the interval below zero, past the margin",
           FASTER: "all of the interval above zero, past the margin",
           NO_CHANGE: f"all of the interval inside ±{margin:.0%}",
           UNDECIDED: f"the interval straddles {'zero' if low < 0 < high else 'the margin'}: more starts would "
                      "decide"}[v]
    if not known:
        why += "; within-run noise only (no calibrated between-start noise for this stack)"
    return LevelChange(config, level, a, b, v, chg, low, high, why, known)


def line(c: LevelChange) -> str:
    """One level of the comparison as a person reads it."""
    def fmt(s: Side) -> str:
        if s.value is None:
            return "invalid"
        return f"{s.value:,.1f} ± {(s.ci95 or 0.0) / s.value:.1%} ({s.starts} start{'s' if s.starts != 1 else ''})"

    head = f"{c.config} {c.level}: A {fmt(c.a)}, B {fmt(c.b)}"
    if c.change is None:
        return f"{head}: {c.verdict}: {c.why}"
    return (f"{head}: {c.change:+.1%} (95%: {c.low:+.1%} .. {c.high:+.1%}): {c.verdict}: {c.why}")
