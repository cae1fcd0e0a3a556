"""Wire formats: the request body a streaming request sends and how its SSE chunks are read, one class per API
(SGLang's native /generate, OpenAI /v1/completions and /v1/chat/completions), and the request's shape: which
optional fields the server accepts.

Why separate from the client: engines differ in what they accept; the engine adapter (and, for servers we know
nothing of, negotiation) names the wire and the shape, the client only drives them.
"""

from __future__ import annotations

import math

import json

from orjson import loads  # SSE chunks: a fifth of json.loads's cost per chunk

from ..records import Shape


class Wire:
    name = ""
    limit_field = "the length limit"  # the request field that caps the output
    path = ""

    def body(self, prompt, workload, model: str | None, shape: Shape) -> dict:
        raise NotImplementedError

    def parse(self, data: bytes) -> object:
        """One SSE payload as JSON (ValueError where it is not)."""
        return loads(data)

    def chunk(self, obj: dict, p, prev: int) -> int:
        """Read one parsed chunk's counts, finish reason and errors into the request's progress `p`; return the
        tokens counted so far (`prev` before this chunk). The client times the tokens a chunk adds."""
        raise NotImplementedError

    def greedy(self, prompt, workload, model: str | None, shape: Shape) -> dict:
        """One non-streamed request of the same shape (the output canary's)."""
        body = {**self.body(prompt, workload, model, shape), "stream": False}
        body.pop("stream_options", None)
        return body

    def answer(self, obj: dict) -> tuple[tuple[int, ...] | None, str | None]:
        """A non-streamed answer's output ids (where the wire gives them) and text."""
        raise NotImplementedError

    def answer_of_stream(self, objs: list[dict]) -> tuple[tuple[int, ...] | None, str | None]:
        """The same from a server that streams anyway: here each chunk holds everything so far."""
        return self.answer(objs[-1]) if objs else (None, None)

    # count(data) -> the server's own count of tokens so far, read from an ordinary chunk in the middle of a
    # stream without parsing it; None for any other chunk (parse and chunk read those). None here: no such reading.
    count = None


class NativeGenerate(Wire):
    """SGLang's /generate: cumulative output, counts in meta_info."""

    name = "sglang"
    path = "/generate"
    limit_field = "sampling_params.max_new_tokens"

    def body(self, prompt, workload, model, shape):
        osl = prompt.max_tokens or workload.osl
        sp = {"max_new_tokens": osl, "temperature": workload.temperature}
        if shape.ignore_eos:
            sp["ignore_eos"] = workload.ignore_eos
        elif shape.min_tokens:
            sp["min_new_tokens"] = osl
        body = {"input_ids": prompt.ids} if prompt.ids is not None else {"text": prompt.text}
        return {**body, "sampling_params": sp, "stream": True}

    def answer(self, obj):
        ids = obj.get("output_ids")
        return (tuple(int(i) for i in ids) if isinstance(ids, list) else None), obj.get("text")

    META = b'"meta_info":'
    ONGOING = b'"finish_reason":null'
    COUNT = b'"completion_tokens":'

    def parse(self, data):
        """Only meta_info, where the chunk ends with it (as SGLang writes it): the chunk's text and output_ids are
        cumulative, so parsing them all costs O(tokens so far) per chunk, O(n^2) per request; its counts and finish
        reason are all the client reads. Anything else (an error object, no completion_tokens, another layout) is
        parsed whole. `"meta_info":` cannot occur inside a JSON string: a quote there is escaped."""
        at = data.rfind(self.META)
        if at > 0:
            end = data.rfind(b"}")
            try:
                meta = loads(data[at + len(self.META):end])
            except ValueError:
                meta = None
            if isinstance(meta, dict) and "completion_tokens" in meta:
                return {"meta_info": meta}
        return loads(data)

    def count(self, data):
        """completion_tokens of a chunk whose meta_info says finish_reason null and has a field after the count, as
        SGLang writes them (compact JSON): the chunks between a stream's first and last. Anything else (the last
        chunk, an error, an abort, another layout or spacing) is None and goes through parse and chunk, which check
        it whole; about 0.6 x the cost of parse and chunk (benchmarks/native_chunk_count.py, docs/measurement.md).
        The price:
        an ordinary chunk is not checked to be well-formed JSON, only to carry these three fields."""
        at = data.rfind(self.META)
        if at < 0 or data.find(self.ONGOING, at) < 0:
            return None
        at = data.find(self.COUNT, at)
        if at < 0:
            return None
        at += len(self.COUNT)
        try:
            return int(data[at:data.find(b",", at)])
        except ValueError:  # not digits (or no comma after them)
            return None

    def chunk(self, obj, p, prev):
        meta = obj.get("meta_info") or {}
        ct = meta.get("completion_tokens")
        if ct is None:
            ct = len(obj.get("output_ids") or [])
        else:
            p.count_source = "usage"
        fr = meta.get("finish_reason")
        if fr:
            kind = fr.get("type") if isinstance(fr, dict) else str(fr)
            p.finish = kind
            p.server_prompt, p.server_completion = meta.get("prompt_tokens"), ct
            spec_from_meta(p, meta, ct)  # speculative decoding
            p.cached = cached_tokens(p, meta.get("cached_tokens"), meta.get("prompt_tokens"))
            ttft = meta.get("first_token_latency")  # SGLang with --enable-metrics: its own TTFT, seconds
            if isinstance(ttft, (int, float)) and not isinstance(ttft, bool) and 0 <= ttft < 1e6:
                p.server_ttft = float(ttft)
            if kind == "abort":
                p.fail("abort", f"finish_reason abort: {json.dumps(fr)[:300]}")
        return ct


