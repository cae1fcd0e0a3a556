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

from ..categories import UsageError
from .client import ClientMonitor, LoadGenerator, Target, Workload, run_loop
from .metrics import ArrivalLog, LevelEnd, LevelSamples, MeasurementPolicy, level_result
from .validity import count_checkable
from ..environment.gpu import GpuMonitor
from ..environment.gpu_faults import FaultWatch
from ..environment.host import HostMonitor
from ..records import (ClientSample, GpuSample, HostSample, LevelResult, RequestRecord, ServerSample,
                       load_name)
from .scrape import Scraper
from .shards import ShardedLoad


def parse_levels(text: str | None, option: str = "--levels") -> tuple[int, ...]:
    """Comma-separated concurrencies, sorted and unique; a usage error naming the option otherwise."""
    if not text:
        return ()
    parts = [x.strip() for x in text.split(",")]
    if "" in parts:
        raise UsageError(f"{option} {text!r} has an empty entry; give comma-separated integers like 8,16,32")
    try:
        lv = sorted({int(x) for x in parts})
    except ValueError:
        raise UsageError(f"{option} must be comma-separated integers, got {text!r}") from None
    if not lv or lv[0] < 1:
        raise UsageError(f"{option} must be positive integers, got {text!r}")
    return tuple(lv)


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
    request_timeout_s: float = 3600.0

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("a level has either a concurrency or a rate")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.rate is not None and self.rate <= 0:
            raise ValueError(f"rate must be > 0, got {self.rate}")

    @property
    def stream_id(self) -> int:
        """Seeds the level's prompts: the same level sends the same prompts from the suite and `sglperf bench`
        (a closed loop by its concurrency, an open loop by its rate in thousandths, apart from them)."""
        return self.concurrency if self.concurrency is not None else (1 << 24) + round(self.rate * 1000)

    @property
    def label(self) -> str:
        return load_name(self.concurrency, self.rate)


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
    # the field named as servers name a refused one (quoted), not the short-output words "(ignore_eos)"
    (("'ignore_eos'", '"ignore_eos"'), "the server refuses ignore_eos: --engine openai lets sglperf find out what it "
                                       "accepts"),
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


@dataclass(frozen=True)
class ServerWatch:
    """What the level runner may ask of the server it measures: whether it died (its words, else None), its
    processes on this host (their CPU is the server's, not a neighbour's) and its GPUs (sampled; None: none)."""

    crash: Callable[[], str | None] = lambda: None
    pids: Callable[[], list[int]] = lambda: []
    gpus: list[int] | None = None


@dataclass(frozen=True)
class Stop:
    """Why a level stopped: `reason` is its stop_reason; `incomplete` levels were cut short (their `note` says
    why); `failing` quotes a server that refused requests systematically."""

    reason: str
    incomplete: bool = False
    note: str | None = None
    failing: str | None = None


# ---------------------------------------------------------------------------------------------- stop conditions
def server_died(watch: ServerWatch) -> Stop | None:
    dead = watch.crash()
    return Stop("server_died", incomplete=True, note=dead) if dead else None


def requests_failing(gen, concurrency: int | None) -> Stop | None:
    why = systematic_failure(gen.records, concurrency)
    return Stop("failing", failing=why) if why else None


def stalled(gen, now: float, t0: float, timeout_s: float) -> Stop | None:
    """No token from any request in flight for `timeout_s`; a request that ended (even with an error) is activity:
    a server failing fast has not stalled."""
    last = max(gen.last_chunk_time or t0, gen.last_end_time or t0)
    if gen.in_flight and now - last > timeout_s:
        return Stop("stall", incomplete=True, note=f"server stalled: no token from any of {len(gen.in_flight)} "
                    f"in-flight requests for {now - last:.0f} s (stall timeout {timeout_s:g} s)")
    return None


def trusted(res: LevelResult, elapsed: float, spec: LevelSpec, policy: MeasurementPolicy) -> bool:
    """An interval that may stop a level: enough batches over enough steady state, after the level's minimum, and a
    window whose count the server's counter can check (validity.count_checkable)."""
    need = max(policy.min_completions, spec.concurrency or 0)
    lifetimes = res.window_s / res.lifetime_s if res.lifetime_s else 0.0
    return (res.sustained_output_tps_ci95 is not None and bool(res.sustained_output_tps) and elapsed >= spec.min_seconds
            and res.completed_in_window >= need and lifetimes >= policy.trusted_window_lifetimes
            and res.window_s >= policy.converge_window_s and count_checkable(res, policy.server_agreement))


def converged(res: LevelResult, policy: MeasurementPolicy) -> Stop | None:
    if res.sustained_output_tps_ci95 / res.sustained_output_tps <= policy.ci_target:
        return Stop("converged")
    return None


