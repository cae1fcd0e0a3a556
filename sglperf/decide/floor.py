"""The floor and the latency ceilings of one level, decided over its server starts: undecided after the level's own
time, failed, passed too near its floor for one start to say, or failed while the host disturbed it, a level is
measured again after a server restart while the profile's starts and the run's budget allow (judge/starts.
another_start); a slow start or a disturbance passes, a regression stays. The latency ceilings go by the majority of
the starts (judge/latency.over_starts)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..categories import ACCEPTANCE, REGRESSION
from ..environment import fingerprint
from ..judge.floor import check_floor, faster
from ..judge.latency import check_ceiling, over_starts, verdict_over_starts
from ..judge.starts import another_start
from .evidence import Evidence
from .outcome import Outcome
from .settle import settle, settle_over_starts
from ..records import level_name


def no_baseline(ev, path) -> str:
    return (f"no baseline for {ev.profile.name} on hardware class {ev.hardware_class!r} ({path}): run `pytest "
            f"perf_tests --profile {ev.profile.name} --update-baselines`, review the candidate it writes beside that "
            f"path, and commit it")


def _env_diff(ev, e) -> str:
    return fingerprint.describe_diff(e.fingerprint, ev.fingerprint) if e.fingerprint else ""


def other_pin(entries, fingerprint: dict) -> str | None:
    """Why a baseline taken with one speculative acceptance pin cannot judge a run with another (or none)."""
    now = fingerprint.get("spec_accept_pin")
    then = {e.fingerprint.get("spec_accept_pin") for e in entries if e.fingerprint}
    if not then or then == {now}:
        return None
    was = ", ".join("none" if x is None else f"{x:g}" for x in sorted(then, key=lambda x: x or 0))
    return (f"the baseline was taken with the acceptance pinned at {was}, this run at "
            f"{'none' if now is None else f'{now:g}'} (SGLANG_SIMULATE_ACC_LEN): not the same measurement")


OWN_CLAIM = ("prefix_cache_share",)  # gated metrics another claim judges (decide/prefix.py)


def other_workload(entries, fingerprint: dict) -> str | None:
    """Why a baseline taken under one workload cannot judge a run under another (a baseline that recorded none is
    taken as the profile's own)."""
    now = fingerprint.get("workload")
    then = {e.fingerprint.get("workload") for e in entries if e.fingerprint} - {None}
    if not then or now is None or then == {now}:
        return None
    return f"the baseline was taken under the workload {', '.join(sorted(then))}, this run under {now}"


def _clean(starts):
    """The starts nothing disturbed decide, where there are any."""
    return [x for x in starts if not x.result.disturbances] or starts


@dataclass(frozen=True)
class Floor:
    """The level's sustained throughput at or above its baseline's floor on this hardware class."""

    level: int

    def decide(self, ev: Evidence) -> Outcome:
        level, starts = self.level, ev.level_starts(self.level)
        bf, path = ev.baseline()
        failure = ev.level_failure(starts[0])
        if failure:
            return Outcome.fail(failure)
        if bf is None:
            return Outcome.skip(no_baseline(ev, path))
        entries = {k: e for k, e in bf.entries(ev.name, level).items() if not e.is_latency and k not in OWN_CLAIM}
        if not entries:
            return Outcome.skip(f"{path} has no throughput entry for {ev.name} {level_name(level)}")
        outside = (ev.host_outside(bf) or other_pin(entries.values(), ev.fingerprint)
                   or other_workload(entries.values(), ev.fingerprint))
        if outside:  # measured and shown, neither passed nor failed: the baseline never measured this machine
            return Outcome.skip(f"{ev.where} {level_name(level)}: floor not judged: {outside} ({path})")
        return self._over_starts(ev, bf, path, entries, starts)

    def _judge(self, ev, path, entries, results, last=False):
        return [check_floor(results, e, where=f"{ev.where} {level_name(self.level)}", baseline_source=str(path),
                            log_path=ev.log_path, last=last, env_diff=_env_diff(ev, e),
                            regression=ACCEPTANCE if e.metric == "acceptance_length" else REGRESSION)
                for e in entries.values()]

    def _over_starts(self, ev, bf, path, entries, starts) -> Outcome:
        level, allowed, shown = self.level, ev.profile.measurement.max_starts, []
        verdicts = self._judge(ev, path, entries, [x.result for x in _clean(starts)])

        def unsettled():
            disturbed = all(x.result.disturbances for x in starts)
            return any(another_start(v, len(_clean(starts)), entries[v.metric], allowed, disturbed=disturbed)
                       for v in verdicts)

        while unsettled():
            why = "; ".join(v.message for v in verdicts if v.outcome != "pass") or (
                f"passed the floor for {len(starts)} start(s), not yet the one for the {allowed} starts the profile "
                f"allows")
            more = ev.replicate(level, why)
            if more is None:
                break
            starts = more
            shown.append(f"{ev.where} {level_name(level)}: start {len(starts)} read "
                         f"{starts[-1].result.sustained_output_tps:,.1f}"
                         f" tok/s (re-measured after a server restart: {why[:200]})")
            outside = ev.host_outside(bf)
            if outside:  # the restart's probe: the host's CPU changed under the run
                return Outcome.skip(f"{ev.where} {level_name(level)}: floor not judged after {len(starts)} "
                                    f"starts: {outside} ({path})", shown)
            verdicts = self._judge(ev, path, entries, [x.result for x in _clean(starts)])
        if any(v.outcome == "inconclusive" for v in verdicts):  # no more starts come: decided where it can be
            verdicts = self._judge(ev, path, entries, [x.result for x in _clean(starts)], last=True)
        verdicts = saturated(attributed(verdicts), [x.result for x in starts])
        for x in starts[1:]:
            failure = ev.level_failure(x)
            if failure:
                return Outcome.fail(failure, shown)
        where = f"{ev.where} {level_name(level)}"
        out = settle_over_starts(verdicts, [x.result for x in starts], where=where, against="floor",
                                 note=ev.replicate_note(level), slow_host=ev.host_slower(bf))
        news = [n for n in (faster(v, where) for v in verdicts) if n] if out.kind == "pass" else []
        for n in news:
            ev.record_faster(level, n)
        return out.showing(shown + news)


def saturated(verdicts: list, results: list) -> list:
    """At an offered rate (an open loop), throughput under its floor where the server completed fewer requests than
    were offered is the server saturating below the rate: the message says where, from the level's own counts, so
    it is not read as the client falling behind (whose lag is measured apart)."""
    said = next((r.saturation for r in reversed(results) if r.saturation), None)
    if said is None:
        return verdicts
    return [replace(v, message=f"{v.message}; {said}") if v.metric == "sustained_output_tps" and v.outcome != "pass"
            else v for v in verdicts]


def attributed(verdicts: list) -> list:
    """With speculative decoding, output throughput is a verify step's speed times the tokens it accepts: a
    throughput floor that did not pass says which of the two moved, from the acceptance floor judged beside it. The
    category stays the throughput's."""
    by = {v.metric: v for v in verdicts}
    out, acc = by.get("sustained_output_tps"), by.get("acceptance_length")
    if out is None or acc is None or out.outcome == "pass" or not out.value or not acc.value:
        return verdicts
    change = f"{acc.baseline:.2f} -> {acc.value:.2f} ({acc.value / acc.baseline - 1:+.1%})"
    said = (f"output {out.value / out.baseline - 1:+.1%} with acceptance {change}: the draft's share"
            if acc.outcome != "pass" else
            f"output {out.value / out.baseline - 1:+.1%} with acceptance unchanged ({change}, within its floor): the "
            f"verify step slowed (kernels, scheduling)")
    return [replace(v, message=f"{v.message}; {said}") if v is out else v for v in verdicts]


@dataclass(frozen=True)
class LatencyCeilings:
    """TTFT, TPOT, ITL and E2E percentiles at or below the baseline's ceilings, decided by their intervals; past
    the KV ceiling only the decode-side latencies are judged (requests queue there by design)."""

    level: int

    def decide(self, ev: Evidence) -> Outcome:
        level = self.level
        bf, path = ev.baseline()
        entries = [e for e in (bf.entries(ev.name, level).values() if bf else []) if e.is_latency]
        if not entries:
            return Outcome.skip(f"{path} holds no latency entry for {ev.name} {level_name(level)} (`sglperf "
                                f"baseline calibrate --metric latency RUN_FILES...` adds them)")
        failure = ev.level_failure(ev.measure(level))
        if failure:
            return Outcome.fail(failure)
        outside = ev.host_outside(bf)
        if outside:
            return Outcome.skip(f"{ev.where} {level_name(level)}: latency ceilings not judged: {outside} ({path})")
        return self._by_majority(ev, path, entries)

    def _by_majority(self, ev, path, entries) -> Outcome:
        """A start that does not pass is measured again after a server restart, while the profile allows, and the
        majority of the starts decides; starts the floor re-measured count too."""
        level, allowed = self.level, ev.profile.measurement.max_starts
        past = ev.ceiling is not None and level > ev.ceiling.effective

        def judge(x):
            return [check_ceiling(x.records, x.result, e, where=f"{ev.where} "
                                                                f"{level_name(level)}", baseline_source=str(path),
                                  past_kv_ceiling=past, env_diff=_env_diff(ev, e)) for e in entries]

        starts = ev.level_starts(level)
        per_start = [judge(starts[0])]
        decided = [over_starts([v.outcome], allowed) for v in per_start[0]]
        while any(d is None for d in decided):
            if len(per_start) < len(starts):
                x = starts[len(per_start)]
            else:
                why = "; ".join(v.message for v in per_start[-1] if v.outcome != "pass")[:300]
                more = ev.replicate(level, f"latency ceiling not passed ({why})")
                if more is None:
                    break
                starts, x = more, more[-1]
                failure = ev.level_failure(x)
                if failure:
                    return Outcome.fail(failure)
            per_start.append(judge(x))
            decided = [over_starts([s[i].outcome for s in per_start], allowed) for i in range(len(entries))]
        verdicts = [verdict_over_starts([s[i] for s in per_start], d) for i, d in enumerate(decided)]
        return settle(verdicts, where=f"{ev.where} {level_name(level)}", against="latency ceilings",
                      disturbed=[d for x in starts[:len(per_start)] for d in x.result.disturbances],
                      log_path=ev.log_path, note=ev.replicate_note(level)).showing(v.message for v in verdicts)