class OpenAICompletions(Wire):
    """OpenAI /v1/completions; exact counts from per-chunk usage where the server sends it, else one token per
    chunk with text, reconciled at the end with the final usage or the tokenizer (RequestRecord.count_source)."""

    name = "openai"
    path = "/v1/completions"
    limit_field = "max_tokens"

    def prompt_field(self, prompt) -> dict:
        return {"prompt": prompt.ids if prompt.ids is not None else prompt.text}

    def body(self, prompt, workload, model, shape):
        osl = prompt.max_tokens or workload.osl
        body = {**self.prompt_field(prompt), "max_tokens": osl, "stream": True,
                "temperature": workload.temperature}
        if shape.ignore_eos:
            body["ignore_eos"] = workload.ignore_eos
        elif shape.min_tokens:
            body["min_tokens"] = osl
        if model:
            body["model"] = model
        if shape.include_usage:
            body["stream_options"] = {"include_usage": True}
            if shape.continuous_usage:
                body["stream_options"]["continuous_usage_stats"] = True
        return body

    @staticmethod
    def text_of(choice: dict) -> str | None:
        return choice.get("text")

    @staticmethod
    def final_text_of(choice: dict) -> str | None:
        return choice.get("text")

    def answer(self, obj):
        return None, self.final_text_of((obj.get("choices") or [{}])[0])

    def answer_of_stream(self, objs):
        return None, "".join(self.text_of(ch) or "" for o in objs for ch in (o.get("choices") or []))

    def chunk(self, obj, p, prev):
        usage = obj.get("usage") or {}
        choices = obj.get("choices") or []
        ct = usage.get("completion_tokens")
        count = prev
        for ch in choices:
            text = self.text_of(ch)
            if text:
                if p.texts is not None:
                    p.texts.append(text)
                if ct is None:
                    count += 1  # servers without per-chunk usage (llama.cpp) send one token per chunk
            fr = ch.get("finish_reason")
            if fr:
                p.finish = fr
                if fr == "abort":
                    p.fail("abort", "finish_reason abort")
                spec_from_timings(p, obj.get("timings"))
        if ct is not None:
            p.server_completion = ct
            p.server_prompt = usage.get("prompt_tokens", p.server_prompt)
            details = usage.get("prompt_tokens_details")  # SGLang with --enable-cache-report, vLLM
            if isinstance(details, dict) and "cached_tokens" in details:
                p.cached = cached_tokens(p, details.get("cached_tokens"), usage.get("prompt_tokens"))
            if choices:  # per-chunk usage: exact; a usage-only closing chunk is reconciled at the end
                count = ct
                p.count_source = "usage"
        return count


