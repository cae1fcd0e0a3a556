"""Small immutable records that cross module boundaries (client -> metrics -> verdict -> reports).

Times are seconds on one clock per run (the client's monotonic clock).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import Callable

SCHEMA_VERSION = 1

class Rate(int):
    """An open-loop level: the requests per second offered (Poisson arrivals), where a plain int level is a
    concurrency (a closed loop). An int, so runs, baselines and history key both kinds of level alike; a profile's
    ladder is all of one kind (`rates` or `levels`), and `level_name` tells them apart in every message."""


def start_allowed(done: int, max_starts: int) -> bool:
    """Whether a level measured on `done` server starts may take one more: the profile's `[measurement] max_starts`
    counts them all, the first included. The one check of that limit, live (run/session), replayed (decide/replay)
    and in the floor's rule (judge/starts)."""
    return done < max_starts


def level_name(level) -> str:
    """How messages name a level: c32 for a concurrency, r40 for an offered rate."""
    return f"r{int(level)}" if isinstance(level, Rate) else f"c{level}"


def load_name(concurrency: int | None, rate: float | None) -> str:
    """A measured level's name from its load: c32 (closed loop), r2.5 (open loop, bench's rates may be fractions)."""
    return f"c{concurrency}" if concurrency is not None else f"r{rate:g}"


# Error kinds a request can end with. Anything here is an error, never a success.
ERROR_KINDS = (
    "http_status",  # non-200 answer
    "stream_error",  # an error object inside an HTTP-200 stream
    "abort",  # finish_reason abort (SGLang's scheduler aborts arrive this way in stream mode)
    "no_finish",  # the stream ended without a finish reason
    "short_output",  # fewer tokens than asked (with ignore_eos)
    "long_output",  # more tokens than asked
    "bad_chunk",  # a chunk that is not the JSON the API defines
    "bad_stream",  # an HTTP-200 answer that is not an SSE stream
    "timeout",  # the request exceeded its own timeout
    "connection",  # connection refused / reset / closed mid-stream
    "open_files",  # the client process could not open a socket: out of file descriptors (ulimit -n)
)


@dataclass(frozen=True)
class CanaryOutput:
    """One greedy canary request and what came back: the ids where the wire gives them, the text where it does."""

    prompt_ids: tuple[int, ...] | None
    prompt_text: str | None
    output_ids: tuple[int, ...] | None
    text: str | None
    seconds: float


OUTPUT_SAMPLE_EVERY = 8  # one request in 8 keeps its output ids: a few per level at any concurrency


@dataclass(frozen=True)
class RequestRecord:
    index: int
    send_time: float
    end_time: float
    prompt_tokens: int  # sent
    max_tokens: int  # asked
    chunk_times: tuple[float, ...] = ()
    chunk_tokens: tuple[int, ...] = ()  # tokens each chunk added
    server_prompt_tokens: int | None = None
    server_completion_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None  # one of ERROR_KINDS
    error_detail: str | None = None
    http_status: int | None = None
    cancelled: bool = False  # ended by the client at the end of a level (not an error, not a completion)
    count_source: str = "chunks"  # output tokens from: "usage" (the server's), "chunks", "retokenized"
    server_ttft_s: float | None = None  # the server's own TTFT for this request, where it says (SGLang meta_info)
    # the output ids of a sampled request (every OUTPUT_SAMPLE_EVERY-th, where the wire's last chunk carries them):
    # checked as the canary's are, so output that goes wrong under load is seen (run/session)
    output_ids: tuple[int, ...] | None = None
    # speculative decoding, from the final meta_info (SGLang): verify steps, and tokens accepted per verify step
    spec_verify_ct: int | None = None
    spec_accept_length: float | None = None
    # prompt tokens the server served from its prefix cache (SGLang's meta_info cached_tokens, OpenAI's
    # usage.prompt_tokens_details.cached_tokens, llama.cpp's tokens_cached)
    server_cached_tokens: int | None = None
    # numbers the server reported that no request can have (cached tokens past the prompt, a verify count of 0 for
    # tokens produced, an acceptance length below 1), as it sent them: the level is invalid (measure/validity.py)
    impossible: tuple[str, ...] = ()
    # a conversation's turn (0: its first request; None outside a multi-turn workload), and the tokens of its prompt
    # that earlier requests sent or received (a conversation's history, a trace's shared blocks): what a prefix cache
    # may serve (None where the workload does not say per request)
    turn: int | None = None
    history_tokens: int | None = None
    # a trace replay's request: when the trace meant it sent, on the client's clock (None outside a trace)
    due_time: float | None = None

    @property
    def first_token_time(self) -> float | None:
        for t, n in zip(self.chunk_times, self.chunk_tokens):
            if n > 0:
                return t
        return None

    @property
    def output_tokens(self) -> int:
        return sum(self.chunk_tokens)

    @property
    def ok(self) -> bool:
        return self.error is None and not self.cancelled


