"""The server's count of one level: the client's sustained tok/s agrees with the server's own token counter over
the same window (judge/count.py); a disagreement is INVALID: the measurement cannot be trusted."""

from __future__ import annotations

from dataclasses import dataclass

from ..judge.count import COUNT_WORDS
from .evidence import Evidence
from .outcome import Outcome
from .settle import settle
from ..records import level_name


@dataclass(frozen=True)
class ServerCount:
    level: int

    def decide(self, ev: Evidence) -> Outcome:
        m = ev.measure(self.level)
        r = m.result
        counted_wrong = any(COUNT_WORDS in x for x in r.invalid_reasons)  # the level is invalid for this claim
        if r.incomplete or (not r.valid and not counted_wrong):
            return Outcome.skip(f"{ev.where} {level_name(self.level)}: no valid measurement to compare (see its "
                                f"floor and health tests)")
        if r.server_output_tps is None:
            return Outcome.skip(f"{ev.where}: the server exposes no token counter (scrape source: {m.scrape_source})")
        v = ev.server_count(r)
        return settle([v], where=f"{ev.where} {level_name(self.level)}", against="server's count").showing([v.message])