def decided_early(res: LevelResult, gen, now: float, policy: MeasurementPolicy,
                  decided: Callable[[LevelResult], bool] | None) -> Stop | None:
    """The interval already decides what it feeds (a floor), while tokens still flow: a window that ran on through
    silence would "decide" a regression that is a hang, which is the stall detector's to judge."""
    flowing = gen.last_chunk_time is not None and now - gen.last_chunk_time <= policy.decide_quiet_s
    if flowing and decided is not None and decided(res):
        return Stop("decided")
    return None


def time_up(elapsed: float, spec: LevelSpec) -> Stop | None:
    return Stop("max_seconds") if elapsed >= spec.max_seconds else None


# ---------------------------------------------------------------------------------------------- the runner
class Monitors:
    """The level's side samplers: the server's view, the client's own health, the host and the GPUs."""

    def __init__(self, target: Target, engine, spec: LevelSpec, watch: ServerWatch, clock):
        self.client_pids: list[int] = []  # the client's worker processes: their CPU is the client's
        self.scraper = Scraper(target.url, engine, interval=spec.scrape_interval_s, api_key=target.api_key, clock=clock)
        self.client = ClientMonitor(clock)
        self.host = HostMonitor(clock, watch.pids, client_pids=lambda: self.client_pids)
        self.gpu = GpuMonitor(clock, watch.gpus, watch.pids)
        self.faults = FaultWatch(clock, watch.gpus or [])
        self._stop = asyncio.Event()
        self._tasks = [asyncio.create_task(m.run(self._stop)) for m in (self.scraper, self.client, self.host)] + (
            [asyncio.create_task(m.run(self._stop)) for m in (self.gpu, self.faults)] if watch.gpus else [])

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class Checker:
    """The level as it stands, in the middle of it. A check is O(every chunk so far); on the event loop a long, fast
    level's checks stalled it (docs/measurement.md), in a thread the two threads' contention for the GIL costs per
    token: so a check runs on the loop while the last one cost less than INLINE_CHECK_S, and in a thread after."""

    def __init__(self, spec: LevelSpec, workload: Workload, policy: MeasurementPolicy, monitors: Monitors, samples):
        self.spec, self.workload, self.policy, self.monitors, self.samples = spec, workload, policy, monitors, samples
        self.arrivals = ArrivalLog()
        self.cpu_s = 0.0

    def _check(self, snap: list[RequestRecord], finished: int, now: float) -> tuple[LevelResult, float]:
        started = time.thread_time()
        times, tokens = self.arrivals.arrivals(snap, finished)
        m = self.monitors
        res = level_result(snap, concurrency=self.spec.concurrency, rate=self.spec.rate, isl=self.workload.isl,
                           osl=self.workload.osl, policy=self.policy, now=now, latencies=False,
                           arrivals=(times, tokens),
                           samples=LevelSamples(list(m.scraper.samples), list(self.samples()), list(m.host.samples),
                                                list(m.gpu.samples)))
        self.cpu_s = time.thread_time() - started
        return res, float(tokens.sum())

    async def __call__(self, gen, now: float) -> tuple[LevelResult, float]:
        finished, snap = len(gen.records), gen.snapshot(now)
        if self.cpu_s < INLINE_CHECK_S:
            return self._check(snap, finished, now)
        return await asyncio.to_thread(self._check, snap, finished, now)


CATCH_UP_YIELDS = 4


async def caught_up(clock) -> float:
    """The time a check may snapshot the level at, once the streams have read what reached them while the loop was
    busy: a socket's data is read in one pass of the loop and its reader wakes in the next, so a check that
    snapshots at once, after a pause of the process, ends its window with those tokens unread (the window then
    reads the server's counter ahead and the sustained rate low: docs/measurement.md, "A pause before a check")."""
    for _ in range(CATCH_UP_YIELDS):
        await asyncio.sleep(0)
    return clock()


