"""When a level's numbers cannot be trusted (invalid), and what is worth knowing without invalidating them
(warnings): the measurement policy and its rules, kept apart from the statistics they judge (metrics.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from ..records import LevelResult, RequestRecord


@dataclass(frozen=True)
class MeasurementPolicy:
    steady_state_ratio: float = 0.9
    max_gap_s: float = 0.05
    warmup_completions: int | None = None  # default: the target concurrency (one generation)
    batches: int = 10  # the interval's batches (measure/intervals.py)
    # A window shorter than this many service lifetimes (metrics.service_lifetime) is invalid: it does not hold a
    # closed loop's whole cycle of prefills and decodes. One from trusted_window_lifetimes may stop a level
    # (converged or decided).
    min_window_lifetimes: float = 2.0
    trusted_window_lifetimes: float = 3.0
    ci_target: float = 0.01  # CI half-width / sustained, at most
    min_completions: int = 20  # inside the window (and at least one generation)
    # A CI stops a level only over at least 3 s of steady state (a few lifetimes of a fast level are milliseconds of
    # scheduling luck) and trusted_window_lifetimes lifetimes.
    decide_quiet_s: float = 0.5  # no early floor decision after this long without a token
    max_sim_behind: float = 0.05  # the simulator late by more than this share of its engine time: disturbed
    max_steal_share: float = 0.05  # the hypervisor's steal above this share of the CPU the work wanted: disturbed
    converge_window_s: float = 3.0
    # the profile's [measurement] server_agreement: a level may stop only once its count can be checked to it
    server_agreement: float = 0.02
    # Client-bound: the client's CPU near one core (its event loop is one thread) is invalid. A loop late enough to
    # hold back more than max_late_share of the offered load (metrics.late_share) is a disturbance, as a busy host
    # is: it can only lower throughput and raise latency, so a level that passes passed, and one that does not is
    # INVALID naming it, never a regression. 2% is twice the interval's target: less is not worth a restart. A lag
    # tail (p99) alone does not bias sustained throughput (tokens are counted, only their timestamps blur): large
    # against the ITL it is a warning.
    max_late_share: float = 0.02
    # A trace replay whose median request was sent later than this share of the trace's median gap (at its speed-up)
    # has lost the trace's timing: requests it spaced apart went out together. A disturbance, as the client lag is.
    max_trace_late_share: float = 0.25
    max_client_cpu_share: float = 0.90
    warn_lag_share_of_itl: float = 0.2
    # The service-level objective goodput counts against (profile [slo]): a request meets it when its own TTFT and
    # TPOT are at or below these (None: that bound is not set; both None: no goodput).
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None



def check_prompt_lengths(ok: list[RequestRecord], isl: int, mode: str) -> str | None:
    """The server's own prompt count (usage.prompt_tokens, meta_info) against each request's prompt as sent (ISL,
    or its own length under a length mix), where reported."""
    counted = Counter((r.server_prompt_tokens, r.prompt_tokens or isl) for r in ok
                      if r.server_prompt_tokens is not None)
    if not counted:
        return None
    if mode == "chat":  # the chat template adds the same tokens to every request
        extra = {k - sent for k, sent in counted}
        if len(extra) == 1 and min(extra) >= 0:
            return None
        return (f"the server counted {', '.join(str(k) for k in sorted({k for k, _ in counted}))} prompt tokens for "
                f"{isl}-token chat messages: the template overhead is not constant")
    wrong = {ks: v for ks, v in counted.items() if ks[0] != ks[1]}
    if not wrong:
        return None
    (k, sent), _ = max(wrong.items(), key=lambda kv: kv[1])
    return (f"the server counted {k} prompt tokens for a {sent}-token prompt ({sum(wrong.values())} of "
            f"{sum(counted.values())} requests): the prompts are not the length the level claims")




@dataclass(frozen=True)
class Judgement:
    reasons: tuple[str, ...]  # why the level is invalid (empty: valid)
    warnings: tuple[str, ...]
    disturbances: tuple[str, ...]  # what took the host; invalid only where a verdict does not pass (the judge's call)


def judge(st, policy: MeasurementPolicy, *, isl: int, prompt_check: str, stopped_because: str | None,
          incomplete: bool, note: str | None) -> Judgement:
    """The rules, over a level's statistics `st` (metrics.LevelStats)."""
    reasons: list[str] = [stopped_because] if stopped_because else []
    warns: list[str] = []
    if st.errors:
        example = next(r for r in st.done if r.error)
        reasons.append(f"{sum(st.errors.values())} of {len(st.done)} requests failed ("
                       + ", ".join(f"{k}: {v}" for k, v in sorted(st.errors.items()))
                       + f"; e.g. {example.error}: {example.error_detail})")
    problem = check_prompt_lengths(st.ok, isl, prompt_check)
    if problem:
        reasons.append(problem)
    odd = [r for r in st.done if r.impossible]
    if odd:  # the server's own numbers cannot be trusted, so neither can what is read from them
        reasons.append(f"the server reported numbers no request can have in {len(odd)} of {len(st.done)} requests "
                       f"(e.g. #{odd[0].index}: {'; '.join(odd[0].impossible)})")
    reasons += _window_rules(st, policy, warns)
    reasons += _client_rules(st, policy, warns)
    if incomplete:
        reasons.append(f"level incomplete: {note}" if note else "level incomplete")
    disturbed = list(st.host_disturbed) + list(st.gpu_disturbed)
    if st.late is not None and st.late > policy.max_late_share:
        disturbed.append(f"disturbed: the client's event loop held back {st.late:.1%} of the offered load (mean lag "
                         f"{st.lag_mean:.1f} ms, p99 {st.lag:.0f} ms, against a median E2E of "
                         f"{st.latency['e2e_ms'].median or 0:.0f} ms; limit {policy.max_late_share:.0%}): "
                         "sends were late")
    late, gap = st.sends.get("send_late_p50_ms"), st.sends.get("trace_gap_p50_ms")
    if late is not None and gap and late > policy.max_trace_late_share * gap:
        disturbed.append(f"disturbed: the client sent the trace's requests late (p50 {late:.1f} ms, p99 "
                         f"{st.sends['send_late_p99_ms']:.1f} ms, against a median gap of {gap:.1f} ms between them; "
                         f"limit {policy.max_trace_late_share:.0%} of it): the arrivals were not the trace's")
    if st.behind is not None and st.behind > policy.max_sim_behind:
        disturbed.append(f"disturbed: the simulator fell {st.behind:.0%} behind real time during the window (its "
                         f"engine could not keep its step times on this host; limit {policy.max_sim_behind:.0%})")
    return Judgement(tuple(reasons), tuple(warns), tuple(disturbed))


