"""The KV plateau: throughput past the predicted ceiling (the KV pool or the admission cap) stays flat, within
the profile's band, decided by the ratios' intervals, and the server's own numbers say which ceiling it is.
"""

from __future__ import annotations

from collections.abc import Iterable
import math
from dataclasses import dataclass
from scipy import stats
from ..categories import INCONCLUSIVE, PLATEAU
from ..records import Ceiling, LevelResult, level_name
from .floor import floor_outcome


# A plateau level's interval need be no wider than this share of the plateau band: two such levels' ratio is then
# known to about 0.47 x the band (the halves in quadrature), so any ratio in the band's inner 60% decides, and a
# healthy plateau (within a few % of flat) passes without the level running on to the profile's ci_target. A later
# plateau level also runs on until its ratio to the earlier ones decides (decides_plateau_level's `earlier`), so a
# ratio up to 72% of the band still decides as the later one narrows. A quarter kept a deep simulator level running
# half an hour for a ratio that was decided at a third (docs/measurement.md).
PLATEAU_SHARE = 1 / 3
# Where the baseline measured the plateau flat, the first level may stop wider, up to half the band: two levels at a
# share s decide (TOST) every ratio within B x (1 - TOST_SHARE x sqrt(2) x s) of 1, and plateau_share gives the
# widest s at which the baseline's own ratio still decides. Half the band at most: two such levels still decide any
# ratio within 41% of it, and a plateau that moved further since its baseline has its later level run on, then the
# profile's re-measure. sim-seed's plateaus read 0.989-0.990 in its baseline (docs/measurement.md).
PLATEAU_SHARE_MAX = 1 / 2


def plateau_share(band: float, baseline_means: Iterable[float]) -> float:
    """How wide a plateau level's interval may be (a share of the band) for the ratios the baseline measured among
    the levels the plateau compares (`baseline_means`, one config) to decide with both levels that wide: between
    PLATEAU_SHARE and PLATEAU_SHARE_MAX; PLATEAU_SHARE where the baseline has fewer than two of them."""
    means = [m for m in baseline_means if m and m > 0]
    if len(means) < 2 or band <= 0:
        return PLATEAU_SHARE
    lean = max(abs(a / b - 1) for a in means for b in means)
    widest = (1 - lean / band) / (TOST_SHARE * math.sqrt(2))
    return min(PLATEAU_SHARE_MAX, max(PLATEAU_SHARE, widest))


def compared_levels(levels, ceiling: Ceiling | None) -> list[int]:
    """The levels the plateau compares, defined here once: those past the ceiling where two or more lie past it,
    else those at or past it (with two beyond, the level exactly at the ceiling is left out: it may sit on the
    knee)."""
    if ceiling is None:
        return []
    past = sorted(lv for lv in levels if lv >= ceiling.effective)
    beyond = [lv for lv in past if lv > ceiling.effective]
    return beyond if len(beyond) >= 2 else past


def plateau_compares(level: int, ceiling: Ceiling | None, levels) -> bool:
    """Whether check_plateau compares `level` with its neighbours (compared_levels)."""
    return level in compared_levels(levels, ceiling)


def decides_plateau_level(floor: float, band: float, earlier: Iterable[LevelResult] = (),
                          share: float = PLATEAU_SHARE):
    """For a level the plateau compares: stop once its floor is decided and its interval is narrow enough for the
    plateau's ratios (`share` of the band), not only for the floor. A level measured after others the plateau
    compares, on the same server start (`earlier`), may stop sooner: once its ratio to each of them is decided with
    the intervals both have, as check_plateau will decide it (docs/measurement.md, the nightly's time to verdict)."""
    earlier = tuple(earlier)

    def decided(r: LevelResult) -> bool:
        v, half = r.sustained_output_tps, r.sustained_output_tps_ci95
        if not v or half is None or floor_outcome(v, half, floor) == "inconclusive":
            return False
        if half / v <= band * share:
            return True
        return bool(earlier) and all(
            e.sustained_output_tps and ratio_outcome(v / e.sustained_output_tps, math.hypot(_rel_ci(e), half / v),
                                                     band) != "unsure"
            for e in earlier)
    return decided


