"""The simulator's HTTP process: SGLang 0.5.23's endpoints, wire formats, log lines and life cycle around the
pure engine, driven by the real clock.

Why a faithful surface: the suite's launcher, client, scraper and fault handling must run the same code path
against this and against the real server (`sglang serve`), and SGLang's own bench_serving must work against it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import time
import traceback
import uuid
from dataclasses import dataclass, field

import numpy as np
from aiohttp import web

from . import args as sim_args
from .engine import Engine, EngineConfig, QueueFull, StepResult

log = logging.getLogger("sglang")
VERSION = "0.5.23-sim"

SAMPLING_KEYS = {
    "max_new_tokens", "temperature", "ignore_eos", "top_p", "top_k", "min_p", "stop", "stop_token_ids",
    "min_new_tokens", "n", "frequency_penalty", "presence_penalty", "repetition_penalty", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "json_schema", "regex", "ebnf", "structural_tag",
    "custom_params", "stream_interval", "logit_bias", "sampling_seed",
}


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
    first_token_at: float | None = None
    fault: str | None = None  # "abort" | "error" | "truncate" | "short"
    fault_at: int = 0

    def output_ids(self, vocab: int, n: int | None = None) -> list[int]:
        n = self.output_len if n is None else n
        return [(self.base_id + 7919 * i) % vocab for i in range(n)]


def text_of(ids: list[int]) -> str:
    return "".join(f" t{i}" for i in ids)


class Metrics:
    """sglang:* Prometheus series (facts sheet 2.9) in a registry of the process's own."""

    def __init__(self, model_name: str):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

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
        self.realtime_tokens = Counter("sglang:realtime_tokens", "Tokens processed, by mode.", names + ["mode"],
                                       registry=r)
        for mode in ("prefill_compute", "prefill_cache", "decode"):
            self.realtime_tokens.labels(**sl, mode=mode)
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
            seed=res.random_seed,
        )
        self.engine = Engine(cfg)
        self.rng = np.random.default_rng(res.random_seed + 1)
        self.streams: dict[str, Stream] = {}
        self.status = "Starting"
        self.shutting_down = False
        self.hung = False
        self.ready_at: float | None = None
        self.wake = asyncio.Event()
        self.metrics = Metrics(res.served_model_name) if a.enable_metrics else None
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
                self._update_gauges()
                self.wake.clear()
                await self.wake.wait()
                deadline = loop.time()
                continue
            deadline += step.duration / self.time_scale
            delay = deadline - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                deadline = loop.time()  # a late step does not make the next one faster (a GPU cannot catch up)
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
                if m:
                    m.ttft.labels(**m.tl, is_streaming="true").observe(now - st.received)
            st.output_len = ev.output_len
            if ev.finished:
                st.finished = True
                st.finish_reason = {"type": "length", "length": ev.output_len}
                req = self.engine.requests.get(ev.rid)
                st.num_retractions = req.num_retractions if req else 0
                self.engine.forget(ev.rid)
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
            else:
                m.realtime_tokens.labels(**sl, mode="prefill_compute").inc(step.new_tokens)
            if step.retracted:
                m.retracted_total.inc(len(step.retracted))
        eng = self.engine
        if step.kind == "prefill":
            self._update_gauges()
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
                self._update_gauges()
                log_sched("Decode batch, #running-req: %d, #token: %d, token usage: %.2f, cuda graph: True, "
                          "gen throughput (token/s): %.2f, #queue-req: %d", len(eng.running), eng.used_tokens,
                          self.token_usage(), self.last_gen_throughput, len(eng.waiting))

    def token_usage(self) -> float:
        return self.engine.used_pages * self.res.page_size / self.res.max_total_num_tokens

    def _update_gauges(self) -> None:
        m = self.metrics
        if not m:
            return
        eng = self.engine
        m.num_running_reqs.set(len(eng.running))
        m.num_queue_reqs.set(len(eng.waiting))
        m.token_usage.set(self.token_usage())
        m.num_used_tokens.set(eng.used_pages * self.res.page_size)
        m.gen_throughput.set(self.last_gen_throughput)

    # ------------------------------------------------------------------ requests
    def _new_stream(self, input_len: int, max_new: int, rid: str | None = None) -> Stream:
        rid = rid or uuid.uuid4().hex
        if rid in self.streams:
            raise ValueError(f"Duplicate request id: {rid}")
        st = Stream(rid, input_len, max_new, int(self.rng.integers(0, 1 << 30)), time.time())
        a = self.args
        for kind, p in (("error", a.fault_error_rate), ("truncate", a.fault_truncate_rate),
                        ("short", a.fault_short_rate)):
            if p > 0 and self.rng.random() < p:
                st.fault = kind
                st.fault_at = int(self.rng.integers(1, max(2, max_new)))
                if kind == "error" and self.rng.random() < 0.5:
                    st.fault = "abort"
                break
        self.engine.add_request(rid, input_len, max_new)
        self.streams[rid] = st
        self.wake.set()
        return st

    def _drop(self, st: Stream) -> None:
        self.streams.pop(st.rid, None)
        if not st.finished:
            self.engine.abort(st.rid)
            if self.metrics:
                self.metrics.aborted.inc()
        self.engine.forget(st.rid)

    async def _events(self, st: Stream):
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
        async for fault in self._events(st):
            if fault:
                return fault
        return None

    def _meta(self, st: Stream, final: bool) -> dict:
        meta = {"id": st.rid, "finish_reason": st.finish_reason if final else None, "prompt_tokens": st.input_len,
                "weight_version": "default", "num_retractions": st.num_retractions, "reasoning_tokens": 0,
                "completion_tokens": st.output_len, "cached_tokens": 0}
        if final:
            meta["e2e_latency"] = time.time() - st.received
        if self.args.enable_metrics:
            meta["request_received_ts"] = st.received
            if st.first_token_at is not None:
                meta["first_token_latency"] = st.first_token_at - st.received
        return meta


