"""What a level's workload features read over its window: drafting's acceptance length (speculative decoding), the
prefix cache's share of prompt tokens against what the workload allows, and an open loop's offered, sent and
achieved rates with its saturation. Each is None where the level's workload has no such feature."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from ..records import RequestRecord
from .server_view import counter_delta

def acceptance(done: list[RequestRecord], window, server) -> dict:
    """Speculative decoding's acceptance length over the requests that finished inside the window: accepted tokens
    per verify step, each request weighed by its verify steps (as SGLang's gauge pools them), with a 95% t interval
    over the requests; and the server's own: SGLang's gauge averaged over the window's scrapes, or from the counters
    of an engine that counts accepted tokens (llama.cpp: output / (output - accepted), wire.spec_from_timings).
    Nothing for a plain server."""
    inside = [r for r in done if r.spec_verify_ct and r.spec_accept_length is not None
              and (window is None or window[0] <= r.end_time <= window[1])]
    if not inside:
        return {}
    v = np.array([r.spec_verify_ct for r in inside], dtype=float)
    a = np.array([r.spec_accept_length for r in inside], dtype=float)
    mean = float((a * v).sum() / v.sum())
    # the weighed mean's standard error: the requests' spread x sqrt(sum w^2) / sum w
    half = (float(stats.t.ppf(0.975, len(a) - 1) * a.std(ddof=1) * np.sqrt((v ** 2).sum()) / v.sum())
            if len(a) > 1 else None)
    gauge = [s.spec_accept_length for s in server if s.spec_accept_length is not None
             and (window is None or window[0] <= s.time <= window[1])]
    own = sum(gauge) / len(gauge) if gauge else _accepted_per_pass(server, window)
    return dict(acceptance_length=round(mean, 4), acceptance_length_ci95=None if half is None else round(half, 4),
                server_accept_length=None if own is None else round(own, 4))


def _accepted_per_pass(server, window) -> float | None:
    """Output tokens per forward pass of the target from the counters of output and accepted draft tokens,
    interpolated at the window's edges."""
    if window is None:
        return None
    out = counter_delta(server, "output_tokens_total", window)
    acc = counter_delta(server, "spec_accepted_total", window)
    return out / (out - acc) if out is not None and acc is not None and out > acc >= 0 else None


def prefix_cache(done: list[RequestRecord], window, server, allowed: float | None) -> dict:
    """A shared-prefix workload's reuse over the requests that finished inside the window: the share of their
    prompt tokens the server served from its prefix cache (sum of cached_tokens over sum of prompt tokens), with a
    95% t interval over the requests (a ratio estimator's standard error), beside the share the workload allows and
    the server's own hit rate averaged over the window's scrapes. Nothing where the workload shares no prefix; a
    share of None where the server reports no cached tokens. A conversation's or a trace's requests say what they
    allow themselves: what earlier requests sent or received of their prompt (a conversation's history, a trace's
    shared blocks), over their prompt tokens (`allowed` is then None)."""
    inside = [r for r in done if window is None or window[0] <= r.end_time <= window[1]]
    talk = [r for r in inside if r.history_tokens is not None and r.prompt_tokens > 0]
    if allowed is None and talk:
        allowed = sum(r.history_tokens or 0 for r in talk) / sum(r.prompt_tokens for r in talk)
    if allowed is None:
        return {}
    rated = [r for r in inside if r.server_cached_tokens is not None and r.prompt_tokens > 0]
    gauge = [s.cache_hit_rate for s in server if s.cache_hit_rate is not None
             and (window is None or window[0] <= s.time <= window[1])]
    out = dict(prefix_cache_allowed=round(allowed, 4),
               server_cache_hit_rate=round(sum(gauge) / len(gauge), 4) if gauge else None)
    if not rated:
        return out
    c = np.array([min(r.server_cached_tokens, r.prompt_tokens) for r in rated], dtype=float)
    p = np.array([r.prompt_tokens for r in rated], dtype=float)
    share = float(c.sum() / p.sum())
    n = len(rated)
    half = (float(stats.t.ppf(0.975, n - 1) * np.sqrt(((c - share * p) ** 2).sum() / (n - 1) / n) / p.mean())
            if n > 1 else None)
    return dict(out, prefix_cache_share=round(share, 4),
                prefix_cache_share_ci95=None if half is None else round(half, 4))


# Completions in a window of an open loop are a Poisson count around rate x window where the server keeps up: more than
# 3 of its standard deviations short (0.1% one-sided) is a server that fell behind, not the count's noise.
SATURATION_Z = 3.0


def open_loop(records: list[RequestRecord], rate: float | None, queued: float | None) -> dict:
    """An open-loop level's offered rate against what the client sent and the server completed while the load ran
    (first send to last: a steady-state window chosen by in-flight counts is biased where few are in flight;
    docs/measurement.md). Sent short of offered is the client's (its lag, measured apart); completed short of
    offered by more than the arrivals' own noise is the server saturating: it completes about the achieved rate,
    and requests wait."""
    sends = [r.send_time for r in records]
    if rate is None or len(sends) < 2 or max(sends) <= min(sends):
        return {}
    s, e = min(sends), max(sends)
    span = e - s
    sent = sum(1 for r in records if s <= r.send_time < e) / span
    done = sum(1 for r in records if r.ok and s <= r.end_time < e)
    # a trace's arrivals are its own, not Poisson: what the server had to complete is what was sent (sent late, a
    # disturbance of its own: trace_sends)
    expected = sent * span if any(r.due_time is not None for r in records) else rate * span
    short = (expected - done) / math.sqrt(expected) if expected > 0 else 0.0
    saturation = None
    if short > SATURATION_Z:
        waiting = "" if queued is None else f"; the server's queue held {queued:.1f} requests on average"
        saturation = (f"offered {rate:g} req/s, the client sent {sent:.2f}, the server completed {done / span:.2f} in "
                      f"the window ({short:.1f} standard deviations of the arrivals short): the server saturated at "
                      f"about {done / span:.2f} req/s{waiting}")
    return dict(offered_rps=rate, sent_rps=round(sent, 4), achieved_rps=round(done / span, 4), saturation=saturation)


def lateness_ms(sent: list[RequestRecord]) -> list[float]:
    """How late each request of a trace replay was sent against when the trace meant it sent, ms (never below 0)."""
    return [max(0.0, r.send_time - r.due_time) * 1000 for r in sent if r.due_time is not None]


def trace_sends(records: list[RequestRecord], window) -> dict:
    """A trace replay's timing over the requests due inside the window: how late each was sent against when the
    trace meant it sent (p50, p99 ms), and the median gap between requests the trace asked for at its speed-up.
    Nothing outside a trace."""
    due = sorted((r for r in records if r.due_time is not None
                  and (window is None or window[0] <= r.due_time <= window[1])), key=lambda r: r.due_time or 0.0)
    if len(due) < 2:
        return {}
    late = lateness_ms(due)
    gaps = np.diff([r.due_time for r in due]) * 1000
    return dict(send_late_p50_ms=round(float(np.percentile(late, 50)), 3),
                send_late_p99_ms=round(float(np.percentile(late, 99)), 3),
                trace_gap_p50_ms=round(float(np.median(gaps)), 3))


def trace_line(r) -> str | None:
    """A trace replay's level in words (a LevelResult with trace_sends' fields): how late the client sent against
    the trace's times, and the prefix cache against what its shared blocks allow; None outside a trace."""
    if r.send_late_p50_ms is None:
        return None
    cache = ("" if r.prefix_cache_share is None or r.prefix_cache_allowed is None else
             f"; prefix cache {r.prefix_cache_share:.3f} of prompt tokens, the shared blocks allow "
             f"{r.prefix_cache_allowed:.3f}")
    return (f"trace sent late by p50 {r.send_late_p50_ms:.1f} ms, p99 {r.send_late_p99_ms:.1f} ms (its requests "
            f"{r.trace_gap_p50_ms:.0f} ms apart at the median){cache}")


def by_turn(done: list[RequestRecord], window) -> dict[str, dict[str, float | None]] | None:
    """A conversation workload's level by turn depth, over the successful requests that finished inside the window:
    how many, their prompt tokens, TTFT (p50, p90) and TPOT (p50) in ms, and the share of their prompt tokens the
    prefix cache served against the share their history allows. None outside a multi-turn workload."""
    inside = [r for r in done
              if r.ok and r.turn is not None and (window is None or window[0] <= r.end_time <= window[1])]
    if not inside:
        return None
    out: dict[str, dict[str, float | None]] = {}
    for turn in sorted({r.turn for r in inside if r.turn is not None}):
        rs = [r for r in inside if r.turn == turn]
        ttft = [1000 * (t - r.send_time) for r in rs if (t := r.first_token_time) is not None]
        tpot = [1000 * (r.end_time - t) / (r.output_tokens - 1) for r in rs
                if (t := r.first_token_time) is not None and r.output_tokens > 1]
        rated = [r for r in rs if r.server_cached_tokens is not None]
        prompt = sum(r.prompt_tokens for r in rated)
        out[str(turn)] = {
            "requests": float(len(rs)),
            "prompt_tokens": float(np.mean([r.prompt_tokens for r in rs])),
            "ttft_p50_ms": float(np.percentile(ttft, 50)) if ttft else None,
            "ttft_p90_ms": float(np.percentile(ttft, 90)) if ttft else None,
            "tpot_p50_ms": float(np.percentile(tpot, 50)) if tpot else None,
            "cache_share": sum(min(r.server_cached_tokens or 0, r.prompt_tokens) for r in rated) / prompt
            if prompt else None,
            "cache_allowed": sum(r.history_tokens or 0 for r in rs) / sum(r.prompt_tokens for r in rs),
        }
    return out


def turn_table(turns: dict[str, dict[str, float | None]], indent: str = "    ") -> list[str]:
    """by_turn as the lines a person reads: one row per turn depth."""
    def f(x, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    rows = [f"{indent}turn  requests  prompt  TTFT p50/p90 ms  TPOT p50 ms  cached / allowed"]
    for turn, v in sorted(turns.items(), key=lambda kv: int(kv[0])):
        rows.append(f"{indent}{turn:>4}  {f(v['requests'], '8.0f')}  {f(v['prompt_tokens'], '6.0f')}  "
                    f"{f(v['ttft_p50_ms'], '7.1f')}/{f(v['ttft_p90_ms'], '<7.1f')}  {f(v['tpot_p50_ms'], '11.2f')}  "
                    f"{f(v['cache_share'], '.3f')} / {f(v['cache_allowed'], '.3f')}")
    return rows