def ratio_outcome(ratio: float, noise: float, band: float) -> str:
    """A plateau ratio against its band, given the 95% relative half-width of the two levels combined: "pass" where
    its 90% interval (TOST_SHARE) lies inside, "violated" where its 95% interval lies wholly outside, else
    "unsure"."""
    if abs(ratio - 1) - noise > band:
        return "violated"
    return "unsure" if abs(ratio - 1) + noise * TOST_SHARE > band else "pass"


@dataclass(frozen=True)
class PlateauVerdict:
    passed: bool
    ceiling: Ceiling
    attributed_to: str | None  # "kv" | "cap" | None when the evidence does not say
    reference_level: int | None
    levels_past: tuple[int, ...]
    lines: tuple[str, ...]  # one per level: value, ratio to the reference, server evidence
    problems: tuple[str, ...]
    unsure: tuple[str, ...] = ()  # levels whose ratio's interval straddles the band's edge
    # what the host did to the levels of ratios that did not pass ("c128: disturbed: ..."): a disturbance moves one
    # level and not the other, so such a ratio decides nothing (a quarter of the CPU stolen read a level 30% low)
    disturbed: tuple[str, ...] = ()

    @property
    def outcome(self) -> str:
        """"pass" | "violated" | "inconclusive": decided by intervals, like a floor; a ratio the host disturbed
        leaves it undecided, never violated."""
        return "violated" if self.problems else "inconclusive" if self.unsure or self.disturbed else "pass"

    @property
    def message(self) -> str:
        each = self.ceiling.basis or f"{self.ceiling.tokens_per_request} tokens each"
        head = (f"KV ceiling {self.ceiling.kv} requests ({each}), admission "
                f"cap {self.ceiling.cap}, predicted plateau at {self.ceiling.effective} ({self.ceiling.binding}); "
                f"observed: {self.attributed_to or 'not attributable'}")
        body = "\n".join(self.lines)
        probs = ("\nPLATEAU VIOLATED: " + "; ".join(self.problems)) if self.problems else ""
        unsure = ("\nundecided: " + "; ".join(self.unsure)) if self.unsure else ""
        disturbed = ("\nnot judged, the host disturbed a level: " + "; ".join(self.disturbed)) if self.disturbed else ""
        return f"{head}\n{body}{probs}{unsure}{disturbed}"

    def failure(self, where: str) -> str:
        if self.outcome == "inconclusive":
            return f"{INCONCLUSIVE}: {where}: the plateau cannot be decided from this run's intervals: {self.message}"
        return f"{PLATEAU}: {where}: {self.message}"


def _seen_from(r: LevelResult) -> str:
    """What a server-side maximum was read from: a maximum over few scrapes, or with scrapes failing, may have
    missed the busy moments."""
    n = r.server_samples_in_window
    out = "" if n is None else f" (read from {n} scrape{'s' if n != 1 else ''} inside the window"
    if out and r.scrape_errors:
        out += f"; {r.scrape_errors} failed during the level, last: {r.scrape_last_error}"
    return out + ")" if out else ""


def _per_step(r: LevelResult) -> str:
    return " (busy slots per decode step)" if r.server_running_source == "per decode step" else ""


# A plateau passes when its ratio is shown inside the band: an equivalence test, two one-sided tests at 5% each
# (TOST), so the 90% interval must lie inside; it is violated only when the 95% interval lies wholly outside. The 95%
# interval inside the band left a healthy plateau a few % off flat undecided in most runs.
TOST_SHARE = float(stats.norm.ppf(0.95) / stats.norm.ppf(0.975))