async def _watch(gen, load: asyncio.Task, check: Checker, spec: LevelSpec, policy: MeasurementPolicy,
                 watch: ServerWatch, decided, progress, clock) -> tuple[Stop, LevelResult | None]:
    """Until a stop condition holds: failures and deaths are noticed within 0.25 s; the interval is checked every
    10% of the elapsed time (at least every check_interval_s), so the checks' sum stays linear in the level's length
    and a level stops at most 10% of its time after its interval was good enough."""
    t0 = clock()
    decision, next_check, last = None, t0 + spec.check_interval_s, (0.0, t0)
    while True:
        await asyncio.sleep(min(0.25, spec.check_interval_s))
        now = clock()
        if load.done():
            load.result()  # a bug in the generator surfaces here, not as a silent stop
        stop = (server_died(watch) or requests_failing(gen, spec.concurrency)
                or stalled(gen, now, t0, spec.stall_timeout_s))
        if stop or now < next_check:
            if stop:
                return stop, decision
            continue
        next_check = now + max(spec.check_interval_s, 0.10 * (now - t0))
        now = await caught_up(clock)
        decision, tokens = await check(gen, now)
        if progress:
            r = decision
            progress(dict(level=spec.label, elapsed=now - t0, done=r.completed, in_flight=len(gen.in_flight),
                          tps=(tokens - last[0]) / max(now - last[1], 1e-9), sustained=r.sustained_output_tps,
                          ci=r.sustained_output_tps_ci95, errors=sum(r.errors.values())))
            last = (tokens, now)
        ok = trusted(decision, now - t0, spec, policy)
        stop = ((ok and (converged(decision, policy) or decided_early(decision, gen, now, policy, decided)))
                or time_up(now - t0, spec))
        if stop:
            return stop, decision


