"""The prefix cache of one level of a shared-prefix, conversation or trace workload: the share of prompt tokens the
server served from its prefix cache (each request's cached_tokens, measure/workload_metrics.prefix_cache), judged
against what the workload allows and against the baseline's floor. A cache switched off or broken costs throughput
too, but a throughput floor can only say "slower": this claim says which part moved."""

from __future__ import annotations

from dataclasses import dataclass

from ..categories import PREFIX_CACHE
from ..judge.floor import check_floor
from .floor import no_baseline, other_workload
from .evidence import Evidence
from .outcome import Outcome
from ..records import level_name

# Once each group's prefix is cached, every later prompt of the group is served from cache up to the prefix: the
# share the workload allows. Below it legitimately: each group's first prompt after a flush, and prefixes evicted
# when the KV pool is full. Half of it is far below both (a warm window holds many requests per group) and far above
# what a cache that is off or never matches reads (0, a token now and then): the baseline's floor judges the rest.
ALLOWED_SHARE = 0.5


@dataclass(frozen=True)
class PrefixCache:
    """The level's prompts served from the prefix cache as its shared-prefix workload allows."""

    level: int

    def decide(self, ev: Evidence) -> Outcome:
        m = ev.measure(self.level)
        r, where = m.result, f"{ev.where} {level_name(self.level)}"
        failure = ev.level_failure(m)
        if failure:
            return Outcome.fail(failure)
        if r.prefix_cache_allowed is None:
            return Outcome.skip(f"{where}: the workload shares no prefix (kind random)")
        if r.prefix_cache_share is None:
            return Outcome.skip(f"{where}: the server reports no cached tokens per request (SGLang: meta_info "
                                f"cached_tokens; OpenAI-compatible: usage.prompt_tokens_details, SGLang's "
                                f"--enable-cache-report)")
        share, ci, allowed = r.prefix_cache_share, r.prefix_cache_share_ci95 or 0.0, r.prefix_cache_allowed
        server = ("" if r.server_cache_hit_rate is None else
                  f"; the server's own hit rate over the window {r.server_cache_hit_rate:.3f}")
        shown = (f"{where}: {share:.3f} ± {ci:.3f} of prompt tokens served from the prefix cache, the workload "
                 f"allows {allowed:.3f}{server}")
        if share + ci < ALLOWED_SHARE * allowed:
            what = "each conversation's history is" if r.by_turn else "shared prefixes are"
            return Outcome.fail(f"{PREFIX_CACHE}: {shown}: below half of it, so {what} recomputed (a prefix cache "
                                f"turned off, e.g. --disable-radix-cache, or one that no longer matches)"
                                + (f"\nServer log: {ev.log_path}" if ev.log_path else ""), [shown])
        bf, path = ev.baseline()
        entry = bf.entries(ev.name, self.level).get("prefix_cache_share") if bf else None
        if entry is None:
            return (Outcome.skip(no_baseline(ev, path), [shown]) if bf is None else
                    Outcome.skip(f"{path} has no prefix_cache_share entry for {ev.name} "
                                 f"{level_name(self.level)}; {shown}",
                                 [shown]))
        outside = ev.host_outside(bf) or other_workload([entry], ev.fingerprint)
        if outside:
            return Outcome.skip(f"{where}: prefix cache floor not judged: {outside} ({path}); {shown}", [shown])
        v = check_floor([s.result for s in ev.level_starts(self.level)], entry, where=where,
                        baseline_source=str(path), log_path=ev.log_path, last=True, regression=PREFIX_CACHE)
        if v.outcome == "pass":
            return Outcome.passed().showing([shown, v.message])
        return Outcome.fail(v.message, [shown])