def check_plateau(results: dict[int, LevelResult], ceiling: Ceiling, *, band: float,
                  near: float = 0.05) -> PlateauVerdict:
    """Past the effective ceiling, sustained throughput stays within `band` of the reference level; the server shows
    saturation (requests queued), running requests sit near the ceiling, and the plateau is attributed
    to the KV pool or the admission cap from the server's running count. A server whose mean running count sits at
    the ceiling is saturated even where its queue gauge reads empty (llama.cpp with its prompt cache on reads
    requests_deferred 0 with every slot busy).

    The levels judged are those past the ceiling when two or more are, else those at or past it: at exactly the
    ceiling nothing waits, so each freed slot idles for a client's round trip (a ratio against that level measures
    the round trip, not the plateau).

    Decided by intervals, like a floor: each ratio's 90% interval (both levels' CIs combined; TOST_SHARE) wholly
    inside the band passes, its 95% interval wholly outside violates, and one that straddles the band's edge is
    undecided (inconclusive, never a violation). The reference is the most precise level judged that the host left
    undisturbed, so one level the host disturbed does not make every ratio undecided. A ratio that does not pass
    while the host disturbed either of its levels is not judged: a disturbance lowers one level, not the other
    (`disturbed`; the suite measures them again on a fresh start, and names the disturbance where none is left).
    A level whose own interval is wider than the band cannot test the band at all (a CPU engine on a small host can
    change speed inside one level's window): where its ratio sits in the band's inner half it is
    set aside as consistent with the plateau and named, and the server's saturation and attribution still decide;
    leaning out of the band, or with a reference as imprecise, it stays undecided. Run-to-run CVs from a baseline do
    not widen it: the levels compared come from one server start, and what differs between starts moves all of them
    together, so it cancels in their ratio (unlike the A/B's; where one start cannot decide and levels of several
    starts are compared, over_starts puts that noise in)."""
    levels = sorted(results)
    past = [lv for lv in levels if lv >= ceiling.effective]
    lines: list[str] = []
    problems: list[str] = []
    unsure: list[str] = []
    if not past:
        return PlateauVerdict(False, ceiling, None, None, (), (),
                              (f"no level at or past the predicted ceiling {ceiling.effective} (levels {levels})",))
    beyond = [lv for lv in past if lv > ceiling.effective]
    judged = compared_levels(levels, ceiling)
    two_beyond = len(beyond) >= 2  # then the judged levels are those beyond
    calm = [lv for lv in judged if not results[lv].disturbances] or judged
    ref = min(calm, key=lambda lv: _rel_ci(results[lv])) if two_beyond else past[0]
    if two_beyond and past[0] not in beyond:
        at = results[past[0]].sustained_output_tps
        lines.append(f"  {level_name(past[0])}: sustained {_f(at, ',.1f')} tok/s, exactly at the ceiling: not "
                     f"judged (a closed "
                     f"loop with no queue leaves each slot idle for a client's round trip; the plateau starts where "
                     f"requests wait)")
    ref_v = results[ref].sustained_output_tps
    attributed = None
    set_aside: list[str] = []
    disturbed: dict[int, str] = {}
    for lv in judged:
        r = results[lv]
        v = r.sustained_output_tps
        ratio = (v / ref_v) if v and ref_v else None
        lines.append(f"  {level_name(lv)}: sustained {v if v is None else format(v, ',.1f')} tok/s"
                     f"{'' if ratio is None else f' ({ratio:.3f} x {level_name(ref)})'}, server running "
                     f"mean {_f(r.server_mean_running)} max {_f(r.server_max_running)}{_per_step(r)}, "
                     f"queued {_f(r.server_mean_queued)}, token usage {_f(r.server_mean_token_usage, '.2f')}")
        if ratio is None:
            problems.append(f"{level_name(lv)}: no sustained throughput")
        elif lv != ref:
            _judge_ratio(lv, ref, ratio, results, band, lines, problems, unsure, set_aside, disturbed)
        if lv > ceiling.effective:
            attributed = _saturation(lv, r, ceiling, near, problems) or attributed
    if attributed is None and any(results[lv].server_max_running is not None for lv in past):
        problems.append("the server's running count matches neither the KV ceiling nor the admission cap")
    elif attributed is not None and attributed != ceiling.binding:
        problems.append(f"plateau attributed to the {attributed} from the server's running count, but the "
                        f"prediction says {ceiling.binding}")
    if all(results[lv].server_max_running is None for lv in past):
        lines.append("  (the server exposes no running-request count: attribution needs /metrics or /v1/loads)")
    if set_aside and _rel_ci(results[ref]) > band:  # nothing precise to set them against
        unsure += [a.replace("set aside", f"but so is the reference {level_name(ref)}'s") for a in set_aside]
    else:
        lines += [f"  {a}" for a in set_aside]
    named = tuple(f"{level_name(lv)}: {d}" for lv, ds in sorted(disturbed.items()) for d in ds)
    return PlateauVerdict(not problems and not unsure and not named, ceiling, attributed, ref, tuple(past),
                          tuple(lines), tuple(problems), tuple(unsure), named)


