"""RequestRecords (+ server and client samples) -> LevelResult.

Definitions (documented in the README, pinned by tests/test_metrics.py):
- in flight: a request counts from its send time to its end time (or `now` while running).
- steady-state window: after warm-up (the first `concurrency` completions, i.e. one generation of requests), the
  longest span in which in-flight >= ceil(ratio x concurrency); dips shorter than `max_gap_s` (the instant between one
  request ending and its worker sending the next) do not break a span. Same idea as SGLang's
  benchmark/steady_state.py, which uses the run's peak in-flight instead of the target.
- sustained output tok/s: tokens whose chunk arrived inside the window / window length. Total adds the prompt
  tokens of requests whose first token arrived inside the window (their prefill finished there).
- 95% CI: intervals.sustained_interval: batch means that follow the closed loop's cycle (10 equal batches, phased
  thirds of 3-4 whole lifetimes, or whole lifetimes; t, inflated for their lag-1 correlation) and the counting
  resolution at the window's edges, in quadrature.
- whole-run: bench_serving's definition: completion tokens of successful requests / (last end - first send).
- peak: the best 1-second bucket of token arrivals since the first send (bench_serving's "peak output").
- latencies: over successful requests sent inside the window (all successful ones if none): TTFT, TPOT
  ((end - first) / (tokens - 1)), ITL (each chunk gap split evenly over its tokens), E2E.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..environment.gpu import summarize as gpu_summary
from ..environment.host import disturbance
from ..records import ClientSample, GpuSample, HostSample, LevelResult, RequestRecord, ServerSample, Summary
from .intervals import regime_shift, sustained_interval
from .server_view import server_view
from .validity import MeasurementPolicy, judge
from .workload_metrics import acceptance, by_turn, open_loop, prefix_cache, trace_sends


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


def steady_state_window(records: list[RequestRecord], concurrency: int, ratio: float, max_gap_s: float,
                        not_before: float, now: float, steps: tuple[np.ndarray, np.ndarray] | None = None
                        ) -> tuple[float, float] | None:
    """`steps`: inflight_steps(records, now), where the caller has them."""
    times, count = steps if steps is not None else inflight_steps(records, now)
    if times.size == 0:
        return None
    threshold = max(1, math.ceil(ratio * concurrency))
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


def first_generation(records: list[RequestRecord]) -> int | None:
    """How many requests the server was serving when the first one finished: those with a first token before it. A
    closed loop's running batch at its start, counted, not estimated (`running` from Little's law overshot a running
    limit of 1,024 by 2%, and the warm-up then waited for the 1,047th completion: a second generation)."""
    ends = [r.end_time for r in records if r.ok]
    if not ends:
        return None
    first_end = min(ends)
    return sum(1 for r in records if r.first_token_time is not None and r.first_token_time < first_end) or None


def service_lifetime(ok: list[RequestRecord], e2e: float | None) -> float | None:
    """How long a request is served: its median decode (first token to end) plus its prefill (the fastest time to
    first token). Past the server's running limit a request's end-to-end lifetime also holds its wait for a slot,
    but the running batch turns over once per service lifetime: that is the closed loop's cycle a window must hold,
    and the generation a warm-up must see finish. Never longer than the end-to-end median `e2e`."""
    served = [r for r in ok if r.first_token_time is not None]
    if e2e is None or len(served) < len(ok) / 2:
        return e2e
    prefill = min(r.first_token_time - r.send_time for r in served)
    return min(e2e, float(np.median([r.end_time - r.first_token_time for r in served])) + max(prefill, 0.0))


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
    ttft, tpot, e2e, times, counts, firsts, server_ttft = [], [], [], [], [], [], []
    for r in records:
        first = r.first_token_time
        if first is None:
            continue
        ttft.append((first - r.send_time) * 1e3)
        if r.server_ttft_s is not None:
            server_ttft.append(r.server_ttft_s * 1e3)
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
    return {"ttft_ms": ttft, "tpot_ms": tpot, "itl_ms": itl, "e2e_ms": e2e, "server_ttft_ms": server_ttft}


def latency_summaries(records: list[RequestRecord]) -> dict[str, Summary]:
    return {k: summarize(v) for k, v in latency_values(records).items()}


@dataclass
class ClientHealth:
    """The client's event loop inside the window, of its worst process where the streams are sharded over several
    (one saturated process is enough to bend what it measures)."""

    lag_p99_ms: float | None = None
    lag_mean_ms: float | None = None
    cpu: float | None = None  # CPU share of one core
    # the longest the loop was late: one block of the loop (a long pause of the process) hides in the p99 of a 50-ms
    # ticker, and the tokens that arrived meanwhile are read after it
    lag_max_ms: float | None = None


def client_health(samples: list[ClientSample], window: tuple[float, float] | None) -> ClientHealth:
    if not samples or window is None:
        return ClientHealth()
    s, e = window
    lags, means, cpus, worst = [], [], [], []
    for w in sorted({x.worker for x in samples}):
        inside = [x for x in samples if x.worker == w and s <= x.time <= e]
        if len(inside) >= 2:
            lag = np.array([x.loop_lag_s for x in inside]) * 1e3
            lags.append(float(np.percentile(lag, 99)))
            means.append(float(lag.mean()))
            worst.append(float(lag.max()))
            cpus.append((inside[-1].cpu_s - inside[0].cpu_s) / (inside[-1].time - inside[0].time))
    if not lags:
        return ClientHealth()
    return ClientHealth(max(lags), max(means), float(max(cpus)), max(worst))


def late_share(lag_mean_ms: float | None, *, e2e_ms: float | None, concurrency: int | None,
               rate: float | None) -> float | None:
    """The share of the offered load the client's loop lag held back. Closed loop: a stream waits about one lag to
    see its request end and one more to send the next, so each cycle of E2E loses 2 x the mean lag. Open loop: each
    arrival is scheduled from the last one's late wake, so the schedule slips by the mean lag per arrival."""
    if lag_mean_ms is None:
        return None
    lag = lag_mean_ms / 1e3
    if concurrency is not None:
        return 2 * lag / (e2e_ms / 1e3 + 2 * lag) if e2e_ms else None
    return lag * rate / (1 + lag * rate) if rate else None


