"""The KV plateau of one config, decided over server starts: the levels at or past the predicted ceiling, compared
within one start (what differs between starts moves a start's levels together and cancels in their ratios); where
that leaves it undecided, all the compared levels are measured again on a fresh start while the profile allows, and
once no start is left, over all the starts each was measured on with the baseline's between-start noise."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..categories import INFRA, INVALID
from ..judge.plateau import check_plateau, compared_levels
from ..store.recorder import PlateauDoc
from .evidence import Evidence
from .outcome import Outcome
from .settle import settle
from ..records import Rate, level_name


@dataclass(frozen=True)
class Plateau:
    """Throughput plateaus where the KV pool (or the admission cap) is full, as predicted from /server_info, and
    the server's own numbers say which of the two it is. `levels`: the run's ladder."""

    levels: tuple[int, ...]

    def decide(self, ev: Evidence) -> Outcome:
        if any(isinstance(lv, Rate) for lv in self.levels):
            return Outcome.skip(f"{ev.where}: an open-loop ladder (offered rates) puts no number of requests past the "
                                f"ceiling: its plateau is judged on a concurrency ladder")
        if ev.ceiling is None:
            return Outcome.skip(f"{ev.where}: the server's /server_info gives no max_total_num_tokens to predict a "
                                f"ceiling from")
        past = [lv for lv in self.levels if lv >= ev.ceiling.effective]
        if len(past) < 2:
            return Outcome.skip(f"{ev.where}: predicted plateau at {ev.ceiling.effective} ({ev.ceiling.binding}); "
                                f"needs two levels at or past it, the levels are {list(self.levels)}")
        results = {}
        for lv in past:
            r = ev.measure(lv).result
            if r.incomplete:
                return Outcome.fail(f"{INFRA}: {ev.where} {level_name(lv)}: {r.note}")
            if wrong := ev.canary_failure("plateau"):
                return Outcome.fail(wrong)
            if not r.valid:
                return Outcome.fail(f"{INVALID}: cannot judge the plateau: {level_name(lv)} is invalid: "
                                    f"{'; '.join(r.invalid_reasons)}")
            results[lv] = r
        return self._over_starts(ev, past, results)

    def _over_starts(self, ev, past, results) -> Outcome:
        band = ev.profile.measurement.plateau_band
        v, shown = check_plateau(results, ev.ceiling, band=band), list[str]()
        compared = compared_levels(past, ev.ceiling)
        # a violation must show on two starts (the plateau is physics and repeats; a drifting host does not): one
        # seen on a start with none left to repeat it is undecided, never declared
        seen = [ev.starts] if v.outcome == "violated" else []  # the starts whose levels read a violation
        confirm = bool(seen)
        while v.outcome == "inconclusive" or confirm:
            why = "; ".join(v.unsure + v.disturbed + v.problems)
            fresh = ev.replicate_levels(compared, f"the plateau was {'violated' if confirm else 'undecided'} on one "
                                                  f"start ({why[:300]})")
            if fresh is None:  # no start left: all the starts each level was measured on, with the noise
                over = self._over_all_starts(ev, results, compared, band, v, shown)
                if confirm and over is not v and over.outcome != "violated":
                    over = replace(over, unsure=(*over.unsure, _drifted(v, seen[-1], "its levels over all starts")))
                v = _one_start_only(over, v, seen[-1]) if confirm and over.outcome == "violated" else over
                break
            for m in fresh.values():
                failure = ev.level_failure(m)
                if failure:
                    return Outcome.fail(failure, shown)
            results = {lv: m.result for lv, m in fresh.items()}
            shown.append(f"{ev.where}: the plateau's levels {', '.join(map(level_name, compared))} measured again on "
                         f"server start {ev.starts} (the one before: {why[:200]})")
            before, v = v, check_plateau(results, ev.ceiling, band=band)
            seen += [ev.starts] if v.outcome == "violated" else []
            if confirm and v.outcome != "violated":
                v = replace(v, unsure=(*v.unsure, _drifted(before, seen[-1], f"start {ev.starts}")))
            confirm = v.outcome == "violated" and len(seen) < 2
        ev.record_plateau(PlateauDoc(
            passed=v.passed, attributed_to=v.attributed_to, reference_level=v.reference_level,
            levels=list(v.levels_past), lines=list(v.lines), problems=list(v.problems),
            ceiling=ev.ceiling.__dict__, outcome=v.outcome, unsure=list(v.unsure), disturbed=list(v.disturbed)))
        # a ratio the host disturbed that no fresh start could decide: INVALID naming what the host did, never a
        # violation
        return settle([v], where=ev.where, against="plateau", log_path=ev.log_path,
                      disturbed=v.disturbed if not v.problems and not v.unsure else ()).showing(shown + [v.message])

    @staticmethod
    def _over_all_starts(ev, results, compared, band, v, shown):
        """No start measuring the compared levels together is allowed: decide over all the starts each was measured
        on, the baseline's between-start noise in their intervals (judge/starts.over_starts): the floors'
        re-measures may have spent the run's starts on some of these levels."""
        over = ev.over_starts(compared)
        if over is None:
            return v
        again = check_plateau({**results, **over}, ev.ceiling, band=band)
        what = "violated" if v.problems else "undecided"
        note = (f"  {what} on one start ({'; '.join(v.problems + v.unsure + v.disturbed)[:200]}); judged over all "
                f"starts of "
                + ", ".join(f"{level_name(lv)} ({len(ev.level_starts(lv))})" for lv in compared)
                + ", with the baseline's between-start noise")
        shown.append(f"{ev.where}: the plateau{note[1:]}")
        return replace(again, lines=(*again.lines, note))


def _drifted(before, seen: int, again: str) -> str:
    """Words for a violation one start showed and `again` did not: the plateau is physics and repeats; what moved
    between levels measured minutes apart on one start and not on the next is the host."""
    return (f"start {seen} read {'; '.join(before.problems)[:200]}, {again} does not: a violation that does "
            f"not repeat is the host drifting between levels, not the plateau (re-run)")


def _one_start_only(v, seen, start: int):
    """A violation seen on start `start` only, with no fresh start left to repeat it: undecided, saying so. A level
    can swing between regimes inside one start and read a healthy ceiling far off flat (docs/gpu-proof.md)."""
    return replace(v, passed=False, problems=(), unsure=(
        *v.unsure, *seen.problems,
        f"that violation showed on server start {start} only, and no start was left to repeat it: a violation is "
        f"declared once two starts show it (a larger max_starts or start_budget_s would repeat it)"))