def _window_rules(st, policy: MeasurementPolicy, warns: list[str]) -> list[str]:
    if st.window is None:
        return ["no steady-state window: warm-up (one generation of requests) did not complete" if st.w_end is None
                else "no steady-state window: in-flight requests never held the target"]
    reasons = []
    s, e = st.window
    if st.lifetime and e - s < policy.min_window_lifetimes * st.lifetime:
        reasons.append(f"steady-state window {e - s:.1f} s is shorter than {policy.min_window_lifetimes:g} service "
                       f"lifetimes ({policy.min_window_lifetimes:g} x {st.lifetime:.2f} s)")
    elif st.half is None:
        reasons.append("no token arrived inside the steady-state window")
    elif st.sustained and st.half / st.sustained > policy.ci_target:
        # Not invalid: the interval is what the verdicts use; a wide one decides less (INCONCLUSIVE), never wrong
        warns.append(f"95% CI +/-{st.half / st.sustained:.1%} is wider than the target +/-{policy.ci_target:.1%}")
    if st.shift:
        warns.append(st.shift)
    need = max(policy.min_completions, st.concurrency or 0)
    if st.completed_in_window < need:
        reasons.append(f"only {st.completed_in_window} requests completed inside the window (need {need})")
    return reasons


def _client_rules(st, policy: MeasurementPolicy, warns: list[str]) -> list[str]:
    """A client that saturated reports itself, not the server."""
    reasons = []
    lag, cpu = st.lag, st.cpu
    itl_med = st.latency["itl_ms"].median
    if lag is not None and itl_med and lag > policy.warn_lag_share_of_itl * itl_med and lag > 10:
        warns.append(f"client event-loop lag p99 {lag:.0f} ms is {lag / itl_med:.0%} of the median ITL: ITL and "
                     f"TTFT percentiles are blurred by up to that much (throughput is not)")
    if cpu is not None and cpu > policy.max_client_cpu_share:
        reasons.append(f"client-bound: client CPU {cpu:.0%} of a core > {policy.max_client_cpu_share:.0%}")
    return reasons


def count_checkable(r: LevelResult, tolerance: float) -> bool:
    """Whether the window is long enough for its count check to see a gap of a few times `tolerance`. A counter
    that moves when requests finish is checked on the requests that finished between two scrapes, and those that
    finished within the scrapes' timing widen its allowance; a closed loop finishes them in cohorts, so on a short
    window that share can exceed the gap the check exists to catch (docs/measurement.md, "A window too short for its
    count"). While it is above `tolerance` the level runs on; a per-token counter's edges are a decode step."""
    return not r.server_count_at_completion or (r.client_completed_edge_share or 0.0) <= tolerance