@dataclass(frozen=True)
class LevelSamples:
    """What was sampled beside the requests during a level: the server's view, the client's own health, the host
    and the GPUs."""

    server: Sequence[ServerSample] = ()
    client: Sequence[ClientSample] = ()
    host: Sequence[HostSample] = ()
    gpu: Sequence[GpuSample] = ()


@dataclass(frozen=True)
class LevelEnd:
    """How the level runner ended the level. `window_cap`: when load stopped (the drain after it only completes
    records and the whole-run number); `window` and `lifetime_s`: the window and CI batch length the stop decision
    judged, reproduced exactly; `stopped_because`: a systematic failure, in the server's words; `incomplete` with
    `note`: the level was cut short (the server died or stalled, an interrupt)."""

    window_cap: float | None = None
    window: tuple[float, float] | None = None
    lifetime_s: float | None = None
    stopped_because: str | None = None
    incomplete: bool = False
    note: str | None = None


@dataclass
class LevelStats:
    """A level's numbers before any rule judges them (validity.judge)."""

    concurrency: int | None
    now: float
    done: list[RequestRecord]
    ok: list[RequestRecord]
    errors: Counter
    lifetime: float | None
    w_end: float | None
    window: tuple[float, float] | None = None
    sustained: float | None = None
    half: float | None = None
    k: int = 0
    ar1: float | None = None
    resolution: float | None = None
    total: float | None = None
    completed_in_window: int = 0
    completed: CompletionCount | None = None  # completion_count
    shift: str | None = None
    latency: dict = field(default_factory=dict)
    lag: float | None = None
    lag_mean: float | None = None
    lag_max: float | None = None
    late: float | None = None  # late_share
    cpu: float | None = None
    host_numbers: dict = field(default_factory=dict)
    host_disturbed: list = field(default_factory=list)
    gpu_numbers: dict = field(default_factory=dict)
    gpu_disturbed: list = field(default_factory=list)
    server: dict = field(default_factory=dict)
    behind: float | None = None
    sends: dict = field(default_factory=dict)  # a trace replay's send timing (workload_metrics.trace_sends)


