"""Request health of one level: every request sent in the window completed without error, and the measurement is
valid; a level that did not finish is infrastructure's, not the server's speed."""

from __future__ import annotations

from dataclasses import dataclass

from ..categories import INFRA, INVALID, Category
from ..judge.canary import UNDER_LOAD
from .outcome import Outcome


@dataclass(frozen=True)
class RequestHealth:
    level: int

    def decide(self, ev) -> Outcome:
        m = ev.measure(self.level)
        r, where = m.result, f"{ev.where} c{self.level}"
        if r.incomplete:
            return Outcome.fail(f"{INFRA}: {where}: {r.note}. Server log: {ev.log_path}")
        if r.errors:
            bad = [rec for rec in m.records if rec.error]
            examples = "; ".join(f"#{rec.index} {rec.error}: {rec.error_detail}" for rec in bad[:3])
            return Outcome.fail(f"{INVALID}: {where}: " + "; ".join(r.invalid_reasons)
                                + f". First failures: {examples}. Server log: {ev.log_path}")
        if not r.valid:
            return Outcome.fail(f"{INVALID}: {where}: " + "; ".join(r.invalid_reasons))
        return Outcome.passed()


def start_failure(where: str, r, log_path: str | None, canary: str | None) -> str | None:
    """Why one start of a level cannot be judged by any claim: it did not finish (infrastructure), it cannot be
    trusted (invalid), or the output canary failed (`canary`: its words); None when it can be judged."""
    if r.incomplete:
        return f"{INFRA}: {where} c{r.concurrency}: {r.note}. Server log: {log_path}"
    wrong = [x for x in r.invalid_reasons if x.startswith(UNDER_LOAD)]
    if wrong:  # fast but wrong, found during the level: the canary's category, not a mere invalid measurement
        return f"{Category.DEGENERATE.prefix}: {where} c{r.concurrency}: {wrong[0]}. Server log: {log_path}"
    if not r.valid:
        return (f"{INVALID}: {where} c{r.concurrency} cannot be trusted: " + "; ".join(r.invalid_reasons)
                + f". Server log: {log_path}")
    return canary


def canary_words(where: str, what: str, category) -> str:
    """Fast but wrong: where the output canary failed, nothing measured from this server is judged."""
    return (f"{INVALID}: {where} {what}: measured (shown in the summary), not judged: the output canary failed "
            f"({category.prefix}; test_output_canary quotes the tokens): a server that returns garbage may be fast")
