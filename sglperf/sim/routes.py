"""The simulator's HTTP surface: SGLang 0.5.23's endpoints and wire formats over the live state (state.py).

Why faithful: the suite's launcher, client, scraper and fault handling must run the same code path against this and
against the real server (`sglang serve`), and SGLang's own bench_serving must work against it.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid

from aiohttp import web

from .engine import QueueFull
from .state import VERSION, SimServer, Stream, log, text_of

SAMPLING_KEYS = {
    "max_new_tokens", "temperature", "ignore_eos", "top_p", "top_k", "min_p", "stop", "stop_token_ids",
    "min_new_tokens", "n", "frequency_penalty", "presence_penalty", "repetition_penalty", "skip_special_tokens",
    "spaces_between_special_tokens", "no_stop_trim", "json_schema", "regex", "ebnf", "structural_tag",
    "custom_params", "stream_interval", "logit_bias", "sampling_seed",
}


ABORT_REASON = {"type": "abort", "message": "Internal error: the scheduler aborted the request (--fault-error-rate).",
                "status_code": 500, "err_type": "InternalServerError"}
ERROR_OBJ = {"message": "Internal server error: simulated engine fault (--fault-error-rate).",
             "type": "internal_server_error", "code": 500, "retryable": True}


def sse(obj) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def error_response(status: int, message: str) -> web.Response:
    return web.json_response({"object": "error", "message": message, "type": "Bad Request" if status == 400
                              else str(status), "param": None, "code": status}, status=status)


class Dialect:
    """How one API writes a request's progress, its end and its failures."""

    def __init__(self, vocab: int):
        self.vocab = vocab

    def progress(self, st: Stream, done: bool) -> dict:
        raise NotImplementedError

    def whole(self, st: Stream) -> dict:
        raise NotImplementedError

    def aborted(self, st: Stream) -> dict:
        return self.error()

    def error(self) -> dict:
        raise NotImplementedError

    def failed_response(self) -> web.Response:
        return error_response(500, ERROR_OBJ["message"])

    def closing(self, st: Stream) -> list[dict]:
        return []


class NativeDialect(Dialect):
    """/generate: cumulative text and ids, counts and finish reason in meta_info; aborts as a finish reason."""

    def __init__(self, vocab: int, meta):
        super().__init__(vocab)
        self.meta = meta  # SimServer._meta: meta_info as SGLang writes it

    def chunk(self, st: Stream, final: bool) -> dict:
        ids = st.output_ids(self.vocab)
        return {"text": text_of(ids), "output_ids": ids, "meta_info": self.meta(st, final)}

    def progress(self, st, done):
        return self.chunk(st, done)

    def whole(self, st):
        return self.chunk(st, True)

    def aborted(self, st):
        st.finish_reason = ABORT_REASON
        return self.chunk(st, True)

    def error(self):
        return {"error": ERROR_OBJ}

    def failed_response(self):
        return web.json_response({"error": {"message": ERROR_OBJ["message"]}}, status=500)


class OpenAIDialect(Dialect):
    """/v1/completions: text deltas, usage on every chunk or at the end as asked; failures as error objects."""

    def __init__(self, vocab: int, cid: str, created: int, model: str, include_usage: bool, continuous_usage: bool):
        super().__init__(vocab)
        self.cid, self.created, self.model = cid, created, model
        self.include_usage, self.continuous_usage = include_usage, continuous_usage
        self.sent = 0

    def chunk(self, text: str, finish: str | None) -> dict:
        return {"id": self.cid, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                             "matched_stop": None}], "usage": None}

    @staticmethod
    def usage(st: Stream) -> dict:
        return {"prompt_tokens": st.input_len, "completion_tokens": st.output_len,
                "total_tokens": st.input_len + st.output_len}

    def progress(self, st, done):
        ids = st.output_ids(self.vocab)
        c = self.chunk(text_of(ids[self.sent:]), "length" if done else None)
        if self.continuous_usage:
            c["usage"] = self.usage(st)
        self.sent = len(ids)
        return c

    def whole(self, st):
        body = self.chunk(text_of(st.output_ids(self.vocab)), "length")
        body["usage"] = self.usage(st)
        return body

    def error(self):
        return {"error": {"object": "error", "message": ERROR_OBJ["message"], "type": "InternalServerError",
                          "param": None, "code": 500}}

    def closing(self, st):
        if not self.include_usage:
            return []
        u = self.chunk("", None)
        u["choices"], u["usage"] = [], self.usage(st)
        return [u]


