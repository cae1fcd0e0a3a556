"""A strict OpenAI-compatible server for the tests, and the broken servers users point the suite at.

strict (default): /v1/completions and /v1/chat/completions as a schema-checking gateway or `transformers serve`
answers them: unknown fields -> 422 {"detail": "Unexpected fields in the request: {...}"}, a prompt that is not a
string -> 400 {"detail": "prompt must be a string."}; one token per whitespace-separated word; `--slots` requests
decode at once, one token every `--token-ms` each; usage only at the end, and only if asked.
Other modes: refuse (every POST 400 with a reason), http500 (everything 500), non-sse (200 with a JSON body),
bad-sse (200 with malformed SSE). Run: python tests/strict_server.py --host H --port P [--mode M] [...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from aiohttp import web

COMPLETION_FIELDS = {"model", "prompt", "max_tokens", "stream", "stream_options", "temperature", "top_p", "n",
                     "stop", "seed", "user"}
CHAT_FIELDS = {"model", "messages", "max_tokens", "max_completion_tokens", "stream", "stream_options", "temperature",
               "top_p", "n", "stop", "seed", "user"}
STREAM_OPTION_FIELDS = {"include_usage"}


def sse(obj) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def build_app(a: argparse.Namespace) -> web.Application:
    slots = asyncio.Semaphore(a.slots)
    counters = {"requests": 0}

    @web.middleware
    async def checks(request: web.Request, handler):
        if a.mode == "http500" and request.path != "/stats":  # /stats: the tests' own readiness check
            return web.json_response({"detail": "Internal Server Error: the model worker is gone"}, status=500)
        if request.method == "POST":
            counters["requests"] += 1
        if a.api_key and request.path.startswith("/v1/") and \
                request.headers.get("Authorization") != f"Bearer {a.api_key}":
            return web.json_response({"detail": "Invalid API key"}, status=401)
        return await handler(request)

    async def health(request):
        return web.Response(text="ok")

    async def models(request):
        return web.json_response({"object": "list", "data": [{"id": "strict-model", "object": "model"}]})

    async def stats(request):
        return web.json_response(counters)

    async def generate(request: web.Request, chat: bool):
        if a.mode == "refuse":
            return web.json_response({"detail": "model 'strict-model' is not loaded on this replica"}, status=400)
        if a.mode == "non-sse":
            return web.json_response({"id": "x", "choices": [{"text": "not a stream"}]})
        if a.mode == "bad-sse":
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await resp.write(b"data: {not json at all\n\n")
            return resp
        body = await request.json()
        unknown = set(body) - (CHAT_FIELDS if chat else COMPLETION_FIELDS)
        if unknown:
            return web.json_response({"detail": f"Unexpected fields in the request: {unknown}"}, status=422)
        so = body.get("stream_options") or {}
        if set(so) - STREAM_OPTION_FIELDS:
            extra = set(so) - STREAM_OPTION_FIELDS
            return web.json_response({"detail": f"Unexpected fields in stream_options: {extra}"}, status=422)
        if chat:
            msgs = body.get("messages")
            if not (isinstance(msgs, list) and len(msgs) == 1 and isinstance(msgs[0].get("content"), str)):
                return web.json_response({"detail": "messages must be one user message with string content."},
                                         status=400)
            prompt = msgs[0]["content"]
        else:
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                return web.json_response({"detail": "prompt must be a string."}, status=400)
        max_tokens = int(body.get("max_tokens") or 16)
        n_prompt = len(prompt.split()) + a.prompt_tokens_offset
        cid, created = f"cmpl-{time.monotonic_ns()}", int(time.time())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)

        def chunk(text, finish):
            choice = {"index": 0, "finish_reason": finish}
            if chat:
                choice["delta"] = {"content": text}
            else:
                choice["text"] = text
            return {"id": cid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
                    "model": "strict-model", "choices": [choice]}

        async with slots:
            for i in range(max_tokens):
                await asyncio.sleep(a.token_ms / 1000)
                await resp.write(sse(chunk(f" w{i % 1000}", "length" if i == max_tokens - 1 else None)))
        if so.get("include_usage"):
            await resp.write(sse({"id": cid, "object": "text_completion", "created": created, "model": "strict-model",
                                  "choices": [], "usage": {"prompt_tokens": n_prompt, "completion_tokens": max_tokens,
                                                           "total_tokens": n_prompt + max_tokens}}))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def completions(request):
        return await generate(request, chat=False)

    async def chat_completions(request):
        return await generate(request, chat=True)

    async def other_post(request):  # SGLang's /generate and anything else a suite may send
        if a.mode in ("non-sse", "bad-sse", "refuse"):
            return await generate(request, chat=False)
        return web.json_response({"detail": "Not Found"}, status=404)

    app = web.Application(middlewares=[checks])
    app.add_routes([web.get("/health", health), web.get("/v1/models", models), web.get("/stats", stats),
                    web.post("/v1/completions", completions), web.post("/v1/chat/completions", chat_completions),
                    web.post("/{tail:.*}", other_post)])
    return app


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--mode", choices=["strict", "refuse", "http500", "non-sse", "bad-sse"], default="strict")
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--token-ms", type=float, default=5.0)
    p.add_argument("--prompt-tokens-offset", type=int, default=0, help="report this many prompt tokens too many")
    p.add_argument("--api-key", default=None)
    a = p.parse_args()
    web.run_app(build_app(a), host=a.host, port=a.port, print=lambda *_: print("ready", flush=True),
                access_log=None)


if __name__ == "__main__":
    main()