def _judge_ratio(lv, ref, ratio, results, band, lines, problems, unsure, set_aside, disturbed) -> None:
    """One level's ratio to the reference, by its interval, into the verdict's lists."""
    r = results[lv]
    noise = math.hypot(_rel_ci(results[ref]), _rel_ci(r))
    inside = noise * TOST_SHARE  # the 90% interval: two one-sided 5% tests, one per edge of the band
    outcome = ratio_outcome(ratio, noise, band)
    hit = {x: results[x].disturbances for x in (ref, lv) if results[x].disturbances}
    wide = outcome == "unsure" and _rel_ci(r) > band and abs(ratio - 1) <= band / 2
    if outcome != "pass" and hit and not wide:
        lines.append(f"  {level_name(lv)}: {ratio - 1:+.1%} ± {noise:.1%} vs {level_name(ref)}: not judged, the "
                     f"host disturbed {', '.join(map(level_name, sorted(hit)))}")
        disturbed.update(hit)
    elif outcome == "violated":
        problems.append(f"{level_name(lv)}: {ratio - 1:+.1%} ± {noise:.1%} vs {level_name(ref)}, outside the "
                        f"plateau band ±{band:.0%}")
    elif wide:
        set_aside.append(f"{level_name(lv)}: {ratio - 1:+.1%} ± {noise:.1%} vs {level_name(ref)}: its own "
                         f"interval (±{_rel_ci(r):.1%}) is "
                         f"wider than the band, so it cannot test it; consistent with the plateau, set aside")
    elif outcome == "unsure":
        unsure.append(f"{level_name(lv)}: {ratio - 1:+.1%} ± {inside:.1%} (90%) vs {level_name(ref)} straddles "
                      f"the plateau band's edge ±{band:.0%}: re-run, or give the levels more time")


# SGLang admits requests against an estimate of the tokens its running ones will still need, and retracts some when
# the pool fills, so a KV-bound server's running count swings about the pool's ceiling instead of sitting at it: its
# mean a little under, its peaks over (docs/measurement.md, "The KV plateau of a real SGLang"). An admission cap is a
# hard limit: the maximum sits at it.
KV_SWING = 0.20


def _saturation(lv, r: LevelResult, ceiling: Ceiling, near: float, problems: list[str]) -> str | None:
    """A level past the ceiling: the server must show saturation and run near the ceiling; which ceiling its running
    count sits at ("cap" or "kv"), where it says one and not the other. The cap is read from the maximum running
    count (within `near`); the KV pool from the mean (within KV_SWING), with the maximum reaching it."""
    full = (r.server_mean_running is not None
            and r.server_mean_running >= (1 - near) * ceiling.effective - 1)  # busy at the ceiling throughout
    if (r.server_mean_queued is not None and r.server_mean_queued <= 0
            and (r.server_mean_token_usage or 0) < 0.9 and not full):
        problems.append(f"{level_name(lv)}: past the ceiling but the server shows no saturation (nothing queued)")
    run, mean = r.server_max_running, r.server_mean_running
    if run is None:
        return None
    at_cap = ceiling.cap is not None and abs(run - ceiling.cap) <= near * ceiling.cap + 1
    at_kv = (run >= (1 - near) * ceiling.kv - 1
             and abs((run if mean is None else mean) - ceiling.kv) <= KV_SWING * ceiling.kv + 1)
    if ceiling.binding == "cap" and not at_cap:
        problems.append(f"{level_name(lv)}: server ran up to {run:.0f} requests, not near the predicted ceiling "
                        f"{ceiling.effective} (the admission cap)" + _seen_from(r))
    elif ceiling.binding == "kv" and not at_kv:
        problems.append(f"{level_name(lv)}: server ran up to {run:.0f} requests (mean {_f(mean)}), not near the "
                        f"predicted "
                        f"ceiling {ceiling.effective} (the KV pool: a mean within ±{KV_SWING:.0%} of it, the maximum "
                        f"reaching it)" + _seen_from(r))
    return "cap" if at_cap and not at_kv else "kv" if at_kv and not at_cap else None


def _rel_ci(r: LevelResult) -> float:
    """A level's 95% half-width relative to its rate (infinite where it has none)."""
    v, ci = r.sustained_output_tps, r.sustained_output_tps_ci95
    return ci / v if v and ci is not None else math.inf


def _f(x, spec=".1f") -> str:
    return "n/a" if x is None else format(x, spec)