@dataclass(frozen=True)
class ServerSample:
    """One scrape of the server's own view; None where the server does not expose it."""

    time: float
    decode_tokens_total: float | None = None  # sglang:realtime_tokens_total{mode="decode"}
    first_tokens_total: float | None = None  # sglang:time_to_first_token_seconds_count
    output_tokens_total: float | None = None  # engines that count every output token (llamacpp:tokens_predicted_total)
    running: float | None = None
    queued: float | None = None
    token_usage: float | None = None
    used_tokens: float | None = None
    max_total_tokens: float | None = None
    retracted_total: float | None = None
    gen_throughput: float | None = None
    sim_engine_s_total: float | None = None  # the simulator: real seconds its engine steps took
    sim_behind_s_total: float | None = None  # ... and how late its loop ran (the host could not keep up)
    # Engines that count busy slots at every decode step (llama.cpp: n_decode_total and n_busy_slots_per_decode):
    # their difference between two scrapes is the mean running count over that interval, counted by the engine at
    # every step; a snapshot gauge is only what one moment shows (docs/measurement.md).
    decode_steps_total: float | None = None
    busy_slot_steps_total: float | None = None
    spec_accept_length: float | None = None  # speculative decoding: the server's mean accepted tokens per verify step
    spec_accepted_total: float | None = None  # ... or its count of accepted draft tokens (llama.cpp), a counter
    cache_hit_rate: float | None = None  # the prefix cache's hit rate as the server reports it (sglang:cache_hit_rate)
    # The server read its counters somewhere between the scrape's send and its answer: `time` is the midpoint, this
    # is half the round trip. It bounds how well a counter is known at a window edge (measure/server_view.py).
    time_uncertainty_s: float = 0.0
    # lines of the page the Prometheus parser refused, dropped while the page's other samples were read (one bad
    # sample used to cost the whole page, and the count check with it), and the first of them as the server wrote it
    unparsed_lines: int = 0
    unparsed_example: str | None = None


@dataclass(frozen=True)
class ClientSample:
    time: float
    cpu_s: float  # this process's CPU time so far
    loop_lag_s: float  # how late the event loop woke the monitor's 50 ms ticker (client.ClientMonitor)
    worker: int = 0  # which client process (--client-procs): lag and CPU are judged per process


@dataclass(frozen=True)
class HostSample:
    """Cumulative CPU seconds at `time`: the whole host busy (all cores, idle and steal excluded), this client
    process (with its children), the server's process tree; steal; the 1-minute load average; and memory pressure
    (stall time, available memory, swap-ins) where the kernel reports it."""

    time: float
    busy_s: float
    client_s: float
    server_s: float
    steal_s: float
    load1: float
    mem_stall_s: float | None = None  # /proc/pressure/memory "some" total: time any task waited for memory
    mem_available_mb: float | None = None
    swap_in_mb: float | None = None  # cumulative MB swapped in


@dataclass(frozen=True)
class GpuSample:
    """One GPU at `time` (gpu.GpuMonitor): clocks, power, temperature, the clock-event (throttle) reasons bitmask as
    NVML defines it, and compute processes on it that are neither the server's nor ours ("pid 454 python3 874 MiB");
    None where the driver does not say."""

    time: float
    index: int
    sm_mhz: float | None = None
    mem_mhz: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temp_c: float | None = None
    util_pct: float | None = None
    reasons: int | None = None
    foreign: tuple[str, ...] = ()


@dataclass(frozen=True)
class Summary:
    mean: float | None
    median: float | None
    p90: float | None
    p99: float | None
    n: int = 0


