"""Verdicts become one Outcome, the same way for every claim: the disturbance, steal and slow-host policy.

A disturbed measurement that did not pass is INVALID naming the disturbance (a busy host can only lower what it
measured: never a regression), unless the drop lies further below its floor than what the host took explains
(judge/disturbance.py); else regressions (and violations, disagreements) fail with their own words, and what is left
undecided fails INCONCLUSIVE, saying what was re-measured or why not."""

from __future__ import annotations

from ..categories import INVALID, Category
from ..judge.disturbance import STEAL_COST, beyond_host, beyond_steal
from .outcome import Outcome


def settle(verdicts, *, where: str, against: str, disturbed=(), set_aside=(), log_path: str | None = None,
           note: str = "") -> Outcome:
    """All passed (or not judged) passes. `disturbed`: what the host did to the measurement judged. `set_aside`: the
    disturbances of the starts the verdicts did not count; where those starts were all that more time could have
    decided on, the level is INVALID naming them: the host, not the level's length, left it undecided."""
    verdicts = list(verdicts)
    failing = [v for v in verdicts if v.outcome not in ("pass", "not judged")]
    if not failing:
        return Outcome.passed()
    tail = f"\nServer log: {log_path}" if log_path else ""
    if disturbed:
        return Outcome.fail(f"{INVALID}: {where} cannot be judged against its {against}: " + "; ".join(disturbed)
                            + ". Measured: " + "; ".join(_detail(v.failure(where)) for v in failing) + tail)
    decided = [v for v in failing if v.outcome != "inconclusive"]
    if set_aside and not decided:
        return Outcome.fail(f"{INVALID}: {where} cannot be judged against its {against}: the host disturbed the "
                            f"server starts not counted ({'; '.join(set_aside)}), and those it left undisturbed did "
                            f"not decide. Measured on those: " + "; ".join(_detail(v.failure(where)) for v in failing)
                            + (f" ({note})" if note else "") + tail)
    undecided = "" if decided or not note else f"\n({note})"
    return Outcome.fail("\n".join(v.failure(where) for v in (decided or failing)) + undecided + tail)


def settle_over_starts(verdicts, starts, *, where: str, against: str, note: str = "", slow_host=None) -> Outcome:
    """`settle` for verdicts over a level's server starts (its results, in order): the undisturbed starts decide
    where there are any, and the disturbances of the others are named (`set_aside`); where every start was
    disturbed, the level is INVALID. `slow_host` (host_speed.SlowerHost): the host's CPU probed slower than on the
    baseline's runs over this run's levels; a verdict that did not pass is INVALID naming it, unless it lies
    further below its floor than the slower CPU explains (disturbance.beyond_host)."""
    kept = [r for r in starts if not r.disturbances]
    failing = [v for v in verdicts if v.outcome not in ("pass", "not judged")]
    if failing and slow_host is not None:
        if all(not beyond_host(v, slow_host.share) for v in failing):
            return settle(verdicts, where=where, against=against, note=note,
                          disturbed=[slow_host.words()] + [d for r in starts for d in r.disturbances])
        return Outcome.fail("\n".join(v.failure(where) for v in failing if beyond_host(v, slow_host.share))
                            + f"\n({slow_host.words()}; this drop is more than that)")
    shares = [x for v in failing if (x := beyond_steal(v, starts)) is not None]
    if failing and not kept and len(shares) == len(failing):
        return Outcome.fail("\n".join(v.failure(where) for v in failing)
                            + f"\n(every start was disturbed, and steal alone disturbed them: the hypervisor took at "
                              f"most {max(shares):.0%} of the CPU the work wanted, which explains a drop of at most "
                              f"{STEAL_COST:g} x that below the floor, not this one)")
    return settle(verdicts, where=where, against=against, note=note,
                  disturbed=() if kept else [d for r in starts for d in r.disturbances],
                  set_aside=[f"start {i + 1}: {'; '.join(r.disturbances)}" for i, r in enumerate(starts)
                             if kept and r.disturbances])


def _detail(text: str) -> str:
    """A failure's words without its category prefix (an INVALID quotes what it measured, in one category)."""
    for c in Category:
        if text.startswith(c.prefix):
            text = text[len(c.prefix):]
            return text.removeprefix(" (A/B)").removeprefix(": ")
    return text
