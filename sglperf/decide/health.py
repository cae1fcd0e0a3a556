"""Request health of one level: every request sent in the window completed without error, and the measurement is
valid; a level that did not finish is infrastructure's, not the server's speed."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..categories import INFRA, INVALID, Category
from ..judge.canary import UNDER_LOAD, CanaryRules, CanaryVerdict, check_canary, check_under_load
from ..records import LevelResult, level_name
from .evidence import Evidence
from .outcome import Outcome


def log_words(path: str | None) -> str:
    """Where a failure's details are (evidence.log_path: the suite's server log, or where to look instead); nothing
    where no log is known (a replayed run)."""
    return f". Server log: {path}" if path else ""


@dataclass(frozen=True)
class RequestHealth:
    level: int

    def decide(self, ev: Evidence) -> Outcome:
        m = ev.measure(self.level)
        r, where = m.result, f"{ev.where} {level_name(self.level)}"
        if r.incomplete:
            return Outcome.fail(f"{INFRA}: {where}: {r.note}{log_words(ev.log_path)}")
        if r.errors:
            bad = [rec for rec in m.records if rec.error]
            examples = "; ".join(f"#{rec.index} {rec.error}: {rec.error_detail}" for rec in bad[:3])
            return Outcome.fail(f"{INVALID}: {where}: " + "; ".join(r.invalid_reasons)
                                + f". First failures: {examples}{log_words(ev.log_path)}")
        if not r.valid:
            return Outcome.fail(f"{INVALID}: {where}: " + "; ".join(r.invalid_reasons))
        return Outcome.passed()


def start_failure(where: str, r, log_path: str | None, canary: str | None) -> str | None:
    """Why one start of a level cannot be judged by any claim: it did not finish (infrastructure), it cannot be
    trusted (invalid), or the output canary failed (`canary`: its words); None when it can be judged."""
    if r.incomplete:
        return f"{INFRA}: {where} {r.name}: {r.note}{log_words(log_path)}"
    wrong = [x for x in r.invalid_reasons if x.startswith(UNDER_LOAD)]
    if wrong:  # fast but wrong, found during the level: the canary's category, not a mere invalid measurement
        return f"{Category.DEGENERATE.prefix}: {where} {r.name}: {wrong[0]}{log_words(log_path)}"
    if not r.valid:
        return (f"{INVALID}: {where} {r.name} cannot be trusted: " + "; ".join(r.invalid_reasons)
                + log_words(log_path))
    return canary


def canary_words(where: str, what: str, category) -> str:
    """Fast but wrong: where the output canary failed, nothing measured from this server is judged."""
    return (f"{INVALID}: {where} {what}: measured (shown in the summary), not judged: the output canary failed "
            f"({category.prefix}; test_output_canary quotes the tokens): a server that returns garbage may be fast")


# What a level's own numbers say against it, checked where it is measured (run/session), so that no claim, history
# point or candidate is taken from it.
def count_checked(run, r: LevelResult) -> LevelResult:
    """A level whose client and server counts disagree beyond the bound is invalid: its numbers pass no floor, enter
    no history and make no candidate. A server that over-reports its tokens would otherwise read as a speed-up."""
    if not r.valid or r.incomplete or r.server_output_tps is None:
        return r
    v = run.server_count(r)
    if v.outcome != "invalid":
        return r
    why = v.message.removeprefix(f"{INVALID}: ").removeprefix(f"{run.where} {r.name}: ")  # the level names itself
    return replace(r, valid=False, invalid_reasons=(*r.invalid_reasons, why))


PIN_TOLERANCE = 0.05  # a pinned acceptance may read this much off (a request's last step accepts what is left)


def pin_checked(run, r: LevelResult) -> LevelResult:
    """A run with speculative acceptance pinned (SGLANG_SIMULATE_ACC_LEN) measures the verify step alone only where
    the pin held: a level whose measured acceptance is further from it than PIN_TOLERANCE (beyond its interval), or
    that measured none, is invalid naming both."""
    pin = run.fingerprint.get("spec_accept_pin")
    if not pin or not r.valid:
        return r
    a, ci = r.acceptance_length, r.acceptance_length_ci95 or 0.0
    # a request's first token comes from its prefill and its last verify step accepts only what is left
    expect = (r.osl - 1) / math.ceil((r.osl - 1) / pin) if r.osl > 1 else pin
    if a is not None and abs(a - expect) - ci <= PIN_TOLERANCE * expect:
        return r
    got = "no acceptance length reported" if a is None else f"measured {a:.3f} ± {ci:.3f}"
    return replace(r, valid=False, invalid_reasons=(*r.invalid_reasons, f"acceptance pinned at {pin:g} "
                   f"(SGLANG_SIMULATE_ACC_LEN) but {got}: the pin did not hold (limit ±{PIN_TOLERANCE:.0%})"))


def degenerate_levels(rec) -> list[str]:
    """The levels of a run whose outputs went degenerate under load ("config c16: degenerate under load")."""
    return [f"{cname} {r.name}: degenerate under load" for cname, c in rec.doc.configs.items()
            for r in c.levels.values() if any(x.startswith(UNDER_LOAD) for x in r.invalid_reasons)]


def outputs_checked(run, meas, r: LevelResult) -> LevelResult:
    """Output checked during the level, not only before it: the ids of the sampled requests (records.
    OUTPUT_SAMPLE_EVERY), judged by the canary's rules. A level whose outputs went degenerate is invalid in the canary's
    words: never a pass, a history point or a candidate, and its run is withheld as a failed canary's is."""
    c = run.profile.canary
    outputs = [rec.output_ids for rec in meas.records if rec.output_ids and not rec.error]
    why = check_under_load(outputs, canary_rules(c), c.output_len, run.vocab_size) if c.enabled and outputs else None
    if why is None:
        return r
    return replace(r, valid=False, invalid_reasons=(*r.invalid_reasons, why))


def canary_rules(section) -> CanaryRules:
    """The degenerate-output rules of a profile's [canary] section (run/profiles.CanarySection)."""
    return CanaryRules(section.max_top_share, section.min_distinct, section.compare_tokens)


def judge_canary(outputs, section, *, vocab: int | None, expected, env_diff: str = "") -> CanaryVerdict:
    """The output canary decided: degenerate, wrong against the profile's known answers, or changed against the
    baseline's outputs (`expected`) on this hardware class (judge/canary.check_canary)."""
    return check_canary(outputs, canary_rules(section), vocab=vocab, expected=expected, expect=section.expect,
                        env_diff=env_diff)