@dataclass(frozen=True)
class LevelResult:
    concurrency: int | None
    rate: float | None
    isl: int
    osl: int
    valid: bool
    invalid_reasons: tuple[str, ...]
    sustained_output_tps: float | None
    sustained_output_tps_ci95: float | None  # half-width
    sustained_total_tps: float | None
    whole_run_output_tps: float | None
    whole_run_total_tps: float | None
    peak_output_tps: float | None
    achieved_concurrency: float | None  # time-average in flight inside the window (client side)
    server_output_tps: float | None
    server_ratio: float | None  # the client's count / the server's over the same window (metrics.server_ratio)
    server_mean_running: float | None
    server_max_running: float | None
    server_mean_queued: float | None
    server_mean_token_usage: float | None
    server_retractions: float | None
    ttft_ms: Summary
    tpot_ms: Summary
    itl_ms: Summary
    e2e_ms: Summary
    errors: dict[str, int]
    window_start: float | None
    window_end: float | None
    window_s: float
    ci_batches: int
    lifetime_s: float | None  # median service lifetime (metrics.service_lifetime): windows are counted in it
    completed: int
    completed_in_window: int
    requests_sent: int
    cancelled: int
    duration_s: float
    client_lag_p99_ms: float | None
    client_cpu_share: float | None
    incomplete: bool = False  # the level was interrupted (server died, stall, user interrupt)
    note: str | None = None
    warnings: tuple[str, ...] = ()  # worth knowing, not invalidating (e.g. latency percentiles blurred)
    connection_retries: int = 0  # reused keep-alive connections the server had closed: retried, not errors
    client_procs: int = 1  # client processes the level's streams were sharded over (--client-procs)
    count_source: str | None = None  # where output token counts came from: usage, chunks or retokenized
    host: dict = dataclasses.field(default_factory=dict)  # other processes' and steal cores in the window (host.py)
    sim_behind_share: float | None = None  # the simulator's lateness / its engine time in the window
    # the server's count came from a counter that moves when a request finishes (llama.cpp's, or SGLang's while it
    # drafts: measure/server_view.server_view), not per token; None where there was no count
    server_count_at_completion: bool | None = None
    # a counter that moves at completion against the requests that finished, between the scrapes that bound the
    # window (measure/metrics.completion_count): each side's tok/s and the share of the client's tokens finished
    # within those scrapes' timing (the count's allowance); None where not measured, and in older files
    client_completed_output_tps: float | None = None
    server_completed_output_tps: float | None = None
    client_completed_edge_share: float | None = None
    # the host's CPU speed probe taken just before a GPU server's level (environment/host_speed.py; None: not probed:
    # the simulator, a server on another host, a CPU server, judged by the probes before its starts)
    host_cpu_speed: float | None = None
    # What took the host during the window. A disturbance can only lower throughput: a level that passes its floor
    # passed; one that falls below it (or cannot decide) is INVALID naming these, never a regression.
    disturbances: tuple[str, ...] = ()
    gpu: dict = dataclasses.field(default_factory=dict)  # per GPU index: clocks, power, reasons' shares (gpu.py)
    # Xid events, uncorrected ECC errors, retired pages, a lost GPU during the level (gpu_faults.py): each one is
    # also an invalid reason
    gpu_faults: tuple[str, ...] = ()
    # requests/s and output tok/s of requests sent in the window that met the profile's SLO, and their share
    goodput_rps: float | None = None
    goodput_tps: float | None = None
    slo_met_share: float | None = None
    # how far in time the server's counters are uncertain at the window's two edges together (scrape round trips):
    # the client-vs-server comparison allows this share of the window on top of the profile's agreement
    server_edges_uncertainty_s: float | None = None
    # how well the server's own view is known: scrapes that answered inside the window, scrapes that failed during
    # the level and the last failure's words (a gauge read from two samples is not a level's maximum)
    server_samples_in_window: int | None = None
    scrape_errors: int = 0
    scrape_last_error: str | None = None
    # what server_mean_running / server_max_running were read from: "per decode step" (counters) or "snapshots"
    server_running_source: str | None = None
    # the interval's parts (measure/intervals.py): the batch rates' lag-1 correlation it was inflated for, and the
    # counting resolution (tok/s) it never goes below
    ci_ar1: float | None = None
    ci_resolution_tps: float | None = None
    # TTFT as the server reports it per request (SGLang's meta_info first_token_latency), where it does
    server_ttft_ms: Summary = dataclasses.field(default_factory=lambda: Summary(None, None, None, None, 0))
    # speculative decoding: the mean tokens a verify step accepted, over the requests that finished in the window
    # (from each one's final meta_info, weighed by its verify steps), its 95% interval, and the server's own gauge
    # over the window; None for a server that does not speculate
    acceptance_length: float | None = None
    acceptance_length_ci95: float | None = None
    server_accept_length: float | None = None
    # an open-loop level: the rate offered, the rate the client sent inside the window (its schedule kept) and the
    # rate of requests completed there; `saturation` says where the server fell behind the offered rate (None: kept)
    offered_rps: float | None = None
    sent_rps: float | None = None
    achieved_rps: float | None = None
    saturation: str | None = None
    # a shared-prefix workload: the share of the window's prompt tokens the server served from its prefix cache
    # (each request's cached_tokens), its 95% interval, the share the workload allows (its shared prefix over the
    # prompt), and the server's own hit rate over the window; None where the workload shares nothing
    prefix_cache_share: float | None = None
    prefix_cache_share_ci95: float | None = None
    prefix_cache_allowed: float | None = None
    # a conversation workload by turn depth (measure/workload_metrics.by_turn): {turn: {requests, prompt_tokens,
    # ttft_p50_ms, ttft_p90_ms, tpot_p50_ms, cache_share, cache_allowed}}
    by_turn: dict[str, dict[str, float | None]] | None = None
    # a trace replay (measure/workload_metrics.trace_sends): how late the window's requests were sent against their
    # (sped-up) timestamps, p50 and p99 ms, and the trace's median gap between requests at that speed
    send_late_p50_ms: float | None = None
    send_late_p99_ms: float | None = None
    trace_gap_p50_ms: float | None = None
    server_cache_hit_rate: float | None = None
    # the client's event-loop lag, mean, and the share of the offered load it held back (metrics.late_share)
    client_lag_mean_ms: float | None = None
    client_late_share: float | None = None
    # the longest the client's event loop was late in the window: a block of the process (its tokens are read late)
    client_lag_max_ms: float | None = None

    @property
    def name(self) -> str:
        """c32 for a closed-loop level, r40 for an open-loop one."""
        return load_name(self.concurrency, self.rate)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Ceiling:
    """Where throughput must plateau: the KV pool's and the admission cap's ceilings in requests, and which binds."""

    kv: int  # requests the KV pool holds at once (page-rounded)
    cap: int | None  # effective --max-running-requests
    effective: int
    binding: str  # "kv" | "cap"
    tokens_per_request: int
    basis: str | None = None  # where tokens_per_request came from, where it is not every request's (a length mix)


