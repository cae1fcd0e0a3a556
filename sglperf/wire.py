"""Wire formats: the request body a streaming request sends and how its SSE chunks are read, one class per API.

Why separate from the client: engines differ in what they accept (SGLang's native /generate, OpenAI
/v1/completions); the engine adapter names the wire, the client only drives it.
"""

from __future__ import annotations

import json


class Wire:
    name = ""
    path = ""

    def body(self, ids: list[int], workload, model: str | None, continuous_usage: bool) -> dict:
        raise NotImplementedError

    def chunk(self, obj: dict, p, prev: int, now: float, add) -> int:
        """Read one parsed chunk into the request's progress `p`; return the tokens counted so far.
        `add(p, now, delta)` records newly arrived tokens."""
        raise NotImplementedError


class NativeGenerate(Wire):
    """SGLang's /generate: cumulative output, counts in meta_info."""

    name = "sglang"
    path = "/generate"

    def body(self, ids, workload, model, continuous_usage):
        return {"input_ids": ids, "sampling_params": {"max_new_tokens": workload.osl, "ignore_eos":
                                                      workload.ignore_eos, "temperature": workload.temperature},
                "stream": True}

    def chunk(self, obj, p, prev, now, add):
        meta = obj.get("meta_info") or {}
        ct = meta.get("completion_tokens")
        if ct is None:
            ct = len(obj.get("output_ids") or [])
        add(p, now, ct - prev)
        fr = meta.get("finish_reason")
        if fr:
            kind = fr.get("type") if isinstance(fr, dict) else str(fr)
            p.finish = kind
            p.server_prompt, p.server_completion = meta.get("prompt_tokens"), ct
            if kind == "abort":
                p.fail("abort", f"finish_reason abort: {json.dumps(fr)[:300]}")
        return max(prev, ct)


class OpenAICompletions(Wire):
    """OpenAI /v1/completions with token-id prompts; exact counts from per-chunk usage where the server sends it."""

    name = "openai"
    path = "/v1/completions"

    def body(self, ids, workload, model, continuous_usage):
        body = {"prompt": ids, "max_tokens": workload.osl, "stream": True, "ignore_eos": workload.ignore_eos,
                "temperature": workload.temperature}
        if model:
            body["model"] = model
        if continuous_usage:
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        return body

    def chunk(self, obj, p, prev, now, add):
        usage = obj.get("usage") or {}
        choices = obj.get("choices") or []
        ct = usage.get("completion_tokens")
        count = prev
        for ch in choices:
            if ch.get("text") and ct is None:
                count += 1  # servers without per-chunk usage (llama.cpp) send one token per chunk
            fr = ch.get("finish_reason")
            if fr:
                p.finish = fr
                if fr == "abort":
                    p.fail("abort", "finish_reason abort")
        if ct is not None:
            count = ct
            p.server_completion = ct
            p.server_prompt = usage.get("prompt_tokens", p.server_prompt)
        add(p, now, count - prev)
        return max(prev, count)


NATIVE, OPENAI = NativeGenerate(), OpenAICompletions()
WIRES = {w.name: w for w in (NATIVE, OPENAI)}


def by_name(name: str) -> Wire:
    try:
        return WIRES[name]
    except KeyError:
        raise ValueError(f"unknown API {name!r} (known: {', '.join(WIRES)})") from None