class Routes:
    """SGLang 0.5.23's endpoints over the live state, one handler each."""

    def __init__(self, srv: SimServer):
        self.srv, self.a, self.vocab = srv, srv.args, srv.preset.vocab_size

    def table(self) -> list[web.RouteDef]:
        return [web.get("/health", self.health), web.get("/health_generate", self.health),
                web.get("/ready", self.ready),
                web.get("/model_info", self.model_info), web.get("/get_model_info", self.model_info_old),
                web.get("/server_info", self.server_info), web.get("/get_server_info", self.server_info),
                web.get("/v1/models", self.models), web.get("/v1/models/{name:.*}", self.model),
                web.get("/v1/loads", self.loads), web.get("/flush_cache", self.flush_cache),
                web.post("/flush_cache", self.flush_cache), web.get("/metrics", self.metrics),
                web.post("/generate", self.generate), web.post("/v1/completions", self.completions)]

    @web.middleware
    async def auth(self, request: web.Request, handler):
        key = self.a.api_key
        if key and not request.path.startswith(("/health", "/ready", "/metrics")):
            scheme, _, token = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or token.strip() != key:
                return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    # ------------------------------------------------------------------ readiness and what the server says of itself
    async def health(self, request: web.Request) -> web.Response:
        srv = self.srv
        if srv.status != "Up" or srv.shutting_down:
            return web.Response(status=503)
        if srv.hung:
            await asyncio.sleep(float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20")))
            log.error("Health check failed. Server couldn't get a response from detokenizer for last 20 seconds.")
            srv.status = "UnHealthy"
            return web.Response(status=503)
        return web.Response(status=200)

    async def ready(self, request):
        srv = self.srv
        ok = srv.status == "Up" and not srv.shutting_down and not srv.hung
        return web.json_response({"status": "ready" if ok else srv.status}, status=200 if ok else 503)

    def _model_info(self) -> dict:
        srv, a = self.srv, self.a
        return {"model_path": srv.res.model_path, "served_model_name": srv.res.served_model_name,
                "tokenizer_path": a.tokenizer_path or srv.res.model_path, "is_generation": True,
                "preferred_sampling_params": None, "weight_version": "default", "load_format": a.load_format,
                "reasoning_parser": None, "tool_call_parser": None, "disaggregation_mode": "null",
                "has_image_understanding": False, "has_audio_understanding": False,
                "model_type": "sim", "architectures": list(srv.preset.architectures)}

    async def model_info(self, request):
        return web.json_response(self._model_info())

    async def model_info_old(self, request):
        log.warning("Endpoint '/get_model_info' is deprecated and will be removed in a future version. "
                    "Please use '/model_info' instead.")
        return web.json_response(self._model_info())

    async def server_info(self, request):
        srv, a, res = self.srv, self.a, self.srv.res
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
                               "engine_seconds": srv.engine_s, "behind_seconds": srv.behind_s,
                               "gpu_name": srv.preset.gpu_name, "time_scale": a.time_scale,
                               "slowdown": a.slowdown, "prefill_slowdown": a.prefill_slowdown,
                               "noise_cv": a.noise_cv, "vocab_size": self.vocab},
        )
        return web.json_response(info)

    def _model_card(self) -> dict:
        name = self.srv.res.served_model_name
        return {"id": name, "object": "model", "created": int(self.srv.started), "owned_by": "sglang", "root": name,
                "parent": None, "max_model_len": self.srv.res.context_len}

    async def models(self, request):
        return web.json_response({"object": "list", "data": [self._model_card()]})

    async def model(self, request):
        if request.match_info["name"] != self.srv.res.served_model_name:
            return web.json_response({"error": {"message": f"The model `{request.match_info['name']}` does not "
                                                           "exist.", "type": "invalid_request_error", "param": "model",
                                                "code": "model_not_found"}}, status=404)
        return web.json_response(self._model_card())

    async def loads(self, request):
        srv, eng = self.srv, self.srv.engine
        used = eng.used_pages * srv.res.page_size
        return web.json_response({
            "timestamp": time.time(), "version": VERSION, "accelerator": "sim", "num_accelerators": self.a.tp_size,
            "loads": [{
                "dp_rank": 0, "num_running_reqs": len(eng.running), "num_waiting_reqs": len(eng.waiting),
                "num_waiting_uncached_tokens": sum(r.prefill_target for r in eng.waiting),
                "num_used_tokens": used, "num_total_tokens": srv.res.max_total_num_tokens,
                "num_active_tokens": eng.used_tokens, "max_total_num_tokens": srv.res.max_total_num_tokens,
                "max_running_requests": srv.res.max_running_requests, "token_usage": srv.token_usage(),
                "gen_throughput": srv.last_gen_throughput, "cache_hit_rate": srv.radix.hit_rate,
                "utilization": 1.0 if eng.has_work else 0.0,
                "total_prefill_uncached_tokens": eng.stats.prefill_compute_tokens,
                "total_decode_tokens": eng.stats.decode_tokens,
            }]})

    async def flush_cache(self, request):
        timeout = float(request.query.get("timeout", "0") or 0)
        end = time.monotonic() + timeout
        while self.srv.engine.has_work:
            if time.monotonic() >= end:
                return web.Response(status=400, text="Timed out waiting for idle state." if timeout else
                                    "Flush cache failed.")
            await asyncio.sleep(0.05)
        self.srv.radix.flush()
        return web.Response(text="Cache flushed.\nPlease check backend logs for more details. (When there are "
                                 "running or waiting requests, the operation will not be performed.)\n")

    async def metrics(self, request):
        srv = self.srv
        if srv.metrics is None:
            return web.json_response({"detail": "Not Found"}, status=404)
        srv.update_gauges()
        body = srv.metrics.text()
        if srv.args.fault_metrics_padding:  # a fault: megabytes of other, valid series on the same page
            body = (body.decode() if isinstance(body, bytes) else body) + _padding(srv.args.fault_metrics_padding)
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})

    # ------------------------------------------------------------------ generation
    def _refuse_new(self) -> web.Response | None:
        return error_response(503, "The server is shutting down.") if self.srv.shutting_down else None

    async def generate(self, request: web.Request):
        if (r := self._refuse_new()) is not None:
            return r
        body = await read_json(request)
        problem = native_problem(body)
        if problem is not None:
            return problem
        input_len = native_input_len(body)
        stream = bool(body.get("stream", False))
        max_new = (body.get("sampling_params") or {}).get("max_new_tokens", 128)
        try:
            st = self.srv.new_stream(input_len, max_new, body.get("rid"),
                                     prompt=body.get("input_ids", body.get("text")))
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
        return await self._respond(request, st, NativeDialect(self.vocab, self.srv.meta), stream)

    async def completions(self, request: web.Request):
        if (r := self._refuse_new()) is not None:
            return r
        if not request.content_type.startswith("application/json"):
            return error_response(400, "Unsupported Media Type: Only 'application/json' is allowed")
        body = await read_json(request)
        input_len = completion_input_len(body.get("prompt"))
        if input_len is None:
            return error_response(400, "prompt must be a string, a list of token ids, or a one-element list "
                                       "(batched prompts are not simulated)")
        max_tokens = body.get("max_tokens", 16)
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 0:
            return error_response(400, f"max_tokens must be a non-negative integer, got {max_tokens!r}")
        options = body.get("stream_options") or {}
        include_usage = bool(options.get("include_usage", False))
        dialect = OpenAIDialect(self.vocab, f"cmpl-{uuid.uuid4().hex}", int(time.time()),
                                body.get("model") or self.srv.res.served_model_name, include_usage,
                                include_usage and bool(options.get("continuous_usage_stats", False)))
        try:
            st = self.srv.new_stream(input_len, max_tokens, prompt=body.get("prompt"))
        except QueueFull as e:
            return error_response(503, str(e))
        except ValueError as e:
            return error_response(400, str(e))
        return await self._respond(request, st, dialect, bool(body.get("stream", False)))

    async def _respond(self, request: web.Request, st: Stream, d: Dialect, stream: bool) -> web.StreamResponse:
        """The one loop both APIs share: the stream's progress, its injected fault, and the end, each written in
        the API's own words by the dialect `d`."""
        srv = self.srv
        try:
            if not stream:
                return await self._whole(st, d)
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
            async for fault in srv.events(st):
                if fault == "truncate":
                    return resp  # ends the chunked body: no finish reason, no [DONE]
                if fault in ("abort", "error"):
                    await resp.write(sse(d.aborted(st) if fault == "abort" else d.error()))
                    break
                if fault == "short":
                    st.finish_reason = {"type": "length", "length": st.output_len}
                done = st.finished or fault == "short"
                await resp.write(sse(d.progress(st, done)))
                if done:
                    break
            for c in d.closing(st):
                await resp.write(sse(c))
            await resp.write(b"data: [DONE]\n\n")
            return resp
        finally:
            srv.drop(st)

    async def _whole(self, st: Stream, d: Dialect) -> web.Response:
        fault = await self.srv.wait_done(st)
        if fault in ("abort", "error"):
            return d.failed_response()
        if fault == "truncate":
            raise ConnectionResetError("simulated truncation")
        if fault == "short":
            st.finish_reason = {"type": "length", "length": st.output_len}
        return web.json_response(d.whole(st))


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