@dataclass(frozen=True)
class Shape:
    """The optional fields a request carries. Only what the server accepts is sent: where `ignore_eos` is not
    accepted, `min_tokens` = max_tokens stands in where it is, and otherwise a request that stops early is invalid
    (wrong length), never silently counted."""

    ignore_eos: bool = True
    min_tokens: bool = False
    include_usage: bool = True  # stream_options.include_usage (OpenAI)
    continuous_usage: bool = True  # stream_options.continuous_usage_stats: usage on every chunk (vLLM, SGLang)

    def without(self, **fields: bool) -> "Shape":
        return replace(self, **fields)


FULL = Shape()


@dataclass(frozen=True)
class Metric:
    """One number of a level: its name in baselines, history, drift and reports, its unit, which way is better,
    whether a baseline may gate it (a floor, or for lower-is-better a ceiling), and how it is read off a
    LevelResult. A latency metric also names the per-request series and statistic its interval comes from
    (judge/latency.py); `trend` is the key of its Allure trend, where it has one (report/allure.py)."""

    name: str
    title: str
    unit: str
    better: str  # "higher" | "lower"
    gated: bool
    read: Callable[["LevelResult"], float | None]
    series: str | None = None  # "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"
    stat: str | float | None = None  # "mean" or a quantile
    trend: str | None = None

    @property
    def is_latency(self) -> bool:
        return self.series is not None