class OpenAIChat(OpenAICompletions):
    """OpenAI /v1/chat/completions with the prompt as one user message; text arrives in choices[].delta."""

    name = "chat"
    path = "/v1/chat/completions"

    def prompt_field(self, prompt) -> dict:
        return {"messages": [{"role": "user", "content": prompt.text}]}

    @staticmethod
    def text_of(choice: dict) -> str | None:
        return (choice.get("delta") or {}).get("content")

    @staticmethod
    def final_text_of(choice: dict) -> str | None:
        return (choice.get("message") or {}).get("content")


NATIVE, OPENAI, CHAT = NativeGenerate(), OpenAICompletions(), OpenAIChat()
WIRES = {w.name: w for w in (NATIVE, OPENAI, CHAT)}


def by_name(name: str) -> Wire:
    try:
        return WIRES[name]
    except KeyError:
        raise ValueError(f"unknown API {name!r} (known: {', '.join(WIRES)})") from None


def spec_from_timings(p, timings) -> None:
    """llama.cpp's final chunk carries `timings`: the tokens it predicted and, with speculative decoding, the draft
    tokens it accepted (not its verify steps). Each of the target's forward passes (the prompt's, then one a decode
    step, drafted or not) gives one token of its own and the drafts it accepted, so n tokens with a accepted took
    n - a passes: the acceptance length is n / (n - a) tokens a pass, which the server's counters give over a window
    too (measure/workload_metrics.acceptance)."""
    if not isinstance(timings, dict) or "draft_n_accepted" not in timings:
        return
    n, a = count_or_none(timings.get("predicted_n")), count_or_none(timings.get("draft_n_accepted"))
    if n is not None and a is not None and n > a:
        p.spec_verify_ct, p.spec_accept_length = n - a, n / (n - a)


def count_or_none(x) -> int | None:
    """A token count a server reported, or None where it is not a plausible one (absent, not an integer, negative)."""
    return x if type(x) is int and 0 <= x < 1 << 40 else None


def cached_tokens(p, raw, prompt) -> int | None:
    """The prompt tokens the server says its prefix cache served; None where it said none. A count that is not one,
    or more tokens than the prompt held, is no reading: it is kept in the server's words as an impossible number
    (the level is invalid), never clipped to the prompt."""
    if raw is None:
        return None
    n = count_or_none(raw)
    limit = count_or_none(prompt)
    limit = p.prompt_tokens if limit is None else limit
    if n is None or (limit and n > limit):
        p.impossible.append(f"cached_tokens {raw!r} for a prompt of {limit} tokens")
        return None
    return n


def spec_from_meta(p, meta: dict, completion) -> None:
    """Speculative decoding's verify steps and acceptance length from SGLang's final meta_info. Either present but
    impossible (a verify count below 1 or above the tokens produced, an acceptance length below 1, past the tokens
    produced, or not a number) is kept as an impossible number, in the server's words."""
    verify, accept = meta.get("spec_verify_ct"), meta.get("spec_accept_length")
    if verify is None and accept is None:
        return
    tokens = count_or_none(completion)
    top = tokens if tokens else 1 << 40
    good_verify = type(verify) is int and 1 <= verify <= top
    good_accept = (isinstance(accept, (int, float)) and not isinstance(accept, bool) and math.isfinite(accept)
                   and 1 <= accept <= top)
    if good_verify and good_accept:
        p.spec_verify_ct, p.spec_accept_length = verify, float(accept)
        return
    if not tokens and verify in (0, None) and accept in (0, 0.0, None):
        return  # nothing produced, nothing verified: an aborted or empty request, not an impossible one
    p.impossible.append(f"spec_verify_ct {verify!r} and spec_accept_length {accept!r} for {completion!r} tokens")
