"""RequestRecords (+ server and client samples) -> LevelResult.

Definitions (documented in the README, pinned by tests/test_metrics.py):
- in flight: a request counts from its send time to its end time (or `now` while running).
- steady-state window: after warm-up (the first `target` completions, i.e. one generation of requests), the
  longest span in which in-flight >= ceil(ratio x target); dips shorter than `max_gap_s` (the instant between one
  request ending and its worker sending the next) do not break a span. Same idea as SGLang's
  benchmark/steady_state.py, which uses the run's peak in-flight instead of the target.
- sustained output tok/s: tokens whose chunk arrived inside the window / window length. Total adds the prompt
  tokens of requests whose first token arrived inside the window (their prefill finished there).
- 95% CI: batch means. The window is cut into k equal batches, each at least one median request lifetime long
  (so batches are nearly independent), 5 <= k <= 30; half-width = t(0.975, k-1) x sd(batch rates) / sqrt(k).
- whole-run: bench_serving's definition: completion tokens of successful requests / (last end - first send).
- peak: the best 1-second bucket of token arrivals since the first send (bench_serving's "peak output").
- latencies: over successful requests sent inside the window (all successful ones if none): TTFT, TPOT
  ((end - first) / (tokens - 1)), ITL (each chunk gap split evenly over its tokens), E2E.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import numpy as np
from scipy import stats

from ..environment.gpu import summarize as gpu_summary
from ..environment.host import disturbance
from ..records import ClientSample, LevelResult, RequestRecord, ServerSample, Summary


@dataclass(frozen=True)
class MeasurementPolicy:
    steady_state_ratio: float = 0.9
    max_gap_s: float = 0.05
    warmup_completions: int | None = None  # default: the target concurrency (one generation)
    min_batches: int = 5
    max_batches: int = 30
    ci_target: float = 0.01  # CI half-width / sustained, at most
    min_completions: int = 20  # inside the window (and at least one generation)
    # A CI stops a level only from 10 batches (t with 9 degrees of freedom: a handful of batches can agree by
    # chance, and closed-loop cohorts beat) over at least 3 s of steady state (a few lifetimes of a fast level are
    # milliseconds of scheduling luck). Fewer batches still give the verdicts a (wider) interval.
    converge_batches: int = 10
    decide_quiet_s: float = 0.5  # no early floor decision after this long without a token
    max_sim_behind: float = 0.05  # the simulator late by more than this share of its engine time: disturbed
    converge_window_s: float = 3.0
    # Client-bound: the client's CPU near one core (its event loop is one thread), or an event-loop lag that delays
    # closed-loop sends by a visible fraction of a request's life. Lag alone does not bias sustained throughput
    # (tokens are counted, only their timestamps blur), so lag large against the ITL is a warning, not invalid.
    max_loop_lag_p99_s: float = 0.05
    max_lag_share_of_e2e: float = 0.05
    max_client_cpu_share: float = 0.90
    warn_lag_share_of_itl: float = 0.2
    # The service-level objective goodput counts against (profile [slo]): a request meets it when its own TTFT and
    # TPOT are at or below these (None: that bound is not set; both None: no goodput).
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None


def goodput(records: list[RequestRecord], window: tuple[float, float] | None, policy: MeasurementPolicy
            ) -> tuple[float | None, float | None, float | None]:
    """(requests/s, output tok/s, share of requests) that met the SLO, over requests sent inside the window and
    finished: the rate of useful work as a user with that SLO sees it (AIPerf's and GuideLLM's goodput)."""
    if window is None or (policy.slo_ttft_ms is None and policy.slo_tpot_ms is None):
        return None, None, None
    s, e = window
    sent = [r for r in records if r.ok and s <= r.send_time < e and r.first_token_time is not None]
    if not sent:
        return None, None, None
    good = []
    for r in sent:
        ttft = (r.first_token_time - r.send_time) * 1e3
        n = r.output_tokens
        tpot = (r.end_time - r.first_token_time) / (n - 1) * 1e3 if n > 1 else 0.0
        if (policy.slo_ttft_ms is None or ttft <= policy.slo_ttft_ms) and \
                (policy.slo_tpot_ms is None or tpot <= policy.slo_tpot_ms):
            good.append(r)
    span = e - s
    return len(good) / span, sum(r.output_tokens for r in good) / span, len(good) / len(sent)


def summarize(values) -> Summary:
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        return Summary(None, None, None, None, 0)
    return Summary(float(a.mean()), float(np.median(a)), float(np.percentile(a, 90)), float(np.percentile(a, 99)),
                   int(a.size))


def inflight_steps(records: list[RequestRecord], now: float) -> tuple[np.ndarray, np.ndarray]:
    """The in-flight count as a step function: (times, count from that time on)."""
    if not records:
        return np.array([]), np.array([])
    starts = np.array([r.send_time for r in records])
    ends = np.array([min(r.end_time, now) if r.end_time else now for r in records])
    t = np.concatenate([starts, ends])
    d = np.concatenate([np.ones_like(starts), -np.ones_like(ends)])
    order = np.lexsort((-d, t))  # at equal times count the arrival first: no false dip at a hand-over
    return t[order], np.cumsum(d[order])


def steady_state_window(records: list[RequestRecord], target: int, ratio: float, max_gap_s: float,
                        not_before: float, now: float, steps: tuple[np.ndarray, np.ndarray] | None = None
                        ) -> tuple[float, float] | None:
    """`steps`: inflight_steps(records, now), where the caller has them."""
    times, count = steps if steps is not None else inflight_steps(records, now)
    if times.size == 0:
        return None
    threshold = max(1, math.ceil(ratio * target))
    a, b = times, np.append(times[1:], now)  # each step of the count holds from a to b
    held = (b > a) & (count >= threshold)
    a, b = a[held], b[held]
    if a.size == 0:
        return None
    # a dip shorter than max_gap_s does not break the span
    starts = np.flatnonzero(np.append(True, a[1:] - b[:-1] > max_gap_s))
    ends = np.append(starts[1:] - 1, a.size - 1)
    best = None
    for s, e in zip(a[starts].tolist(), b[ends].tolist()):
        s = max(s, not_before)
        if e > s and (best is None or e - s > best[1] - best[0]):
            best = (s, e)
    return best


def warmup_end(records: list[RequestRecord], n: int) -> float | None:
    ends = sorted(r.end_time for r in records if r.ok)
    if len(ends) < n:
        return None
    return ends[n - 1] if n > 0 else min(r.send_time for r in records)


def token_arrivals(records: list[RequestRecord]) -> tuple[np.ndarray, np.ndarray]:
    """Chunk arrival times and token counts of every request that did not fail."""
    ts = [r.chunk_times for r in records if r.error is None and r.chunk_times]
    ns = [r.chunk_tokens for r in records if r.error is None and r.chunk_times]
    if not ts:
        return np.array([]), np.array([])
    return np.concatenate(ts), np.concatenate(ns).astype(float)


class ArrivalLog:
    """token_arrivals over a level's records as its checks see them: the finished ones converted once each, those
    still in flight afresh. A check in the middle of a level reads every chunk so far, and re-converting every
    record's times at each check was a quarter of its cost (order does not matter: batches and buckets are counts).
    """

    def __init__(self) -> None:
        self._seen = 0
        self._times, self._tokens = np.array([]), np.array([])

    def arrivals(self, records: list[RequestRecord], finished: int) -> tuple[np.ndarray, np.ndarray]:
        """`records[:finished]` only ever grows (the generator's finished records, in order); the rest are in flight."""
        t, n = token_arrivals(records[self._seen:finished])
        if t.size:
            self._times, self._tokens = np.concatenate([self._times, t]), np.concatenate([self._tokens, n])
        self._seen = finished
        t, n = token_arrivals(records[finished:])
        return np.concatenate([self._times, t]), np.concatenate([self._tokens, n])


def batch_means(times: np.ndarray, tokens: np.ndarray, window: tuple[float, float], batch_min_s: float,
                min_batches: int, max_batches: int) -> tuple[float, float | None, int]:
    """(rate, CI half-width or None when fewer than min_batches fit, number of batches)."""
    s, e = window
    length = e - s
    inside = (times >= s) & (times < e)
    rate = float(tokens[inside].sum() / length) if length > 0 else 0.0
    k = min(max_batches, int(length // batch_min_s)) if batch_min_s > 0 else max_batches
    if k < min_batches:
        return rate, None, k
    rates = _batch_rates(times, tokens, window, k)
    sd = rates.std(ddof=1)
    if sd <= 1e-9 * abs(rates.mean()):  # identical batches (to rounding): lockstep cohorts, not precision; unknown
        return float(rates.mean()), None, k
    half = float(stats.t.ppf(0.975, k - 1) * sd / math.sqrt(k))
    return float(rates.mean()), half, k


def _batch_rates(times: np.ndarray, tokens: np.ndarray, window: tuple[float, float], k: int) -> np.ndarray:
    s, e = window
    inside = (times >= s) & (times < e)
    # np.histogram's bins, without its sort (given edges, it sorts every chunk time at every check)
    batch = np.searchsorted(np.linspace(s, e, k + 1), times[inside], side="right") - 1
    per_batch = np.bincount(np.minimum(batch, k - 1), weights=tokens[inside], minlength=k)
    return per_batch / ((e - s) / k)


def regime_shift(times: np.ndarray, tokens: np.ndarray, window: tuple[float, float], k: int, *,
                 min_side: int = 5, alpha: float = 1e-3, min_shift: float = 0.05) -> str | None:
    """Words for a throughput that moved from one steady rate to another inside the window, else None.

    llama.cpp on the H200 with its prompt cache on ran p16 c64 at ~1,010 tok/s for 24 s, then ~1,340 to the end:
    the level's interval covered both and its mean was neither. The best single split of the window's k batch rates,
    by Welch's t-test (scipy), Bonferroni-corrected over the splits tried, at least `min_side` batches each side and
    a shift of at least `min_shift`: named in the level's warnings, so a wide interval says why it is wide."""
    if k < 2 * min_side:
        return None
    rates = _batch_rates(times, tokens, window, k)
    splits = range(min_side, k - min_side + 1)
    best = None
    for i in splits:
        a, b = rates[:i], rates[i:]
        if min(a.std(), b.std()) <= 1e-9 * abs(rates.mean()):  # a side with no spread: a lockstep cohort, no test
            continue
        p = stats.ttest_ind(a, b, equal_var=False).pvalue
        if best is None or p < best[0]:
            best = (p, i)
    if best is None or not best[0] * len(splits) < alpha:
        return None
    p, i = best
    before, after = float(rates[:i].mean()), float(rates[i:].mean())
    shift = after / before - 1 if before > 0 else math.inf
    if abs(shift) < min_shift:
        return None
    at = (window[1] - window[0]) * i / k
    return (f"throughput changed inside the window: {before:,.0f} tok/s for its first {at:.0f} s, then {after:,.0f} "
            f"({shift:+.0%}; Welch p = {min(1.0, p * len(splits)):.0e} over {k} batches): the server ran in two "
            f"regimes, and the interval spans both")


def peak_bucket(times: np.ndarray, tokens: np.ndarray, t0: float) -> float | None:
    if times.size == 0:
        return None
    nb = int(math.floor(times.max() - t0)) + 1
    counts = np.bincount(np.floor(times - t0).astype(int).clip(0), weights=tokens, minlength=nb)
    return float(counts.max())


def time_average_inflight(records: list[RequestRecord], window: tuple[float, float], now: float,
                          steps: tuple[np.ndarray, np.ndarray] | None = None) -> float:
    times, count = steps if steps is not None else inflight_steps(records, now)
    s, e = window
    if times.size == 0 or e <= s:
        return 0.0
    seg_end = np.append(times[1:], now)
    lo = np.clip(times, s, e)
    hi = np.clip(seg_end, s, e)
    return float(((hi - lo) * count).sum() / (e - s))


def latency_values(records: list[RequestRecord]) -> dict[str, list[float]]:
    """Per request (ITL: per token), in ms: TTFT, TPOT, ITL and E2E, as bench_serving defines them. A chunk's gap
    since the previous chunk that carried tokens is split evenly over its tokens; chunks at the first token's time
    add none. ITL in numpy: one Python step per chunk was a fifth of a level's analysis."""
    ttft, tpot, e2e, times, counts, firsts = [], [], [], [], [], []
    for r in records:
        first = r.first_token_time
        if first is None:
            continue
        ttft.append((first - r.send_time) * 1e3)
        e2e.append((r.end_time - r.send_time) * 1e3)
        n = r.output_tokens
        if n > 1:
            tpot.append((r.end_time - first) / (n - 1) * 1e3)
        times.append(r.chunk_times)
        counts.append(r.chunk_tokens)
        firsts.append(first)
    itl: list[float] = []
    if times:
        lengths = [len(t) for t in times]
        t, k = np.concatenate(times), np.concatenate(counts)
        req = np.repeat(np.arange(len(times)), lengths)
        first = np.repeat(firsts, lengths)
        carried = k > 0
        t, k, req, first = t[carried], k[carried], req[carried], first[carried]
        prev = np.empty_like(t)
        prev[1:] = t[:-1]
        starts = np.ones(t.size, dtype=bool)
        starts[1:] = req[1:] != req[:-1]
        prev[starts] = first[starts]
        later = t > first
        itl = np.repeat((t[later] - prev[later]) * 1e3 / k[later], k[later]).tolist()
    return {"ttft_ms": ttft, "tpot_ms": tpot, "itl_ms": itl, "e2e_ms": e2e}


def latency_summaries(records: list[RequestRecord]) -> dict[str, Summary]:
    return {k: summarize(v) for k, v in latency_values(records).items()}


def _interp(samples: list[ServerSample], attr: str, t: float) -> float | None:
    pts = [(s.time, getattr(s, attr)) for s in samples if getattr(s, attr) is not None]
    if len(pts) < 2 or not (pts[0][0] <= t <= pts[-1][0]):
        return None
    xs, ys = zip(*pts)
    return float(np.interp(t, xs, ys))


def _edge_uncertainty(samples: list[ServerSample], t: float) -> float:
    """How far in time a counter interpolated at `t` may be off: the larger half round trip of the two scrapes
    around it (each was read somewhere inside its own round trip)."""
    before = [s for s in samples if s.time <= t]
    after = [s for s in samples if s.time >= t]
    near = ([before[-1]] if before else []) + ([after[0]] if after else [])
    return max((s.time_uncertainty_s for s in near), default=0.0)


def _running_per_step(samples: list[ServerSample], s: float, e: float, delta) -> tuple[float, float] | None:
    """Mean running requests over the window, and the largest mean between two successive scrapes inside it, from
    counters of busy slots summed over decode steps (ServerSample.busy_slot_steps_total): what the engine itself
    counted at every step, not what a scrape happened to see."""
    d_steps, d_busy = delta("decode_steps_total"), delta("busy_slot_steps_total")
    if not d_steps or d_busy is None:
        return None
    pts = [x for x in samples if x.decode_steps_total is not None and x.busy_slot_steps_total is not None]
    near = [x for x in pts if s <= x.time <= e]
    edges = [x for x in pts if x.time < s][-1:] + near + [x for x in pts if x.time > e][:1]
    means = [(b.busy_slot_steps_total - a.busy_slot_steps_total) / (b.decode_steps_total - a.decode_steps_total)
             for a, b in zip(edges, edges[1:]) if b.decode_steps_total > a.decode_steps_total]
    mean = d_busy / d_steps
    return mean, max(means + [mean])


def server_view(samples: list[ServerSample], window: tuple[float, float] | None) -> dict:
    """The server's own output rate over the window (counters interpolated at its edges) and gauge means."""
    out = dict(server_output_tps=None, server_mean_running=None, server_max_running=None, server_mean_queued=None,
               server_mean_token_usage=None, server_retractions=None, server_edges_uncertainty_s=None,
               server_samples_in_window=None, server_running_source=None)
    if not samples or window is None:
        return out
    s, e = window

    def delta(attr: str) -> float | None:
        a, b = _interp(samples, attr, s), _interp(samples, attr, e)
        return None if a is None or b is None else b - a

    d_decode, d_first, d_out = delta("decode_tokens_total"), delta("first_tokens_total"), delta("output_tokens_total")
    if d_decode is not None and d_first is not None:
        out["server_output_tps"] = (d_decode + d_first) / (e - s)
    elif d_out is not None:
        out["server_output_tps"] = d_out / (e - s)
    if out["server_output_tps"] is not None:
        out["server_edges_uncertainty_s"] = _edge_uncertainty(samples, s) + _edge_uncertainty(samples, e)
    inside = [x for x in samples if s <= x.time <= e]
    out["server_samples_in_window"] = len(inside)
    for attr, key in (("running", "server_mean_running"), ("queued", "server_mean_queued"),
                      ("token_usage", "server_mean_token_usage")):
        vals = [getattr(x, attr) for x in inside if getattr(x, attr) is not None]
        out[key] = float(np.mean(vals)) if vals else None
    running = [x.running for x in inside if x.running is not None]
    out["server_max_running"] = float(max(running)) if running else None
    out["server_running_source"] = "snapshots" if running else None
    per_step = _running_per_step(samples, s, e, delta)
    if per_step is not None:
        out["server_mean_running"], out["server_max_running"] = per_step
        out["server_running_source"] = "per decode step"
    out["server_retractions"] = delta("retracted_total")
    engine, behind = delta("sim_engine_s_total"), delta("sim_behind_s_total")
    out["sim_behind_share"] = behind / engine if engine and behind is not None else None
    return out


def client_health(samples: list[ClientSample], window: tuple[float, float] | None) -> tuple[float | None,
                                                                                              float | None]:
    """(event-loop lag p99 in ms, CPU share of one core) inside the window: of the worst client process where the
    streams are sharded over several (one saturated process is enough to bend what it measures)."""
    if not samples or window is None:
        return None, None
    s, e = window
    lags, cpus = [], []
    for w in sorted({x.worker for x in samples}):
        inside = [x for x in samples if x.worker == w and s <= x.time <= e]
        if len(inside) >= 2:
            lags.append(float(np.percentile([x.loop_lag_s for x in inside], 99) * 1e3))
            cpus.append((inside[-1].cpu_s - inside[0].cpu_s) / (inside[-1].time - inside[0].time))
    if not lags:
        return None, None
    return max(lags), float(max(cpus))


def check_prompt_lengths(ok: list[RequestRecord], isl: int, mode: str) -> str | None:
    """The server's own prompt count (usage.prompt_tokens, meta_info) against the ISL we sent, where reported."""
    counted = Counter(r.server_prompt_tokens for r in ok if r.server_prompt_tokens is not None)
    if not counted:
        return None
    if mode == "chat":  # the chat template adds the same tokens to every request
        if len(counted) == 1 and min(counted) >= isl:
            return None
        return (f"the server counted {', '.join(str(k) for k in sorted(counted))} prompt tokens for {isl}-token "
                f"chat messages: the template overhead is not constant")
    wrong = {k: v for k, v in counted.items() if k != isl}
    if not wrong:
        return None
    k, v = max(wrong.items(), key=lambda kv: kv[1])
    return (f"the server counted {k} prompt tokens for a {isl}-token prompt ({sum(wrong.values())} of "
            f"{sum(counted.values())} requests): the prompts are not the length the level claims")


def level_result(records: list[RequestRecord], *, target: int | None, rate: float | None, isl: int, osl: int,
                 policy: MeasurementPolicy, now: float | None = None, server_samples: list[ServerSample] = (),
                 client_samples: list[ClientSample] = (), incomplete: bool = False,
                 note: str | None = None, window_cap: float | None = None,
                 lifetime_s: float | None = None, window: tuple[float, float] | None = None,
                 stopped_because: str | None = None, prompt_check: str = "exact",
                 host_samples: list = (), gpu_samples: list = (), latencies: bool = True,
                 arrivals: tuple[np.ndarray, np.ndarray] | None = None) -> LevelResult:
    """`window_cap`: the steady-state window ends no later than this (the moment load stopped; the drain that
    follows only completes records and the whole-run number). `window` and `lifetime_s` reproduce exactly the window
    and CI batch length the stop decision judged. `stopped_because`: why the level was stopped early (systematic
    failures, in the server's words). `prompt_check`: "exact" (the server must count ISL prompt tokens) or "chat"
    (ISL plus one constant chat-template overhead). `latencies=False`: TTFT, TPOT and ITL are left empty (E2E is
    kept): a check in the middle of a level needs only the throughput, and ITL is one Python step per chunk.
    `arrivals`: token_arrivals(records), where the caller keeps them (ArrivalLog)."""
    reasons: list[str] = [stopped_because] if stopped_because else []
    warns: list[str] = []
    now = now if now is not None else max((r.end_time for r in records), default=0.0)
    sent = len(records)
    done = [r for r in records if not r.cancelled]
    ok = [r for r in done if r.ok]
    errors = Counter(r.error for r in done if r.error)
    if errors:
        example = next(r for r in done if r.error)
        reasons.append(f"{sum(errors.values())} of {len(done)} requests failed ("
                       + ", ".join(f"{k}: {v}" for k, v in sorted(errors.items()))
                       + f"; e.g. {example.error}: {example.error_detail})")
    prompt_problem = check_prompt_lengths(ok, isl, prompt_check)
    if prompt_problem:
        reasons.append(prompt_problem)
    t0 = min((r.send_time for r in records), default=0.0)
    times, tokens = arrivals if arrivals is not None else token_arrivals(records)
    lifetime = lifetime_s if lifetime_s is not None else (
        float(np.median([r.end_time - r.send_time for r in ok])) if ok else None)
    in_flight_target = target if target is not None else max(1, round(rate * (lifetime or 1.0))) if rate else 1
    warm_n = policy.warmup_completions if policy.warmup_completions is not None else in_flight_target
    w_end = warmup_end(records, warm_n)
    steps = inflight_steps(records, now)
    if window is None and w_end is not None:
        search_end = min(now, window_cap) if window_cap is not None else now
        window = steady_state_window(records, in_flight_target, policy.steady_state_ratio if target else 0.0,
                                     policy.max_gap_s, w_end, search_end, steps if search_end == now else None)
    sustained = half = total = None
    k = 0
    completed_in_window = 0
    lat_records = ok
    if window is None:
        reasons.append("no steady-state window: warm-up (one generation of requests) did not complete"
                       if w_end is None else "no steady-state window: in-flight requests never held the target")
    else:
        s, e = window
        sustained, half, k = batch_means(times, tokens, window, lifetime or 0.0, policy.min_batches,
                                         policy.max_batches)
        prefilled = sum(r.prompt_tokens for r in records
                        if r.error is None and (first := r.first_token_time) is not None and s <= first < e)
        total = sustained + prefilled / (e - s)
        completed_in_window = sum(1 for r in ok if s <= r.end_time < e)
        in_window = [r for r in ok if s <= r.send_time < e]
        lat_records = in_window or ok
        if half is None and k >= policy.min_batches:
            reasons.append(f"95% CI unknown: all {k} batches measured the same rate (closed-loop cohorts in "
                           f"lockstep); a spread of zero is no evidence of precision")
        elif half is None:
            reasons.append(f"steady-state window {e - s:.1f} s is shorter than {policy.min_batches} request "
                           f"lifetimes ({policy.min_batches} x {lifetime or 0:.2f} s)")
        elif sustained and half / sustained > policy.ci_target:
            # Not invalid: the interval is what the verdicts use; a wide one decides less (INCONCLUSIVE), never wrong
            warns.append(f"95% CI +/-{half / sustained:.1%} is wider than the target +/-{policy.ci_target:.1%}")
        # named in the final result only: the checks in the middle of a level decide from the interval alone
        shift = regime_shift(times, tokens, window, k) if half is not None and latencies else None
        if shift:
            warns.append(shift)
        need = max(policy.min_completions, in_flight_target if target else 0)
        if completed_in_window < need:
            reasons.append(f"only {completed_in_window} requests completed inside the window (need {need})")
    lag, cpu = client_health(list(client_samples), window)
    lat = (latency_summaries(lat_records) if latencies else
           {"ttft_ms": summarize([]), "tpot_ms": summarize([]), "itl_ms": summarize([]),
            "e2e_ms": summarize([(r.end_time - r.send_time) * 1e3 for r in lat_records])})
    e2e_med = lat["e2e_ms"].median
    lag_limit = max(policy.max_loop_lag_p99_s * 1e3, policy.max_lag_share_of_e2e * (e2e_med or 0))
    if lag is not None and lag > lag_limit:
        reasons.append(f"client-bound: event-loop lag p99 {lag:.0f} ms > {lag_limit:.0f} ms (max of "
                       f"{policy.max_loop_lag_p99_s * 1e3:.0f} ms and {policy.max_lag_share_of_e2e:.0%} of the "
                       f"median E2E): closed-loop sends were late")
    itl_med = lat["itl_ms"].median
    if lag is not None and itl_med and lag > policy.warn_lag_share_of_itl * itl_med and lag > 10:
        warns.append(f"client event-loop lag p99 {lag:.0f} ms is {lag / itl_med:.0%} of the median ITL: ITL and "
                     f"TTFT percentiles are blurred by up to that much (throughput is not)")
    if cpu is not None and cpu > policy.max_client_cpu_share:
        reasons.append(f"client-bound: client CPU {cpu:.0%} of a core > {policy.max_client_cpu_share:.0%}")
    host_numbers, disturbed = disturbance(list(host_samples), window)
    gpu_numbers, gpu_disturbed = gpu_summary(list(gpu_samples), window)
    disturbed += gpu_disturbed
    if incomplete:
        reasons.append(f"level incomplete: {note}" if note else "level incomplete")
    whole_out = whole_total = None
    if ok:
        dur = max(r.end_time for r in ok) - min(r.send_time for r in done or ok)
        if dur > 0:
            out_tok = sum(r.server_completion_tokens if r.server_completion_tokens is not None else r.output_tokens
                          for r in ok)
            whole_out = out_tok / dur
            whole_total = (out_tok + sum(r.prompt_tokens for r in ok)) / dur
    sv = server_view(list(server_samples), window)
    behind = sv.pop("sim_behind_share", None)
    if behind is not None and behind > policy.max_sim_behind:
        disturbed.append(f"disturbed: the simulator fell {behind:.0%} behind real time during the window (its engine "
                       f"could not keep its step times on this host; limit {policy.max_sim_behind:.0%})")
    server_ratio = (sustained / sv["server_output_tps"]) if sustained and sv["server_output_tps"] else None
    good_rps, good_tps, good_share = goodput(records, window, policy)
    achieved = time_average_inflight(records, window, now, steps) if window else None
    return LevelResult(
        concurrency=target, rate=rate, isl=isl, osl=osl, valid=not reasons, invalid_reasons=tuple(reasons),
        sustained_output_tps=sustained, sustained_output_tps_ci95=half, sustained_total_tps=total,
        whole_run_output_tps=whole_out, whole_run_total_tps=whole_total,
        peak_output_tps=peak_bucket(times, tokens, t0), achieved_concurrency=achieved,
        server_output_tps=sv["server_output_tps"], server_ratio=server_ratio,
        server_mean_running=sv["server_mean_running"], server_max_running=sv["server_max_running"],
        server_mean_queued=sv["server_mean_queued"], server_mean_token_usage=sv["server_mean_token_usage"],
        server_retractions=sv["server_retractions"], server_edges_uncertainty_s=sv["server_edges_uncertainty_s"],
        server_samples_in_window=sv["server_samples_in_window"], server_running_source=sv["server_running_source"],
        **lat, errors=dict(errors),
        window_start=window[0] if window else None, window_end=window[1] if window else None,
        window_s=(window[1] - window[0]) if window else 0.0, ci_batches=k, lifetime_s=lifetime, completed=len(ok),
        completed_in_window=completed_in_window,
        requests_sent=sent, cancelled=sum(1 for r in records if r.cancelled),
        duration_s=(now - t0) if records else 0.0, client_lag_p99_ms=lag, client_cpu_share=cpu,
        incomplete=incomplete, note=note, warnings=tuple(warns), host=host_numbers, sim_behind_share=behind,
        disturbances=tuple(disturbed), gpu=gpu_numbers, goodput_rps=good_rps, goodput_tps=good_tps,
        slo_met_share=good_share,
        count_source=Counter(r.count_source for r in ok).most_common(1)[0][0] if ok else None,
    )
