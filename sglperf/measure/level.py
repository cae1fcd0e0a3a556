"""One level of a sweep: drive load, sample the server and the client's own health, stop when the measurement
has converged (CI half-width <= target), the time is up, the server stalls or dies; then drain and compute.

Why adaptive: a fixed request count is too long for small levels and too short (wide CI) for large ones.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable

from .client import ClientMonitor, LoadGenerator, Target, Workload
from .metrics import ArrivalLog, MeasurementPolicy, level_result
from ..environment.gpu import GpuMonitor
from ..environment.host import HostMonitor
from ..records import ClientSample, GpuSample, HostSample, LevelResult, RequestRecord, ServerSample
from .scrape import Scraper
from .shards import ShardedLoad


@dataclass(frozen=True)
class LevelSpec:
    concurrency: int | None = None  # closed loop
    rate: float | None = None  # open loop (requests/s)
    burstiness: float = 1.0
    max_concurrency: int | None = None  # cap for the open loop
    max_seconds: float = 600.0
    min_seconds: float = 0.0
    stall_timeout_s: float = 60.0  # no token from any request for this long while requests are in flight
    drain_timeout_s: float | None = None  # default: 3 median request lifetimes + 10 s
    check_interval_s: float = 1.0
    scrape_interval_s: float = 0.5

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("a level has either a concurrency or a rate")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.rate is not None and self.rate <= 0:
            raise ValueError(f"rate must be > 0, got {self.rate}")

    @property
    def label(self) -> str:
        return f"c{self.concurrency}" if self.concurrency is not None else f"r{self.rate:g}"


@dataclass
class LevelMeasurement:
    result: LevelResult
    records: list[RequestRecord]
    server_samples: list[ServerSample]
    client_samples: list[ClientSample]
    scrape_source: str | None
    stop_reason: str
    extra: dict = field(default_factory=dict)
    host_samples: list[HostSample] = field(default_factory=list)
    gpu_samples: list[GpuSample] = field(default_factory=list)


# A check that costs less runs on the event loop: a stall shorter than the lag the level warns at (10 ms)
INLINE_CHECK_S = 0.005

# Fail fast: a server that refuses every request answers at once; measuring on would only pile up errors.
FAIL_FAST_MAX_N = 16  # the first N failures with one signature and no success stop the level
BURST_MIN = 20  # later in a level: more than half of the last max(20, 2C) requests failed
HINTS = (
    (("prompt must be a string", "valid string", "must be str"),
     "the server takes text prompts only: --prompt-format text --tokenizer PATH"),
    (("ignore_eos",), "the server refuses ignore_eos: --engine openai lets sglperf find out what it accepts"),
    (("continuous_usage_stats", "stream_options"), "the server refuses stream_options: --engine openai lets sglperf "
                                                   "find out what it accepts"),
    (("HTTP 401", "HTTP 403"), "is SGLPERF_API_KEY set, and right?"),
    (("HTTP 404",), "the server has no such endpoint: try --api openai or --prompt-format chat"),
    (("not an SSE stream",), "the server did not stream server-sent events: is this an OpenAI-compatible endpoint?"),
)


def _signature(r: RequestRecord) -> tuple:
    return (r.error, r.http_status, (r.error_detail or "")[:80])


def explain_failures(failed: list[RequestRecord]) -> str:
    """The most common failure in the server's own words, how often, and a hint where one is known."""
    sig, n = Counter(_signature(r) for r in failed).most_common(1)[0]
    detail = next(r.error_detail for r in failed if _signature(r) == sig) or sig[0]
    hint = next((h for keys, h in HINTS if any(k in detail for k in keys)), None)
    return f"{detail} ({n} of {len(failed)} failed requests)" + (f"; hint: {hint}" if hint else "")


def systematic_failure(records: list[RequestRecord], concurrency: int | None) -> str | None:
    """Why to stop the level now, or None: no request has succeeded and the whole first generation (or the first
    N with one signature) failed; or, later, more than half of the recent requests failed."""
    failed = [r for r in records if r.error]
    if not failed:
        return None
    c = max(concurrency or 1, 3)
    if len(failed) == len(records):
        n = min(c, FAIL_FAST_MAX_N)
        if len(failed) >= c or (len(failed) >= n and len({_signature(r) for r in failed[:n]}) == 1):
            return "stopped early: every request failed: " + explain_failures(failed)
        return None
    recent = records[-max(BURST_MIN, 2 * c):]
    bad = [r for r in recent if r.error]
    if len(recent) >= BURST_MIN and 2 * len(bad) > len(recent):
        return f"stopped early: {len(bad)} of the last {len(recent)} requests failed: " + explain_failures(bad)
    return None


