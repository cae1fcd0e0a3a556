"""The simulator's live state: the engine driven by the real clock, the requests' streams as the HTTP side sees
them, and SGLang's Prometheus series.

Why apart from the routes: the state is what the engine loop moves; the routes only read it and write streams.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import time
import uuid
import zlib
from dataclasses import dataclass, field

import numpy as np

from . import args as sim_args
from .radix import RadixCache
from .engine import Engine, EngineConfig, StepResult

log = logging.getLogger("sglang")
VERSION = "0.5.23-sim"


@dataclass
@dataclass
class Stream:
    """One request as the HTTP side sees it: the engine's progress plus an event to wake its writer."""

    rid: str
    input_len: int
    max_new_tokens: int
    base_id: int
    received: float
    event: asyncio.Event = field(default_factory=asyncio.Event)
    output_len: int = 0
    finished: bool = False
    finish_reason: dict | None = None
    num_retractions: int = 0
    verify_ct: int = 0  # speculative verify steps, and the tokens they accepted (the final meta_info's fields)
    accepted: int = 0
    first_token_at: float | None = None
    engine_ttft: float | None = None  # arrival to first token in the engine's own (simulated) time, real seconds
    fault: str | None = None  # "abort" | "error" | "truncate" | "short"
    fault_at: int = 0
    degenerate: bool = False  # --fault-degenerate-output: every token id 0, at the same speed
    cached_tokens: int = 0  # the prompt's prefix its prefix cache served (sim/radix.py)
    prompt_ids: list[int] | None = None  # as the prefix cache saw them: cached with the output once finished

    def output_ids(self, vocab: int, n: int | None = None) -> list[int]:
        """A greedy model's output: the same prompt gives the same ids, at any speed."""
        n = self.output_len if n is None else n
        if self.degenerate:
            return [0] * n
        return [(self.base_id + 7919 * i) % vocab for i in range(n)]


def prompt_ids(prompt, input_len: int, base: int) -> list[int]:
    """The prompt as tokens for the prefix cache: its ids, its words (the simulator's tokenizer: one per word), or a
    chat's messages as one text; a request without a prompt shares nothing."""
    if isinstance(prompt, list) and all(type(x) is int for x in prompt):
        return prompt
    if isinstance(prompt, list):  # chat messages
        prompt = " ".join(str(m.get("content", "")) if isinstance(m, dict) else str(m) for m in prompt)
    if isinstance(prompt, str):
        return [zlib.crc32(w.encode()) for w in prompt.split()]
    return [base ^ i for i in range(input_len)]


def text_of(ids: list[int]) -> str:
    return "".join(f" t{i}" for i in ids)