def log_sched(msg: str, *args) -> None:
    logging.getLogger("sglang.scheduler").info(msg, *args)


ABORT_REASON = {"type": "abort", "message": "Internal error: the scheduler aborted the request (--fault-error-rate).",
                "status_code": 500, "err_type": "InternalServerError"}
ERROR_OBJ = {"message": "Internal server error: simulated engine fault (--fault-error-rate).",
             "type": "internal_server_error", "code": 500, "retryable": True}


def sse(obj) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def error_response(status: int, message: str) -> web.Response:
    return web.json_response({"object": "error", "message": message, "type": "Bad Request" if status == 400
                              else str(status), "param": None, "code": status}, status=status)


def build_app(srv: SimServer) -> web.Application:
    a = srv.args
    routes = web.RouteTableDef()
    vocab = srv.preset.vocab_size

    @web.middleware
    async def auth(request: web.Request, handler):
        path = request.path
        if a.api_key and not path.startswith(("/health", "/ready", "/metrics")):
            header = request.headers.get("Authorization", "")
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or token.strip() != a.api_key:
                return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    async def health(request: web.Request) -> web.Response:
        if srv.status != "Up" or srv.shutting_down:
            return web.Response(status=503)
        if srv.hung:
            await asyncio.sleep(float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20")))
            log.error("Health check failed. Server couldn't get a response from detokenizer for last 20 seconds.")
            srv.status = "UnHealthy"
            return web.Response(status=503)
        return web.Response(status=200)

    routes.get("/health")(health)
    routes.get("/health_generate")(health)

    @routes.get("/ready")
    async def ready(request):
        ok = srv.status == "Up" and not srv.shutting_down and not srv.hung
        return web.json_response({"status": "ready" if ok else srv.status}, status=200 if ok else 503)

    def model_info() -> dict:
        return {"model_path": srv.res.model_path, "served_model_name": srv.res.served_model_name,
                "tokenizer_path": a.tokenizer_path or srv.res.model_path, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": "default", "load_format": a.load_format,
                "reasoning_parser": None, "tool_call_parser": None, "disaggregation_mode": "null",
                "has_image_understanding": False, "has_audio_understanding": False,
                "model_type": "sim", "architectures": list(srv.preset.architectures)}

    @routes.get("/model_info")
    async def get_model_info(request):
        return web.json_response(model_info())

    @routes.get("/get_model_info")
    async def get_model_info_old(request):
        log.warning("Endpoint '/get_model_info' is deprecated and will be removed in a future version. "
                    "Please use '/model_info' instead.")
        return web.json_response(model_info())

    def server_info() -> dict:
        res = srv.res
        info = res.server_args()
        info.update(
            launch_command=" ".join(sys.argv), status="ready", max_total_num_tokens=res.max_total_num_tokens,
            max_req_input_len=res.context_len - 1, startup_time=srv.ready_at - srv.started if srv.ready_at else None,
            version=VERSION, frontend="python", kv_events=None,
            internal_states=[{
                "world_size": a.tp_size, "effective_max_running_requests_per_dp": res.max_running_requests,
                "last_gen_throughput": srv.last_gen_throughput,
                "memory_usage": {"token_capacity": res.max_total_num_tokens},
                "disaggregation_mode": "null",
            }],
            sglperf_simulator={"preset": srv.preset.name, "description": srv.preset.description,
                               "gpu_name": srv.preset.gpu_name, "time_scale": a.time_scale,
                               "slowdown": a.slowdown, "noise_cv": a.noise_cv},
        )
        return info

    @routes.get("/server_info")
    async def get_server_info(request):
        return web.json_response(server_info())

    @routes.get("/get_server_info")
    async def get_server_info_old(request):
        return web.json_response(server_info())

    @routes.get("/v1/models")
    async def models(request):
        return web.json_response({"object": "list", "data": [model_card()]})

    def model_card() -> dict:
        name = srv.res.served_model_name
        return {"id": name, "object": "model", "created": int(srv.started), "owned_by": "sglang", "root": name,
                "parent": None, "max_model_len": srv.res.context_len}

    @routes.get("/v1/models/{name:.*}")
    async def model(request):
        if request.match_info["name"] != srv.res.served_model_name:
            return web.json_response({"error": {"message": f"The model `{request.match_info['name']}` does not "
                                                           "exist.", "type": "invalid_request_error", "param": "model",
                                                "code": "model_not_found"}}, status=404)
        return web.json_response(model_card())

    @routes.get("/v1/loads")
    async def loads(request):
        eng = srv.engine
        used = eng.used_pages * srv.res.page_size
        return web.json_response({
            "timestamp": time.time(), "version": VERSION, "accelerator": "sim", "num_accelerators": a.tp_size,
            "loads": [{
                "dp_rank": 0, "num_running_reqs": len(eng.running), "num_waiting_reqs": len(eng.waiting),
                "num_waiting_uncached_tokens": sum(r.prefill_target for r in eng.waiting),
                "num_used_tokens": used, "num_total_tokens": srv.res.max_total_num_tokens,
                "num_active_tokens": eng.used_tokens, "max_total_num_tokens": srv.res.max_total_num_tokens,
                "max_running_requests": srv.res.max_running_requests, "token_usage": srv.token_usage(),
                "gen_throughput": srv.last_gen_throughput, "cache_hit_rate": 0.0,
                "utilization": 1.0 if eng.has_work else 0.0,
                "total_prefill_uncached_tokens": eng.stats.prefill_compute_tokens,
                "total_decode_tokens": eng.stats.decode_tokens,
            }]})

    async def flush_cache(request):
        timeout = float(request.query.get("timeout", "0") or 0)
        end = time.monotonic() + timeout
        while srv.engine.has_work:
            if time.monotonic() >= end:
                return web.Response(status=400, text="Timed out waiting for idle state." if timeout else
                                    "Flush cache failed.")
            await asyncio.sleep(0.05)
        return web.Response(text="Cache flushed.\nPlease check backend logs for more details. (When there are "
                                 "running or waiting requests, the operation will not be performed.)\n")

    routes.get("/flush_cache")(flush_cache)
    routes.post("/flush_cache")(flush_cache)

    @routes.get("/metrics")
    async def metrics(request):
        if srv.metrics is None:
            return web.json_response({"detail": "Not Found"}, status=404)
        srv._update_gauges()
        return web.Response(body=srv.metrics.text(), headers={"Content-Type": "text/plain; version=0.0.4"})

    async def read_json(request: web.Request):
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise web.HTTPBadRequest(text=json.dumps({"error": {"message": f"Invalid JSON body: {e}"}}),
                                     content_type="application/json")
        if not isinstance(body, dict):
            raise web.HTTPBadRequest(text=json.dumps({"error": {"message": "The request body must be an object."}}),
                                     content_type="application/json")
        return body

    def refuse_new() -> web.Response | None:
        if srv.shutting_down:
            return error_response(503, "The server is shutting down.")
        return None

    @routes.post("/generate")
    async def generate(request: web.Request):
        if (r := refuse_new()) is not None:
            return r
        body = await read_json(request)
        sp = body.get("sampling_params") or {}
        if not isinstance(sp, dict):
            return web.json_response({"error": "invalid type: expected struct SamplingParams"}, status=400)
        unknown = sorted(set(sp) - SAMPLING_KEYS)
        if unknown:
            return web.json_response({"error": f"unknown field `{unknown[0]}`, expected one of "
                                               + ", ".join(f"`{k}`" for k in sorted(SAMPLING_KEYS))}, status=400)
        max_new = sp.get("max_new_tokens", 128)
        if not isinstance(max_new, int) or isinstance(max_new, bool):
            return web.json_response({"error": f"invalid type: {type(max_new).__name__} {max_new!r}, expected i64"},
                                     status=400)
        if "input_ids" in body:
            ids = body["input_ids"]
            if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                return web.json_response({"error": {"message": "input_ids must be a list of token ids "
                                                               "(batched input is not simulated)."}}, status=400)
            input_len = len(ids)
        elif "text" in body:
            text = body["text"]
            if not isinstance(text, str):
                return web.json_response({"error": {"message": "text must be a string (batched input is not "
                                                               "simulated)."}}, status=400)
            input_len = max(1, len(text.split()))
        else:
            return web.json_response({"error": {"message": "Either text or input_ids should be provided."}},
                                     status=400)
        stream = bool(body.get("stream", False))
        try:
            st = srv._new_stream(input_len, max_new, body.get("rid"))
        except QueueFull as e:
            if stream:
                return await sse_single(request, [{"text": "", "output_ids": [], "meta_info": {
                    "id": body.get("rid") or uuid.uuid4().hex, "finish_reason": {
                        "type": "abort", "message": str(e), "status_code": 503, "err_type": "ServiceUnavailable"},
                    "prompt_tokens": input_len, "completion_tokens": 0}}])
            return web.json_response({"error": {"message": str(e)}}, status=503)
        except ValueError as e:
            if stream:
                return await sse_single(request, [{"error": {"message": str(e), "type": "invalid_request_error",
                                                             "code": 400, "retryable": False}}])
            return web.json_response({"error": {"message": str(e)}}, status=400)
        try:
            if not stream:
                fault = await srv.wait_done(st)
                if fault in ("abort", "error"):
                    return web.json_response({"error": {"message": ERROR_OBJ["message"]}}, status=500)
                if fault == "truncate":
                    raise ConnectionResetError("simulated truncation")
                ids = st.output_ids(vocab)
                if fault == "short":
                    st.finish_reason = {"type": "length", "length": st.output_len}
                return web.json_response({"text": text_of(ids), "output_ids": ids, "meta_info": srv._meta(st, True)})
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
            async for fault in srv._events(st):
                if fault == "abort":
                    st.finish_reason = ABORT_REASON
                    await resp.write(sse({"text": text_of(st.output_ids(vocab)), "output_ids":
                                          st.output_ids(vocab), "meta_info": srv._meta(st, True)}))
                    break
                if fault == "error":
                    await resp.write(sse({"error": ERROR_OBJ}))
                    break
                if fault == "truncate":
                    return resp  # ends the chunked body: no finish reason, no [DONE]
                if fault == "short":
                    st.finish_reason = {"type": "length", "length": st.output_len}
                    ids = st.output_ids(vocab)
                    await resp.write(sse({"text": text_of(ids), "output_ids": ids, "meta_info": srv._meta(st, True)}))
                    break
                ids = st.output_ids(vocab)
                await resp.write(sse({"text": text_of(ids), "output_ids": ids,
                                      "meta_info": srv._meta(st, st.finished)}))
            await resp.write(b"data: [DONE]\n\n")
            return resp
        finally:
            srv._drop(st)

    async def sse_single(request, chunks: list[dict]) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        for c in chunks:
            await resp.write(sse(c))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    @routes.post("/v1/completions")
    async def completions(request: web.Request):
        if (r := refuse_new()) is not None:
            return r
        if not request.content_type.startswith("application/json"):
            return error_response(400, "Unsupported Media Type: Only 'application/json' is allowed")
        body = await read_json(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(i, int) and not isinstance(i, bool)
                                                       for i in prompt):
            input_len = len(prompt)
        elif isinstance(prompt, str):
            input_len = max(1, len(prompt.split()))
        elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            p0 = prompt[0]
            input_len = len(p0) if isinstance(p0, list) else max(1, len(p0.split()))
        else:
            return error_response(400, "prompt must be a string, a list of token ids, or a one-element list "
                                       "(batched prompts are not simulated)")
        max_tokens = body.get("max_tokens", 16)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
            return error_response(400, f"max_tokens must be a non-negative integer, got {max_tokens!r}")
        stream = bool(body.get("stream", False))
        stream_options = body.get("stream_options") or {}
        include_usage = bool(stream_options.get("include_usage", False))
        continuous_usage = include_usage and bool(stream_options.get("continuous_usage_stats", False))
        model_name = body.get("model") or srv.res.served_model_name
        cid = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        try:
            st = srv._new_stream(input_len, max_tokens)
        except QueueFull as e:
            return error_response(503, str(e))
        except ValueError as e:
            return error_response(400, str(e))

        def chunk(text: str, finish: str | None) -> dict:
            return {"id": cid, "object": "text_completion", "created": created, "model": model_name,
                    "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                                 "matched_stop": None}], "usage": None}

        def usage() -> dict:
            return {"prompt_tokens": st.input_len, "completion_tokens": st.output_len,
                    "total_tokens": st.input_len + st.output_len}

        try:
            if not stream:
                fault = await srv.wait_done(st)
                if fault in ("abort", "error"):
                    return error_response(500, ERROR_OBJ["message"])
                if fault == "truncate":
                    raise ConnectionResetError("simulated truncation")
                body = chunk(text_of(st.output_ids(vocab)), "length")
                body["object"] = "text_completion"
                body["usage"] = usage()
                return web.json_response(body)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
            sent = 0
            async for fault in srv._events(st):
                if fault in ("abort", "error"):
                    await resp.write(sse({"error": {"object": "error", "message": ERROR_OBJ["message"],
                                                    "type": "InternalServerError", "param": None, "code": 500}}))
                    break
                if fault == "truncate":
                    return resp
                ids = st.output_ids(vocab)
                done = st.finished or fault == "short"
                c = chunk(text_of(ids[sent:]), "length" if done else None)
                if continuous_usage:
                    c["usage"] = usage()
                await resp.write(sse(c))
                sent = len(ids)
                if done:
                    break
            if include_usage:
                u = chunk("", None)
                u["choices"] = []
                u["usage"] = usage()
                await resp.write(sse(u))
            await resp.write(b"data: [DONE]\n\n")
            return resp
        finally:
            srv._drop(st)

    app = web.Application(middlewares=[auth], client_max_size=64 * 1024 * 1024)
    app.add_routes(routes)
    return app


class SchedFormatter(logging.Formatter):
    def __init__(self, tp: int):
        super().__init__()
        self.tp = tp

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.created))
        prefix = " TP0" if self.tp > 1 and record.name.startswith("sglang.scheduler") else ""
        return f"[{ts}{prefix}] {record.getMessage()}"


