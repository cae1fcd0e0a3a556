"""The config A/B of one profile, decided over server starts: each level compared as its floor judged it (the mean
of its starts, less an outlier); where the A/B is undecided and nothing failed, the least precise level of the
undecided claims is measured again after a restart of its config, while the profile allows, and the A/B judged
again."""

from __future__ import annotations

from dataclasses import dataclass

from ..categories import INVALID
from ..judge.ab import check_ab
from ..judge.starts import judged_start, starts_judged
from ..store.recorder import ABDoc
from .evidence import Evidence
from .outcome import Outcome
from .settle import settle
from ..records import level_name


@dataclass(frozen=True)
class AB:
    """The tuned config is not worse than the base config at any level, and gains where the base config's cap
    binds. `ev` is either config's evidence: the other is its sibling in the run."""

    def decide(self, ev: Evidence) -> Outcome:
        prof = ev.profile
        if prof.ab is None:
            return Outcome.skip(f"profile {prof.name} declares no [ab] pair")
        found = {name: ev if name == ev.name else ev.sibling(name) for name in (prof.ab.base, prof.ab.tuned)}
        runs = {name: r for name, r in found.items() if r is not None}
        levels = ev.ladder()
        res = {c: r.measured() for c, r in runs.items()}
        missing = [f"{c} {level_name(lv)}" for c in runs for lv in levels if lv not in res[c]]
        if missing or len(runs) < len(found):
            return Outcome.skip(f"A/B needs both configs measured in this session; missing: "
                                f"{', '.join(missing) or 'servers'}")
        wrong = [f for r in runs.values() if (f := r.canary_failure("A/B"))]
        if wrong:
            return Outcome.fail("\n".join(wrong))
        invalid = [f"{c} {level_name(lv)}" for c in res for lv, r in res[c].items() if not r.valid]
        if invalid:
            return Outcome.fail(f"{INVALID}: cannot judge the A/B, invalid levels: {', '.join(invalid)}")
        if any(r.ceiling is None for r in runs.values()):
            return Outcome.skip("A/B needs each config's ceiling from /server_info")
        noise = {c: runs[prof.ab.base].noise(c, levels) for c in runs}
        return self._over_starts(ev, prof, runs, noise)

    @staticmethod
    def _judge(ev, prof, runs, noise):
        """A level re-measured after restarts is compared as its floor judged it: the mean of its starts, less an
        outlier."""
        base, tuned = prof.ab.base, prof.ab.tuned
        starts = {c: {lv: r.starts_of(lv) for lv in r.measured()} for c, r in runs.items()}
        judged = {c: {lv: judged_start(s, noise[c].get(lv)) for lv, s in starts[c].items()} for c in runs}
        counts = {c: {lv: starts_judged(s, noise[c].get(lv)) for lv, s in starts[c].items()} for c in runs}
        return judged, check_ab(judged[base], judged[tuned], runs[base].ceiling, runs[tuned].ceiling,
                                margin=prof.measurement.ab_margin, base_noise=noise[base], tuned_noise=noise[tuned],
                                base_starts=counts[base], tuned_starts=counts[tuned],
                                judge_below_cap=prof.ab.below_cap == "judged")

    def _over_starts(self, ev, prof, runs, noise) -> Outcome:
        judged, v = self._judge(ev, prof, runs, noise)
        tried: set[tuple[str, int]] = set()
        shown: list[str] = []
        while v.unsure and not v.problems:
            wanted = [(c, lv) for c in runs for lv in v.undecided_levels]
            more = remeasure_least_precise(runs, judged, wanted, tried,
                                           f"the A/B was undecided ({'; '.join(v.unsure)[:300]})", shown)
            if more is not True:
                if more:
                    return Outcome.fail(more, shown)
                break
            judged, v = self._judge(ev, prof, runs, noise)
        ev.record_ab(ABDoc(base=prof.ab.base, tuned=prof.ab.tuned, passed=v.passed,
                                 gains={str(k): g for k, g in v.gains.items()}, lines=list(v.lines),
                                 problems=list(v.problems), outcome=v.outcome, unsure=list(v.unsure)))
        return settle([v], where=f"{prof.ab.tuned} vs {prof.ab.base}", against="A/B").showing(
            shown + list(v.lines + v.problems + v.unsure))


def remeasure_least_precise(runs: dict, judged: dict[str, dict], wanted, tried: set, why: str, shown: list):
    """One more server start of the least precise (config, level) of `wanted` not yet in `tried`, where the profile
    allows: True when one was measured, False when nothing is left to try, or the failure of the start measured
    (a plateau measures all its levels again on one start instead: ConfigRun.replicate_levels)."""
    rel = {(c, lv): (judged[c][lv].sustained_output_tps_ci95 or 0.0) / judged[c][lv].sustained_output_tps
           for c, lv in wanted if (c, lv) not in tried and judged[c].get(lv) and judged[c][lv].sustained_output_tps}
    while rel:
        c, lv = max(rel, key=lambda k: rel[k])
        more = runs[c].replicate(lv, f"{why}; {c} {level_name(lv)} is its least precise level "
                                     f"(±{rel.pop((c, lv)):.1%})")
        if more is None:
            tried.add((c, lv))
            continue
        shown.append(f"{runs[c].where} {level_name(lv)}: start {len(more)} read "
                     f"{more[-1].result.sustained_output_tps:,.1f} "
                     f"tok/s (re-measured after a server restart: {why[:120]})")
        return runs[c].level_failure(more[-1]) or True
    return False