def drain_timeout(records) -> float:
    """How long a drain may last: 3 median lifetimes of the requests finished so far + 10 s (10 s lifetimes where
    none has finished), at most 10 minutes."""
    ok = sorted(r.end_time - r.send_time for r in records if r.ok)
    lifetime = ok[len(ok) // 2] if ok else 10.0
    return min(600.0, 3 * lifetime + 10)


async def _drain(gen, load: asyncio.Task, stop: Stop, spec: LevelSpec, clock) -> Stop:
    """Requests in flight finish (up to the drain timeout: 3 median lifetimes + 10 s); a level cut short or failing
    cancels them. The drain is part of the level: a server that goes silent then has stalled as much as one that goes
    silent before the level's end (its in-flight requests would otherwise be cancelled uncounted and the window
    before the hang taken as the level's throughput), and requests it never finishes mean the same. Returns the stop
    the level ends with."""
    if stop.incomplete or stop.failing:
        load.cancel()
        await asyncio.gather(load, return_exceptions=True)
        return stop
    drain = spec.drain_timeout_s if spec.drain_timeout_s is not None else drain_timeout(gen.records)
    t0 = clock()
    quiet_from = t0 - (spec.stall_timeout_s if gen.last_chunk_time is None else 0.0)
    while not load.done():
        await asyncio.wait({load}, timeout=0.25)
        now = clock()
        if load.done():
            break
        hang = stalled(gen, now, quiet_from, spec.stall_timeout_s)
        if hang is None and now - t0 > drain and gen.in_flight:
            hang = Stop("drain_timeout", incomplete=True,
                        note=f"server stalled: {len(gen.in_flight)} requests still in flight {now - t0:.0f} s after "
                             f"the level stopped sending (drain timeout: 3 median lifetimes + 10 s = {drain:.0f} s)")
        if hang is not None:
            load.cancel()
            await asyncio.gather(load, return_exceptions=True)
            return replace(hang, note=hang.note + " (while the level drained)")
    await asyncio.gather(load, return_exceptions=True)
    return stop


def _generator(target: Target, workload: Workload, spec: LevelSpec, client_procs: int, clock):
    if client_procs > 1 and spec.concurrency is not None and spec.concurrency > 1:
        return ShardedLoad(target, workload, spec.concurrency, client_procs, stream_id=spec.stream_id,
                           request_timeout=spec.request_timeout_s)
    return LoadGenerator(target, workload, stream_id=spec.stream_id, request_timeout=spec.request_timeout_s,
                         clock=clock)


def _start_load(gen, spec: LevelSpec, workload: Workload, stop: asyncio.Event) -> asyncio.Task:
    if spec.concurrency is not None:
        return asyncio.create_task(gen.closed_loop(spec.concurrency, stop))
    return asyncio.create_task(gen.open_loop(spec.rate, stop, burstiness=spec.burstiness,
                                             max_concurrency=spec.max_concurrency, seed=workload.seed))


async def measure_level(target: Target, workload: Workload, spec: LevelSpec, policy: MeasurementPolicy, *,
                        engine, watch: ServerWatch = ServerWatch(),
                        decided: Callable[[LevelResult], bool] | None = None, client_procs: int = 1,
                        progress: Callable[[dict], None] | None = None,
                        clock: Callable[[], float] = time.monotonic) -> LevelMeasurement:
    """Drive one level. It stops when its interval is precise enough (policy.ci_target) or, sooner, when
    `decided` says the interval already decides what it feeds (a floor), once the interval is trustworthy; when the
    time is up; or when the server dies, stalls or refuses requests. `client_procs` > 1 shards a closed loop's
    streams over that many client processes (sglperf.measure.shards); an open loop runs in this one."""
    monitors = Monitors(target, engine, spec, watch, clock)
    generator = _generator(target, workload, spec, client_procs, clock)
    sharded = isinstance(generator, ShardedLoad)
    async with generator as gen:
        if sharded:
            monitors.client_pids.extend(gen.pids)
        samples = (lambda: gen.samples) if sharded else (lambda: monitors.client.samples)  # the streaming processes'
        stop_load = asyncio.Event()
        load = _start_load(gen, spec, workload, stop_load)
        decision = None
        try:
            stop, decision = await _watch(gen, load, Checker(spec, workload, policy, monitors, samples), spec, policy,
                                          watch, decided, progress, clock)
        except asyncio.CancelledError:
            # Interrupted (Ctrl-C, SIGTERM): keep what was measured, marked incomplete; the caller saves it (another
            # Ctrl-C meanwhile is noted, not raised: client.run_loop) and re-raises.
            stop = Stop("interrupted", incomplete=True, note="interrupted before the level finished")
            task = asyncio.current_task()
            if task is not None and hasattr(task, "uncancel"):
                task.uncancel()
        except BaseException:  # a bug in the generator or a check: nothing of the level is left running
            stop_load.set()
            load.cancel()
            await asyncio.gather(load, return_exceptions=True)
            await monitors.stop()
            raise
        finally:
            stopped_at = clock()
            stop_load.set()
        stop = await _drain(gen, load, stop, spec, clock)
        await monitors.stop()
        records = sorted(gen.records, key=lambda r: r.index)
    return _measurement(records, monitors, samples(), stop, decision, stopped_at, spec, workload, policy, gen,
                        generator.procs if sharded else 1)


def _measurement(records, monitors: Monitors, client_samples, stop: Stop, decision: LevelResult | None,
                 stopped_at: float, spec: LevelSpec, workload: Workload, policy: MeasurementPolicy, gen,
                 procs: int) -> LevelMeasurement:
    """The final result over every record: the window and batch length the stop decision judged, unless the level
    was cut short (then the window is searched again, up to where load stopped)."""
    judged = decision is not None and decision.window_start is not None and not (stop.incomplete or stop.failing)
    end = LevelEnd(window_cap=stopped_at, lifetime_s=decision.lifetime_s if decision else None,
                   window=(decision.window_start, decision.window_end) if judged else None,
                   stopped_because=stop.failing, incomplete=stop.incomplete, note=stop.note)
    m = monitors
    result = level_result(records, concurrency=spec.concurrency, rate=spec.rate, isl=workload.isl, osl=workload.osl,
                          policy=policy, end=end, prompt_check="chat" if workload.prompt_format == "chat" else "exact",
                          samples=LevelSamples(m.scraper.samples, client_samples, m.host.samples, m.gpu.samples),
                          cache_allowed=workload.cache_allowed)
    warnings = result.warnings + tuple(e for e in (m.gpu.error, m.faults.error, m.host.error) if e)
    if m.faults.faults:  # a GPU that reported a fault measured a broken machine, whatever the numbers say
        faults = tuple(f"GPU fault: {f}" for f in m.faults.faults)
        result = replace(result, valid=False, invalid_reasons=result.invalid_reasons + faults, gpu_faults=faults)
    if m.scraper.errors:
        warnings += (scrape_warning(m.scraper, result),)
    if m.scraper.page_words():
        warnings += (m.scraper.page_words(),)
    if m.scraper.unparsed:
        warnings += (f"{m.scraper.unparsed} /metrics page(s) held lines the Prometheus parser refused, dropped while "
                     f"the rest was read; the first: {m.scraper.unparsed_example!r}",)
    result = replace(result, connection_retries=gen.connection_retries, client_procs=procs, warnings=warnings,
                     scrape_errors=m.scraper.errors, scrape_last_error=m.scraper.last_error)
    return LevelMeasurement(result, records, m.scraper.samples, client_samples, m.scraper.source, stop.reason,
                            host_samples=m.host.samples, gpu_samples=m.gpu.samples)


def run_level(target: Target, workload: Workload, spec: LevelSpec, policy: MeasurementPolicy, *, engine,
              watch: ServerWatch = ServerWatch(), decided: Callable[[LevelResult], bool] | None = None,
              client_procs: int = 1, progress: Callable[[dict], None] | None = None,
              flush: bool = True) -> LevelMeasurement:
    """One level as the suite and `sglperf bench` run it: the server's prefix cache flushed first (where the engine
    has a flush), then measured on its own event loop; `extra["epoch_ms"]` says when, in wall-clock time."""
    if flush:
        engine.flush(target.url, target.api_key)
    started = time.time()
    meas = run_loop(measure_level(target, workload, spec, policy, engine=engine, watch=watch, decided=decided,
                                  client_procs=client_procs, progress=progress))
    meas.extra["epoch_ms"] = (int(started * 1000), int(time.time() * 1000))
    return meas