def setup_logging(level: str, tp: int) -> None:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(SchedFormatter(tp))
    root = logging.getLogger("sglang")
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper()))
    root.propagate = False
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 65535
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


async def serve(res: sim_args.Resolved) -> int:
    a = res.args
    srv = SimServer(res)
    loop = asyncio.get_running_loop()
    log.info("server_args=%s", json.dumps({k: ("<redacted>" if k == "api_key" and v else v)
                                            for k, v in res.server_args().items()}, default=str))
    for w in res.warnings:
        log.warning(w)
    # A child process stands in for SGLang's scheduler/detokenizer processes, so launchers must end a whole tree.
    srv.children.append(subprocess.Popen([sys.executable, "-m", "sglperf.sim.child", str(os.getpid())],
                                         stdin=subprocess.DEVNULL))
    log_sched("Load weight begin. avail mem=%.2f GB", res.preset.gpu_mem_gib)
    await asyncio.sleep((res.preset.startup_s + a.fault_slow_start) / a.time_scale)
    if a.fault_startup_fail:
        print("Traceback (most recent call last):\n"
              '  File "sglang/srt/entrypoints/engine.py", line 917, in _launch_subprocesses\n'
              "    raise RuntimeError(\n"
              "RuntimeError: Rank 0 scheduler died during initialization (exit code: 1). "
              "Injected start-up failure (--fault-startup-fail).", file=sys.stderr, flush=True)
        return 1
    log_sched("Load weight end. elapsed=%.2f s, type=%s, quant=%s, avail mem=%.2f GB, mem usage=%.2f GB.",
              res.preset.startup_s, res.preset.architectures[0], a.quantization, res.preset.gpu_mem_gib
              - res.preset.weights_gib_per_gpu, res.preset.weights_gib_per_gpu)
    log_sched("KV Cache is allocated. dtype: %s, #tokens: %d, KV size: %.2f GB", res.kv_cache_dtype,
              res.max_total_num_tokens, res.mem_fraction_static * res.preset.gpu_mem_gib
              - res.preset.weights_gib_per_gpu)
    log_sched("max_total_num_tokens=%d, chunked_prefill_size=%d, max_prefill_tokens=%d, max_running_requests=%d, "
              "context_len=%d, available_gpu_mem=%.2f GB", res.max_total_num_tokens, res.chunked_prefill_size,
              a.max_prefill_tokens, res.max_running_requests, res.context_len,
              res.preset.gpu_mem_gib * (1 - res.mem_fraction_static))
    raise_nofile()
    app = build_app(srv)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, a.host, a.port, backlog=4096, reuse_address=True)
    try:
        await site.start()
    except OSError as e:
        log.error("[Errno %s] error while attempting to bind on address (%r, %d): %s", e.errno, a.host, a.port,
                  e.strerror.lower() if e.strerror else e)
        await runner.cleanup()
        return 1
    log.info("Uvicorn running on http://%s:%d (Press CTRL+C to quit)", a.host, a.port)
    engine_task = asyncio.create_task(srv.engine_loop())
    stop = asyncio.Event()

    def on_sigterm() -> None:
        log.info("Received sigterm; shutting down gracefully after in-flight requests finish.")
        srv.shutting_down = True
        stop.set()

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    loop.add_signal_handler(signal.SIGINT, stop.set)

    if not a.skip_server_warmup:
        st = srv._new_stream(7, 8, "warmup")
        async for _ in srv._events(st):
            pass
        srv._drop(st)
        log.info('127.0.0.1:0 - "POST /generate HTTP/1.1" 200')
    srv.status = "Up"
    srv.ready_at = time.time()
    log.info("The server is fired up and ready to roll!")
    faults = []
    if a.fault_crash_after is not None:
        async def crash() -> None:
            await asyncio.sleep(a.fault_crash_after)
            log.error("Subprocess scheduler_0 (pid=%d) crashed with exit code -9. Triggering SIGQUIT for cleanup...",
                      srv.children[0].pid)
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        faults.append(asyncio.create_task(crash()))
    if a.fault_hang_after is not None:
        async def hang() -> None:
            await asyncio.sleep(a.fault_hang_after)
            log.warning("Injected hang (--fault-hang-after): the engine stops producing tokens.")
            srv.hung = True
        faults.append(asyncio.create_task(hang()))
    await stop.wait()
    if srv.shutting_down and not os.environ.get("SGL_FORCE_SHUTDOWN"):
        end = time.monotonic() + 30
        while srv.streams and time.monotonic() < end and not srv.hung:
            await asyncio.sleep(0.1)
    for t in [engine_task, *faults]:
        t.cancel()
    await runner.cleanup()
    for c in srv.children:
        c.terminate()
        try:
            c.wait(5)
        except subprocess.TimeoutExpired:
            c.kill()
    log.info("Shutdown complete.")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = sim_args.build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.log_level if hasattr(logging, args.log_level.upper()) else "info", args.tp_size)
    try:
        res = sim_args.resolve(args)
    except Exception:  # resolution errors: traceback and exit 1, like SGLang
        traceback.print_exc()
        return 1
    return asyncio.run(serve(res))


if __name__ == "__main__":
    sys.exit(main())
