"""The host's part in a drop: how much CPU the hypervisor stole from a level, and whether a regression lies
further below its floor than stolen CPU or a slower host CPU explains. What is explained is named, never passed.
"""

from __future__ import annotations


from ..environment.host import STEAL_REASON


STEAL_COST = 2.0  # the drop below its floor one share of stolen CPU may explain: 3.4x the most seen (beyond_steal)
# steal a verdict that did not pass names, though under the disturbance limit: quiet hosts steal under 0.5% of the
# CPU the work wants, and a few % read levels a few % low. Named, not given back as slack: twice such a share would
# excuse a planted drop of that size
STEAL_NAMED = 0.01


def steal_share(r) -> float:
    """The share of the CPU a level's work wanted (the host's busy cores plus the stolen) that the hypervisor stole
    during its window, disturbance or not (0 where the host was not measured)."""
    h = r.host or {}
    wanted = sum(h.get(k) or 0.0 for k in ("other_cores", "client_cores", "server_cores", "steal_cores"))
    return (h.get("steal_cores") or 0.0) / wanted if wanted > 0 else 0.0


def stolen_share(r) -> float | None:
    """`steal_share`, where steal alone disturbed the level; None otherwise."""
    if not r.disturbances or not all(d.startswith(STEAL_REASON) for d in r.disturbances):
        return None
    return steal_share(r) if (r.host or {}) else None


def beyond_steal(v, starts: list) -> float | None:
    """The largest stolen share over `starts`, where steal alone disturbed every one and `v` is a regression whose
    interval lies wholly further below its floor than STEAL_COST times that share: a drop no steal of that size
    explains, which stays a regression on a disturbed host (the starts behind STEAL_COST: tests/data/gpu,
    docs/measurement.md). None otherwise."""
    shares = [x for r in starts if (x := stolen_share(r)) is not None]
    if v.outcome != "regression" or v.value is None or not shares or len(shares) < len(starts):
        return None
    s = max(shares)
    return s if v.value + (v.ci95 or 0.0) < v.floor * (1 - STEAL_COST * s) else None


def beyond_host(v, slower: float) -> bool:
    """Whether `v` is a regression whose interval lies wholly below its floor even with a host CPU `slower` (a share)
    given back: a server no more than wholly bound by the CPU loses at most that share of its throughput, so such a
    drop is the server's."""
    return v.outcome == "regression" and v.value is not None and v.value + (v.ci95 or 0.0) < v.floor * (1 - slower)