def native_problem(body: dict) -> web.Response | None:
    """SGLang's schema check of a /generate body (400 with its words), or None."""
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
    elif "text" in body:
        if not isinstance(body["text"], str):
            return web.json_response({"error": {"message": "text must be a string (batched input is not "
                                                           "simulated)."}}, status=400)
    else:
        return web.json_response({"error": {"message": "Either text or input_ids should be provided."}}, status=400)
    return None


def native_input_len(body: dict) -> int:
    return len(body["input_ids"]) if "input_ids" in body else max(1, len(body["text"].split()))


def completion_input_len(prompt) -> int | None:
    """Prompt tokens of a /v1/completions prompt: token ids, a text (one token per word), or a one-element list."""
    if isinstance(prompt, list) and prompt and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
        return len(prompt)
    if isinstance(prompt, str):
        return max(1, len(prompt.split()))
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        p0 = prompt[0]
        return len(p0) if isinstance(p0, list) else max(1, len(p0.split()))
    return None


async def sse_single(request, chunks: list[dict]) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    for c in chunks:
        await resp.write(sse(c))
    await resp.write(b"data: [DONE]\n\n")
    return resp


def build_app(srv: SimServer) -> web.Application:
    routes = Routes(srv)
    app = web.Application(middlewares=[routes.auth], client_max_size=64 * 1024 * 1024)
    app.add_routes(routes.table())
    return app


def _padding(mb: float) -> str:
    """About `mb` MB of valid Prometheus text in series no engine reads (an exporter's, a large deployment's)."""
    family = "".join(f'other_series{{shard="{j}"}} {j}.0\n' for j in range(100))
    per = len(family) + 64
    return "".join(f"# HELP other_series_{i} padding\n# TYPE other_series_{i} gauge\n"
                   + family.replace("other_series{", f"other_series_{i}{{")
                   for i in range(max(1, int(mb * 2**20 / per))))