class Metrics:
    """sglang:* Prometheus series (facts sheet 2.9) in a registry of the process's own."""

    def __init__(self, model_name: str):
        from prometheus_client import (
            CollectorRegistry,
            Counter,
            Gauge,
            Histogram,
            disable_created_metrics,
        )

        disable_created_metrics()  # SGLang runs prometheus in multiprocess mode, which exposes no _created

        self.registry = r = CollectorRegistry()
        sl = dict(model_name=model_name, engine_type="unified", tp_rank="0", pp_rank="0", moe_ep_rank="0")
        self.sched_labels = sl
        tl = dict(model_name=model_name, engine_type="unified")
        names = list(sl)

        def gauge(name, doc):
            return Gauge(f"sglang:{name}", doc, names, registry=r, multiprocess_mode="mostrecent").labels(**sl)

        self.num_running_reqs = gauge("num_running_reqs", "The number of running requests.")
        self.num_queue_reqs = gauge("num_queue_reqs", "The number of requests in the waiting queue.")
        self.token_usage = gauge("token_usage", "The token usage.")
        self.gen_throughput = gauge("gen_throughput", "The generation throughput (token/s).")
        self.num_used_tokens = gauge("num_used_tokens", "The number of used tokens.")
        self.max_total_num_tokens = gauge("max_total_num_tokens", "Maximum total number of tokens in the KV pool.")
        self.num_retracted_reqs = gauge("num_retracted_reqs", "The number of retracted requests.")
        self.spec_accept_length = gauge("spec_accept_length", "The average acceptance length of speculative decoding.")
        self.cache_hit_rate = gauge("cache_hit_rate", "The prefix cache hit rate.")
        self.realtime_tokens = Counter("sglang:realtime_tokens", "Tokens processed, by mode.", names + ["mode"],
                                       registry=r)
        for mode in ("prefill_compute", "prefill_cache", "decode"):
            self.realtime_tokens.labels(**sl, mode=mode)
        # forward passes by mode, as SGLang counts them (mode: phase and CUDA-graph use; "none" where none is used)
        self.passes = Counter("sglang:cuda_graph_passes", "Total number of forward passes categorized by CUDA graph.",
                              names + ["mode"], registry=r)
        for mode in ("prefill_none", "decode_none"):
            self.passes.labels(**sl, mode=mode)
        # The simulator's own health: engine time it owed, and how much of it came late (the host could not keep
        # the step times: the measurement is of a disturbed simulator, not of the system it models).
        self.engine_seconds = Counter("sglperf_sim:engine_seconds", "Real seconds the engine's steps took.",
                                      registry=r)
        self.behind_seconds = Counter("sglperf_sim:behind_seconds", "Real seconds the engine loop ran late.",
                                      registry=r)
        self.retracted_total = Counter("sglang:num_retracted_requests", "Retracted requests.", names,
                                       registry=r).labels(**sl)
        tn = list(tl)
        self.prompt_tokens = Counter("sglang:prompt_tokens", "Prefill tokens.", tn + ["is_streaming"], registry=r)
        self.generation_tokens = Counter("sglang:generation_tokens", "Generation tokens.", tn + ["is_streaming"],
                                         registry=r)
        self.num_requests = Counter("sglang:num_requests", "Finished requests.", tn + ["is_streaming"], registry=r)
        self.aborted = Counter("sglang:num_aborted_requests", "Aborted requests.", tn, registry=r).labels(**tl)
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "TTFT.", tn + ["is_streaming"], registry=r,
                              buckets=[.001, .005, .01, .02, .05, .1, .25, .5, 1, 2, 5, 10, 20, 40, 80, 160, 640])
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "E2E latency.", tn + ["is_streaming"], registry=r,
                             buckets=[.01, .05, .1, .25, .5, 1, 2, 5, 10, 20, 40, 80, 160, 320, 640, 1280, 2560])
        self.tl = tl
        self.max_total_num_tokens.set(0)

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