def level_stats(records: list[RequestRecord], *, concurrency: int | None, rate: float | None, policy,
                now: float | None, samples: LevelSamples, end: LevelEnd, latencies: bool,
                arrivals: tuple[np.ndarray, np.ndarray]) -> LevelStats:
    now = now if now is not None else max((r.end_time for r in records), default=0.0)
    done = [r for r in records if not r.cancelled]
    ok = [r for r in done if r.ok]
    e2e = float(np.median([r.end_time - r.send_time for r in ok])) if ok else None
    lifetime = end.lifetime_s if end.lifetime_s is not None else service_lifetime(ok, e2e)
    in_flight = concurrency if concurrency is not None else max(1, round(rate * (e2e or 1.0))) if rate else 1
    running = max(1, round(in_flight * lifetime / e2e)) if lifetime and e2e else in_flight
    running = min(running, first_generation(records) or running)
    w_end = warmup_end(records, policy.warmup_completions if policy.warmup_completions is not None else running)
    st = LevelStats(concurrency, now, done, ok, Counter(r.error for r in done if r.error), lifetime, w_end,
                    window=end.window)
    steps = inflight_steps(records, now)
    if st.window is None and w_end is not None:
        search_end = min(now, end.window_cap) if end.window_cap is not None else now
        # an open loop's lulls (nothing in flight between arrivals: a trace's quiet spells, a low Poisson rate) are
        # its traffic, not a break in it: its window runs from the warm-up to where load stopped
        st.window = steady_state_window(records, in_flight, policy.steady_state_ratio if concurrency else 0.0,
                                        policy.max_gap_s if concurrency else math.inf, w_end, search_end,
                                        steps if search_end == now else None)
    lat_records = ok
    if st.window is not None:
        s, e = st.window
        times, tokens = arrivals
        iv = sustained_interval(times, tokens, st.window, policy.batches, lifetime)
        st.sustained, st.half, st.k, st.ar1, st.resolution = iv.rate, iv.half, iv.batches, iv.ar1, iv.resolution
        prefilled = sum(r.prompt_tokens for r in records
                        if r.error is None and (first := r.first_token_time) is not None and s <= first < e)
        st.total = st.sustained + prefilled / (e - s)
        st.completed_in_window = sum(1 for r in ok if s <= r.end_time < e)
        lat_records = [r for r in ok if s <= r.send_time < e] or ok
        # named in the final result only: the checks in the middle of a level decide from the interval alone
        fine = min(30, int((e - s) // lifetime)) if lifetime else 0  # batches of at least one lifetime
        st.shift = regime_shift(times, tokens, st.window, fine) if st.half is not None and latencies else None
    st.latency = (latency_summaries(lat_records) if latencies else
                  {"ttft_ms": summarize([]), "tpot_ms": summarize([]), "itl_ms": summarize([]),
                   "server_ttft_ms": summarize([]),
                   "e2e_ms": summarize([(r.end_time - r.send_time) * 1e3 for r in lat_records])})
    health = client_health(list(samples.client), st.window)
    st.lag, st.lag_mean, st.cpu, st.lag_max = health.lag_p99_ms, health.lag_mean_ms, health.cpu, health.lag_max_ms
    st.late = late_share(st.lag_mean, e2e_ms=st.latency["e2e_ms"].median, concurrency=concurrency, rate=rate)
    st.host_numbers, st.host_disturbed = disturbance(list(samples.host), st.window,
                                                     max_steal_share=policy.max_steal_share)
    st.gpu_numbers, st.gpu_disturbed = gpu_summary(list(samples.gpu), st.window)
    st.server = server_view(list(samples.server), st.window)
    st.completed = completion_count(ok, list(samples.server), st.window, st.lag)
    st.behind = st.server.pop("sim_behind_share", None)
    st.sends = trace_sends(records, st.window)
    return st


def completion_tokens(r: RequestRecord) -> int:
    """A finished request's output tokens: the server's own count where it gave one, else the client's."""
    return r.server_completion_tokens if r.server_completion_tokens is not None else r.output_tokens


def whole_run(ok: list[RequestRecord], done: list[RequestRecord]) -> tuple[float | None, float | None]:
    """bench_serving's whole-run output and total tok/s: completion tokens of successful requests over first send
    to last end."""
    if not ok:
        return None, None
    dur = max(r.end_time for r in ok) - min(r.send_time for r in done or ok)
    if dur <= 0:
        return None, None
    out = sum(completion_tokens(r) for r in ok)
    return out / dur, (out + sum(r.prompt_tokens for r in ok)) / dur


@dataclass
class CompletionCount:
    """A counter that moves when a request finishes, against the requests the client saw finish, between the two
    scrapes that bound the window (no interpolation of a step function): tok/s of each, and the share of the
    client's tokens whose requests finished within those scrapes' own timing or the way out after them (either side
    may have counted them)."""

    client_tps: float
    server_tps: float
    edge_share: float


def delivery_s(ok: list[RequestRecord]) -> float:
    """How long a token may take from the server to the client, measured: the p99 of each request's client TTFT
    less the server's own (SGLang's meta_info), which holds the request's way in and its first chunk's way out;
    0 where the server gives no TTFT of its own."""
    gaps = [r.first_token_time - r.send_time - r.server_ttft_s for r in ok
            if r.server_ttft_s is not None and r.first_token_time is not None]
    return max(0.0, float(np.percentile(gaps, 99))) if gaps else 0.0


def quiet_bounds(inside: list[ServerSample], ends: list[float], late: float) -> tuple[ServerSample, ServerSample]:
    """The two scrapes that bound a completion count: of the window's first and last thirds of scrapes, the one
    whose next request end the client saw lies farthest after it. A request the server counted before a scrape
    reaches the client up to `late` s later (its round trip, the client's lag, the way out), so only ends just after
    a scrape can sit on the wrong side of it. A closed loop's requests finish in cohorts (docs/measurement.md, "A
    cohort on the wrong side of a scrape"): a scrape just before a cohort's end is the one to avoid."""
    third = max(1, len(inside) // 3)
    after = np.sort(np.asarray(ends, dtype=float))

    def room(x: ServerSample) -> float:
        i = int(np.searchsorted(after, x.time - late, side="right"))  # ends within `late` before it count as after
        return float(after[i] - x.time) if i < len(after) else np.inf

    a = max(inside[:third], key=lambda x: (round(room(x), 3), -x.time))
    b = max(inside[-third:], key=lambda x: (round(room(x), 3), x.time))
    return (a, b) if b.time > a.time else (inside[0], inside[-1])


def completion_count(ok: list[RequestRecord], samples: list[ServerSample], window: tuple[float, float] | None,
                     lag_p99_ms: float | None) -> CompletionCount | None:
    if window is None:
        return None
    inside = [x for x in samples if window[0] <= x.time <= window[1] and x.output_tokens_total is not None]
    if len(inside) < 2 or inside[-1].time <= inside[0].time:
        return None
    lag, way = 2 * (lag_p99_ms or 0.0) / 1e3, delivery_s(ok)
    done = [(r.end_time, completion_tokens(r)) for r in ok]
    a, b = quiet_bounds(inside, [t for t, _ in done], max(x.time_uncertainty_s for x in inside) + lag)
    client = sum(n for t, n in done if a.time < t <= b.time)
    # either side may have counted a request that ended within a scrape's timing, or that the server counted before
    # it and the client saw after (up to the way out later)
    near = sum(n for t, n in done if any(-(x.time_uncertainty_s + lag) <= t - x.time <= x.time_uncertainty_s + lag + way
                                         for x in (a, b)))
    span = b.time - a.time
    server = float(b.output_tokens_total) - float(a.output_tokens_total)  # type: ignore[arg-type]
    if client <= 0 or server <= 0:
        return None
    return CompletionCount(client / span, server / span, near / client)


def completed_fields(c: CompletionCount | None) -> dict:
    """LevelResult's fields of a completion count (none where there was none)."""
    return dict(client_completed_output_tps=c.client_tps, server_completed_output_tps=c.server_tps,
                client_completed_edge_share=c.edge_share) if c else {}


def server_ratio(st: LevelStats) -> float | None:
    """The client's count over the server's, over one window. A counter that moves per token is compared with the
    tokens the client saw arrive; one that moves when a request finishes (SGLang while it drafts, llama.cpp) with the
    tokens of the requests that finished between the scrapes that bound the window, so the requests in flight at
    its edges are no uncertainty (their allowance had let an 8% over-count pass: docs/measurement.md, "Round 5")."""
    if st.server.get("server_count_at_completion") and st.completed is not None:
        return st.completed.client_tps / st.completed.server_tps
    server = st.server.get("server_output_tps")
    return st.sustained / server if st.sustained and server else None


def level_result(records: list[RequestRecord], *, concurrency: int | None, rate: float | None, isl: int, osl: int,
                 policy: MeasurementPolicy, now: float | None = None, samples: LevelSamples = LevelSamples(),
                 end: LevelEnd = LevelEnd(), prompt_check: str = "exact", latencies: bool = True,
                 arrivals: tuple[np.ndarray, np.ndarray] | None = None,
                 cache_allowed: float | None = None) -> LevelResult:
    """The level's numbers and its validity. `prompt_check`: "exact" (the server must count ISL prompt tokens) or
    "chat" (ISL plus one constant chat-template overhead). `latencies=False`: TTFT, TPOT and ITL are left empty
    (E2E is kept): a check in the middle of a level needs only the throughput. `arrivals`: token_arrivals(records),
    where the caller keeps them (ArrivalLog). `cache_allowed`: the share of prompt tokens a shared-prefix workload
    lets a prefix cache serve (None: a workload that shares nothing)."""
    times, tokens = arrivals if arrivals is not None else token_arrivals(records)
    st = level_stats(records, concurrency=concurrency, rate=rate, policy=policy, now=now, samples=samples, end=end,
                     latencies=latencies, arrivals=(times, tokens))
    v = judge(st, policy, isl=isl, prompt_check=prompt_check, stopped_because=end.stopped_because,
              incomplete=end.incomplete, note=end.note)
    whole_out, whole_total = whole_run(st.ok, st.done)
    good_rps, good_tps, good_share = goodput(records, st.window, policy)
    sv, w = st.server, st.window
    t0 = min((r.send_time for r in records), default=0.0)
    return LevelResult(
        concurrency=concurrency, rate=rate, isl=isl, osl=osl, valid=not v.reasons, invalid_reasons=v.reasons,
        sustained_output_tps=st.sustained, sustained_output_tps_ci95=st.half, sustained_total_tps=st.total,
        whole_run_output_tps=whole_out, whole_run_total_tps=whole_total,
        peak_output_tps=peak_bucket(times, tokens, t0),
        achieved_concurrency=time_average_inflight(records, w, st.now) if w else None,
        server_ratio=server_ratio(st),
        **completed_fields(st.completed),
        **sv, **st.latency, errors=dict(st.errors),
        window_start=w[0] if w else None, window_end=w[1] if w else None, window_s=(w[1] - w[0]) if w else 0.0,
        ci_batches=st.k, ci_ar1=st.ar1, ci_resolution_tps=st.resolution, lifetime_s=st.lifetime, completed=len(st.ok),
        completed_in_window=st.completed_in_window,
        requests_sent=len(records), cancelled=sum(1 for r in records if r.cancelled),
        duration_s=(st.now - t0) if records else 0.0, client_lag_p99_ms=st.lag, client_cpu_share=st.cpu,
        client_lag_mean_ms=st.lag_mean, client_late_share=st.late, client_lag_max_ms=st.lag_max,
        incomplete=end.incomplete, note=end.note, warnings=v.warnings, host=st.host_numbers, sim_behind_share=st.behind,
        disturbances=v.disturbances, gpu=st.gpu_numbers, goodput_rps=good_rps, goodput_tps=good_tps,
        slo_met_share=good_share,
        count_source=Counter(r.count_source for r in st.ok).most_common(1)[0][0] if st.ok else None,
        **acceptance(st.ok, w, samples.server),
        **prefix_cache(st.ok, w, samples.server, cache_allowed),
        **open_loop(records, rate, sv.get("server_mean_queued")),
        by_turn=by_turn(st.ok, w),
        **st.sends,
    )