def _latency(name: str, title: str, series: str, stat: str | float, trend: str | None = None) -> Metric:
    def read(r: LevelResult) -> float | None:
        s = getattr(r, series, None)
        if s is None:
            return None
        return s.mean if stat == "mean" else s.median if stat == 0.5 else s.p99

    return Metric(name, title, "ms", "lower", True, read, series, stat, trend)


METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("sustained_output_tps", "sustained output", "tok/s", "higher", True, lambda r: r.sustained_output_tps,
           trend="throughput"),
    Metric("sustained_total_tps", "sustained total (prompt + output)", "tok/s", "higher", True,
           lambda r: r.sustained_total_tps),
    Metric("whole_run_output_tps", "whole-run output (bench_serving's)", "tok/s", "higher", True,
           lambda r: r.whole_run_output_tps),
    Metric("whole_run_total_tps", "whole-run total (bench_serving's)", "tok/s", "higher", True,
           lambda r: r.whole_run_total_tps),
    Metric("peak_output_tps", "peak output (best 1-s bucket)", "tok/s", "higher", False, lambda r: r.peak_output_tps),
    _latency("ttft_mean_ms", "TTFT mean", "ttft_ms", "mean", "ttft_mean"),
    _latency("server_ttft_mean_ms", "TTFT mean, as the server counts it", "server_ttft_ms", "mean"),
    _latency("ttft_p50_ms", "TTFT p50", "ttft_ms", 0.5),
    _latency("ttft_p99_ms", "TTFT p99", "ttft_ms", 0.99, "ttft_p99"),
    _latency("tpot_p50_ms", "TPOT p50", "tpot_ms", 0.5),
    _latency("tpot_p99_ms", "TPOT p99", "tpot_ms", 0.99, "tpot_p99"),
    _latency("itl_p99_ms", "ITL p99", "itl_ms", 0.99),
    _latency("e2e_p50_ms", "E2E p50", "e2e_ms", 0.5),
    # speculative decoding: accepted tokens per verify step; gated like throughput (a floor), so a draft that got
    # worse is named apart from a verify step that got slower
    Metric("acceptance_length", "speculative acceptance length", "tokens/step", "higher", True,
           lambda r: r.acceptance_length, trend="acceptance"),
    # a shared-prefix workload: the share of prompt tokens served from the prefix cache; judged by its own claim
    # (decide/prefix.py), so a cache that stopped working is named apart from a slower engine
    Metric("prefix_cache_share", "prefix cache share of prompt tokens", "share", "higher", True,
           lambda r: r.prefix_cache_share, trend="prefix_cache"),
    # a trace replay: how late the client sent against the trace's times (kept and drawn, never gated: a late client
    # is a disturbance of the measurement, measure/validity.py, not the server's)
    Metric("send_late_p50_ms", "trace send lateness p50", "ms", "lower", False, lambda r: r.send_late_p50_ms),
    Metric("send_late_p99_ms", "trace send lateness p99", "ms", "lower", False, lambda r: r.send_late_p99_ms),
    Metric("goodput_tps", "goodput (output of requests that met the SLO)", "tok/s", "higher", False,
           lambda r: r.goodput_tps, trend="goodput_tps"),
    Metric("goodput_rps", "goodput (requests that met the SLO)", "req/s", "higher", False, lambda r: r.goodput_rps,
           trend="goodput_rps"),
)}
GATED = tuple(n for n, m in METRICS.items() if m.gated)  # what a baseline entry may hold
HALF_WIDTH = {"sustained_output_tps": "sustained_output_tps_ci95", "acceptance_length": "acceptance_length_ci95",
              "prefix_cache_share": "prefix_cache_share_ci95"}


def value_format(metric: str) -> str:
    """How a metric's values are written: ratios and tokens per step to 3 decimals, rates and times to 1."""
    m = METRICS.get(metric)
    return ",.3f" if m is not None and m.unit in ("share", "tokens/step") else ",.1f"


def half_width(r, metric: str) -> float | None:
    """A level's 95% interval half-width for `metric`, where it measured one (None: compared as a point)."""
    field = HALF_WIDTH.get(metric)
    return getattr(r, field) if field else None
LATENCY = tuple(n for n, m in METRICS.items() if m.is_latency)
