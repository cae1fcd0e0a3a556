"""A claim over its evidence -> one Outcome (`decide`). The one place where a level is judged over its server
starts, measured again after a restart until decided (within the profile's starts and the run's budget), and the
host's part is named. No pytest here and nothing of run/: the session hands in its evidence (decide/evidence.py), the
pytest layer only maps the Outcome to pass, skip or fail.

A new claim is one class here (its `decide(evidence)`) and one function in judge/."""

from __future__ import annotations

from ..categories import SglperfError, Unavailable
from .outcome import Outcome


def decide(claim, evidence) -> Outcome:
    """`claim.decide(evidence)`, with sglperf's errors as outcomes: Unavailable is a skip in its words, any other
    (a malformed baseline, a dead server) a failure in its category's words."""
    try:
        return claim.decide(evidence)
    except Unavailable as e:
        return Outcome.skip(str(e))
    except SglperfError as e:
        return Outcome.fail(e.report())