def scrape_warning(scraper: Scraper, r: LevelResult) -> str:
    """The server's view was read less often than asked: say how much of it there is, and the server's words."""
    return (f"{scraper.errors} scrapes of the server's metrics failed during the level ({r.server_samples_in_window} "
            f"answered inside the window); last: {scraper.last_error}")


async def measure_level(target: Target, workload: Workload, spec: LevelSpec, policy: MeasurementPolicy, *,
                        engine, stream_id: int = 0, request_timeout: float = 3600.0,
                        server_check: Callable[[], str | None] | None = None,
                        server_pids: Callable[[], list[int]] | None = None,
                        gpus: list[int] | None = None,
                        decided: Callable[[LevelResult], bool] | None = None, client_procs: int = 1,
                        progress: Callable[[dict], None] | None = None,
                        clock: Callable[[], float] = time.monotonic) -> LevelMeasurement:
    """Drive one level. It stops when its interval is precise enough (policy.ci_target) or, sooner, when
    `decided` says the interval already decides what it feeds (a floor), once the CI is trustworthy: at least
    policy.converge_batches batches over policy.converge_window_s of steady state. `gpus`: the server's GPU
    indices on this host, whose telemetry is sampled (None: none). `client_procs` > 1 shards a closed loop's streams
    over that many client processes (sglperf.shards); an open loop runs in this one."""
    stop_load, stop_aux = asyncio.Event(), asyncio.Event()
    scraper = Scraper(target.url, engine, interval=spec.scrape_interval_s, api_key=target.api_key, clock=clock)
    monitor = ClientMonitor(clock)
    client_pids: list[int] = []  # the client's worker processes: their CPU is the client's, not a neighbour's
    host = HostMonitor(clock, server_pids, client_pids=lambda: client_pids)
    gpu = GpuMonitor(clock, gpus, server_pids)
    aux = [asyncio.create_task(scraper.run(stop_aux)), asyncio.create_task(monitor.run(stop_aux)),
           asyncio.create_task(host.run(stop_aux))] + ([asyncio.create_task(gpu.run(stop_aux))] if gpus else [])
    incomplete, note, reason = False, None, "max_seconds"
    sharded = client_procs > 1 and spec.concurrency is not None and spec.concurrency > 1
    generator = (ShardedLoad(target, workload, spec.concurrency, client_procs, stream_id=stream_id,
                             request_timeout=request_timeout) if sharded else
                 LoadGenerator(target, workload, stream_id=stream_id, request_timeout=request_timeout, clock=clock))
    async with generator as gen:
        if sharded:
            client_pids.extend(gen.pids)
        samples = (lambda: gen.samples) if sharded else (lambda: monitor.samples)  # the streaming processes'
        t0 = clock()
        if spec.concurrency is not None:
            load = asyncio.create_task(gen.closed_loop(spec.concurrency, stop_load))
        else:
            load = asyncio.create_task(gen.open_loop(spec.rate, stop_load, burstiness=spec.burstiness,
                                                     max_concurrency=spec.max_concurrency, seed=workload.seed))
        last_tokens, last_t = 0, t0
        arrivals = ArrivalLog()

        check_cpu_s = 0.0  # what the last check cost

        def check(snap: list[RequestRecord], finished: int, now: float) -> tuple[LevelResult, float]:
            """The level as it stands, and the tokens streamed so far (by requests that did not fail)."""
            nonlocal check_cpu_s
            started = time.thread_time()
            times, tokens = arrivals.arrivals(snap, finished)
            res = level_result(snap, target=spec.concurrency, rate=spec.rate, isl=workload.isl, osl=workload.osl,
                               policy=policy, now=now, server_samples=list(scraper.samples),
                               client_samples=list(samples()), host_samples=list(host.samples),
                               gpu_samples=list(gpu.samples), latencies=False, arrivals=(times, tokens))
            check_cpu_s = time.thread_time() - started
            return res, float(tokens.sum())

        decision, failing, next_check = None, None, t0 + spec.check_interval_s
        try:
            while True:
                await asyncio.sleep(min(0.25, spec.check_interval_s))  # failures and deaths are noticed fast
                now = clock()
                elapsed = now - t0
                if load.done():
                    load.result()  # a bug in the generator surfaces here, not as a silent stop
                dead = server_check() if server_check else None
                if dead:
                    incomplete, note, reason = True, dead, "server_died"
                    break
                failing = systematic_failure(gen.records, spec.concurrency)
                if failing:
                    reason = "failing"
                    break
                # a request that ended (even with an error) is activity: a server failing fast has not stalled
                last = max(gen.last_chunk_time or t0, gen.last_end_time or t0)
                if gen.in_flight and now - last > spec.stall_timeout_s:
                    incomplete, reason = True, "stall"
                    note = (f"server stalled: no token from any of {len(gen.in_flight)} in-flight requests for "
                            f"{now - last:.0f} s (stall timeout {spec.stall_timeout_s:g} s)")
                    break
                if now < next_check:
                    continue
                # Each check reads every chunk so far: checking every 10% of the elapsed time (at least every
                # check_interval_s) keeps their sum linear in the level's length, and a level stops at most 10% of
                # its time after its interval was good enough.
                next_check = now + max(spec.check_interval_s, 0.10 * elapsed)
                finished, snap = len(gen.records), gen.snapshot(now)
                # A check is O(every chunk so far). Run on the loop, a long, fast level's checks stalled it (53 ms
                # lag p99 at 3,400 tok/s on the H200); in a thread the GIL's switch interval (5 ms) lets the loop
                # keep sending, but the two threads' contention for the GIL cost ~1 µs per streamed token (three
                # pairs of 40-s levels, 2-core host, 16 streams). So a check runs on the loop while the last one
                # cost less than INLINE_CHECK_S, and in a thread from then on.
                if check_cpu_s < INLINE_CHECK_S:
                    res, tokens = check(snap, finished, now)
                else:
                    res, tokens = await asyncio.to_thread(check, snap, finished, now)
                decision = res
                if progress:
                    progress(dict(level=spec.label, elapsed=elapsed, done=res.completed, in_flight=len(gen.in_flight),
                                  tps=(tokens - last_tokens) / max(now - last_t, 1e-9), sustained=res.sustained_output_tps,
                                  ci=res.sustained_output_tps_ci95, errors=sum(res.errors.values())))
                    last_tokens, last_t = tokens, now
                half, mean = res.sustained_output_tps_ci95, res.sustained_output_tps
                need = max(policy.min_completions, spec.concurrency or 0)
                trusted = (half is not None and mean and elapsed >= spec.min_seconds and res.completed_in_window >= need
                           and res.ci_batches >= policy.converge_batches and res.window_s >= policy.converge_window_s)
                if trusted and half / mean <= policy.ci_target:
                    reason = "converged"
                    break
                # A decision needs tokens still flowing: a server that went silent is the stall detector's to judge,
                # and a window that runs on through silence would "decide" a regression that is a hang.
                flowing = gen.last_chunk_time is not None and now - gen.last_chunk_time <= policy.decide_quiet_s
                if trusted and flowing and decided is not None and decided(res):
                    reason = "decided"
                    break
                if elapsed >= spec.max_seconds:
                    reason = "max_seconds"
                    break
        except asyncio.CancelledError:
            # Interrupted (Ctrl-C, SIGTERM): keep what was measured, marked incomplete; the caller re-raises.
            incomplete, note, reason = True, "interrupted before the level finished", "interrupted"
            task = asyncio.current_task()
            if task is not None and hasattr(task, "uncancel"):
                task.uncancel()
        finally:
            stopped_at = clock()
            stop_load.set()
            if incomplete or failing:
                load.cancel()
            else:
                ok = [r.end_time - r.send_time for r in gen.records if r.ok]
                lifetime = sorted(ok)[len(ok) // 2] if ok else 10.0
                drain = spec.drain_timeout_s if spec.drain_timeout_s is not None else min(600.0, 3 * lifetime + 10)
                done, _ = await asyncio.wait({load}, timeout=drain)
                if not done:
                    load.cancel()
            await asyncio.gather(load, return_exceptions=True)
            stop_aux.set()
            await asyncio.gather(*aux, return_exceptions=True)
        records = sorted(gen.records, key=lambda r: r.index)
    result = level_result(records, target=spec.concurrency, rate=spec.rate, isl=workload.isl, osl=workload.osl,
                          policy=policy, server_samples=scraper.samples, client_samples=samples(),
                          incomplete=incomplete, note=note, window_cap=stopped_at,
                          lifetime_s=decision.lifetime_s if decision else None,
                          window=(decision.window_start, decision.window_end)
                          if decision and decision.window_start is not None and not (incomplete or failing) else None,
                          stopped_because=failing, prompt_check="chat" if workload.prompt_format == "chat" else "exact",
                          host_samples=host.samples, gpu_samples=gpu.samples)
    result = replace(result, connection_retries=gen.connection_retries,
                     client_procs=generator.procs if sharded else 1)
    if gpu.error:
        result = replace(result, warnings=result.warnings + (gpu.error,))
    if scraper.errors:
        result = replace(result, scrape_errors=scraper.errors, scrape_last_error=scraper.last_error,
                         warnings=result.warnings + (scrape_warning(scraper, result),))
    return LevelMeasurement(result, records, scraper.samples, samples(), scraper.source, reason,
                            host_samples=host.samples, gpu_samples=gpu.samples)