class SimServer:
    def __init__(self, res: sim_args.Resolved):
        self.res = res
        a = res.args
        self.args = a
        self.preset = res.preset
        self.time_scale = a.time_scale
        cfg = EngineConfig(
            max_total_num_tokens=res.max_total_num_tokens, page_size=res.page_size,
            max_running_requests=res.max_running_requests, chunked_prefill_size=res.chunked_prefill_size,
            max_prefill_tokens=a.max_prefill_tokens, num_continuous_decode_steps=a.num_continuous_decode_steps,
            context_len=res.context_len, step_time=self.preset.step_time,
            init_new_token_ratio=min(1.0, 1.0 * a.schedule_conservativeness),
            min_new_token_ratio=min(1.0, 1.0 * a.schedule_conservativeness),
            max_queued_requests=a.max_queued_requests, slowdown=a.slowdown, noise_cv=a.noise_cv,
            prefill_slowdown=a.prefill_slowdown, plateau_drop=a.fault_plateau_drop, **spec_config(a),
            # the hardware's noise: fresh at every start unless --noise-seed pins it (between-start variance)
            seed=a.noise_seed if a.noise_seed is not None else int.from_bytes(os.urandom(4), "little"),
        )
        self.engine = Engine(cfg)
        self.radix = RadixCache(res.max_total_num_tokens, enabled=not a.disable_radix_cache)
        self.rng = np.random.default_rng(res.random_seed + 1)
        self.streams: dict[str, Stream] = {}
        self.requests_seen = 0  # requests received (--fault-degenerate-output counts them)
        self.status = "Starting"
        self.shutting_down = False
        self.hung = False
        self.ready_at: float | None = None
        self.wake = asyncio.Event()
        self.metrics = Metrics(res.served_model_name) if a.enable_metrics else None
        self.engine_s = self.behind_s = 0.0  # real seconds of engine steps, and how late the loop ran
        if self.metrics:
            self.metrics.max_total_num_tokens.set(res.max_total_num_tokens)
        self.started = time.time()
        self._decode_log_tokens = 0
        self._decode_log_steps = 0
        self._decode_log_t = time.monotonic()
        self.last_gen_throughput = 0.0
        self.last_progress = time.monotonic()
        self.children: list[subprocess.Popen] = []

    # ------------------------------------------------------------------ engine loop
    async def engine_loop(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            if self.hung:
                await asyncio.sleep(3600)
                continue
            step = self.engine.step()
            if step is None:
                self.update_gauges()
                self.wake.clear()
                await self.wake.wait()
                deadline = loop.time()
                continue
            deadline += step.duration / self.time_scale
            delay = deadline - loop.time()
            self.engine_s += step.duration / self.time_scale
            if self.metrics:
                self.metrics.engine_seconds.inc(step.duration / self.time_scale)
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                deadline = loop.time()  # a late step does not make the next one faster (a GPU cannot catch up)
                self.behind_s += -delay
                if self.metrics:
                    self.metrics.behind_seconds.inc(-delay)
                await asyncio.sleep(0)
            if self.hung:
                continue
            self._publish(step)

    def _publish(self, step: StepResult) -> None:
        self.last_progress = time.monotonic()
        now = time.time()
        m = self.metrics
        for ev in step.events:
            st = self.streams.get(ev.rid)
            if st is None:
                self.engine.forget(ev.rid)
                continue
            if st.first_token_at is None:
                st.first_token_at = now
                req = self.engine.requests.get(ev.rid)
                if req is not None and req.first_token_time is not None:
                    st.engine_ttft = (req.first_token_time - req.arrival) / self.time_scale
                if m:
                    m.ttft.labels(**m.tl, is_streaming="true").observe(now - st.received)
            st.output_len = ev.output_len
            if ev.finished:
                st.finished = True
                st.finish_reason = {"type": "length", "length": ev.output_len}
                req = self.engine.requests.get(ev.rid)
                st.num_retractions = req.num_retractions if req else 0
                st.verify_ct, st.accepted = (req.verify_ct, req.accepted) if req else (0, 0)
                self.engine.forget(ev.rid)
                if st.prompt_ids is not None:
                    self.radix.insert(st.prompt_ids + st.output_ids(self.preset.vocab_size))
                if m:
                    lab = dict(**m.tl, is_streaming="true")
                    m.prompt_tokens.labels(**lab).inc(st.input_len)
                    m.generation_tokens.labels(**lab).inc(ev.output_len)
                    m.num_requests.labels(**lab).inc()
                    m.e2e.labels(**lab).observe(now - st.received)
            st.event.set()
        if step.retracted:
            for rid in step.retracted:
                if rid in self.streams:
                    self.streams[rid].num_retractions += 1
            log.warning("KV cache pool is full. Retract requests. #retracted_reqs: %d, #new_tokens_gained: %d, "
                        "#new_token_ratio: %.4f -> %.4f", len(step.retracted), 0, step.new_token_ratio_before,
                        step.new_token_ratio_after)
        if m:
            sl = m.sched_labels
            if step.kind == "decode":
                m.realtime_tokens.labels(**sl, mode="decode").inc(step.new_tokens)
                m.passes.labels(**sl, mode="decode_none").inc()
            else:
                m.realtime_tokens.labels(**sl, mode="prefill_compute").inc(step.new_tokens)
                m.passes.labels(**sl, mode="prefill_none").inc()
            if step.retracted:
                m.retracted_total.inc(len(step.retracted))
        eng = self.engine
        if step.kind == "prefill":
            self.update_gauges()
            log_sched("Prefill batch, #new-seq: %d, #new-token: %d, #cached-token: 0, token usage: %.2f, "
                      "#running-req: %d, #queue-req: %d, #pending-token: 0, cuda graph: False, "
                      "input throughput (token/s): %.2f", step.batch_size, step.new_tokens, self.token_usage(),
                      len(eng.running), len(eng.waiting), step.new_tokens / max(step.duration, 1e-9)
                      * self.time_scale)
        else:
            self._decode_log_tokens += step.new_tokens
            self._decode_log_steps += 1
            if self._decode_log_steps >= self.args.decode_log_interval:
                t = time.monotonic()
                self.last_gen_throughput = self._decode_log_tokens / max(t - self._decode_log_t, 1e-9)
                self._decode_log_t, self._decode_log_tokens, self._decode_log_steps = t, 0, 0
                self.update_gauges()
                log_sched("Decode batch, #running-req: %d, #token: %d, token usage: %.2f, cuda graph: True, "
                          "gen throughput (token/s): %.2f, #queue-req: %d", len(eng.running), eng.used_tokens,
                          self.token_usage(), self.last_gen_throughput, len(eng.waiting))

    def token_usage(self) -> float:
        return self.engine.used_pages * self.res.page_size / self.res.max_total_num_tokens

    def update_gauges(self) -> None:
        m = self.metrics
        if not m:
            return
        eng = self.engine
        m.num_running_reqs.set(len(eng.running))
        m.num_queue_reqs.set(len(eng.waiting))
        m.token_usage.set(self.token_usage())
        m.num_used_tokens.set(eng.used_pages * self.res.page_size)
        m.gen_throughput.set(self.last_gen_throughput)
        if eng.stats.spec_verify:
            m.spec_accept_length.set(eng.stats.spec_accepted / eng.stats.spec_verify)
        m.cache_hit_rate.set(self.radix.hit_rate)

    # ------------------------------------------------------------------ requests
    def new_stream(self, input_len: int, max_new: int, rid: str | None = None, prompt=None) -> Stream:
        rid = rid or uuid.uuid4().hex
        if rid in self.streams:
            raise ValueError(f"Duplicate request id: {rid}")
        base = (zlib.crc32(json.dumps(prompt).encode()) if prompt is not None else int(self.rng.integers(0, 1 << 30)))
        st = Stream(rid, input_len, max_new, base, time.time())
        a = self.args
        self.requests_seen += 1
        if a.fault_degenerate_output is not None and self.requests_seen >= a.fault_degenerate_output:
            st.degenerate = True
        for kind, p in (("error", a.fault_error_rate), ("truncate", a.fault_truncate_rate),
                        ("short", a.fault_short_rate)):
            if p > 0 and self.rng.random() < p:
                st.fault = kind
                st.fault_at = int(self.rng.integers(1, max(2, max_new)))
                if kind == "error" and self.rng.random() < 0.5:
                    st.fault = "abort"
                break
        st.prompt_ids = prompt_ids(prompt, input_len, base)
        st.cached_tokens = self.radix.admit(st.prompt_ids)
        self.engine.add_request(rid, input_len, max_new, cached=st.cached_tokens)
        self.streams[rid] = st
        self.wake.set()
        return st

    def drop(self, st: Stream) -> None:
        self.streams.pop(st.rid, None)
        if not st.finished:
            self.engine.abort(st.rid)
            if self.metrics:
                self.metrics.aborted.inc()
        self.engine.forget(st.rid)

    async def events(self, st: Stream):
        """Yield the stream's progress each time the engine moved it, coalescing like SGLang does."""
        si = max(1, self.args.stream_interval)
        sent = 0
        while True:
            await st.event.wait()
            st.event.clear()
            n = st.output_len
            if st.fault and n >= st.fault_at:
                yield st.fault
                return
            if n == sent:
                continue
            if st.finished or n == 1 or n - sent >= si:
                sent = n
                yield None
            if st.finished:
                return

    async def wait_done(self, st: Stream) -> str | None:
        """Non-stream requests: wait until the request finished, or until its injected fault fired (returned)."""
        async for fault in self.events(st):
            if fault:
                return fault
        return None

    def meta(self, st: Stream, final: bool) -> dict:
        meta = {"id": st.rid, "finish_reason": st.finish_reason if final else None, "prompt_tokens": st.input_len,
                "weight_version": "default", "num_retractions": st.num_retractions, "reasoning_tokens": 0,
                "completion_tokens": st.output_len, "cached_tokens": st.cached_tokens}
        if final:
            meta["e2e_latency"] = time.time() - st.received
            if st.verify_ct:  # SGLang's speculative fields, in its final meta_info
                meta["spec_accept_length"] = st.accepted / st.verify_ct
                meta["spec_verify_ct"] = st.verify_ct
        if self.args.enable_metrics:
            meta["request_received_ts"] = st.received
            # SGLang's server-side TTFT; here in the engine's simulated time (queue and prefill steps as the model
            # schedules them): what the simulated server controls, free of the host's wake-up latency
            if st.engine_ttft is not None:
                meta["first_token_latency"] = st.engine_ttft
        return meta


def spec_config(a) -> dict:
    """The engine's speculative settings from SGLang's flags: the draft is --speculative-num-draft-tokens (else
    --speculative-num-steps + 1), its mean acceptance the simulator's own flag, or SGLANG_SIMULATE_ACC_LEN pinned."""
    if not a.speculative_algorithm:
        return {}
    draft = a.speculative_num_draft_tokens or (a.speculative_num_steps or 3) + 1
    pin = None if a.fault_ignore_accept_pin else sim_args.read_accept_pin(os.environ.get(sim_args.ACCEPT_PIN_ENV))
    length = a.sim_accept_length if pin is None else pin
    return dict(spec_draft_tokens=draft, accept_length=min(max(length, 1.0), draft + 1.0),
                accept_pinned=pin is not None,
                verify_cost=a.sim_verify_cost)


def log_sched(msg: str, *args) -> None:
    logging.getLogger("sglang.scheduler").info(msg, *args)
