"""Negotiation with a server we know nothing of: send one request of the level's shape and, where the server
refuses a field by name, drop it (ignore_eos -> min_tokens -> neither; usage on every chunk -> at the end -> none)
or switch token-id prompts to text when it says prompts must be strings. Every change is noted with the server's
own words.

Why: strict OpenAI-compatible servers (gateways, transformers serve) reject what SGLang, vLLM and llama.cpp
accept; the suite should measure them anyway, or say in one line why it cannot.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import requests

from ..categories import InfraError, UsageError
from .client import Target, Workload
from ..redact import auth_headers

PROBE_STREAM = 1_000_000  # its prompts never collide with a level's (streams are level indexes)
MAX_ROUNDS = 6


def _refusal(target: Target, workload: Workload, attempt: int, timeout: float) -> tuple[int, str] | None:
    body = target.wire.body(workload.prompt(PROBE_STREAM, attempt), workload, target.model, target.shape)
    try:
        with requests.post(target.url + target.wire.path, json=body, headers=auth_headers(target.api_key),
                           timeout=timeout, stream=True) as r:
            if r.status_code == 200:
                return None
            return r.status_code, " ".join(r.text[:300].split())
    except requests.RequestException as e:
        raise InfraError(f"{target.url}{target.wire.path}: {e.__class__.__name__}: {str(e)[:200]}") from None


def negotiate(target: Target, workload: Workload, timeout: float = 30.0) -> tuple[Target, Workload, list[str]]:
    """The target and workload the server accepts, and what was changed, in words."""
    notes: list[str] = []
    for attempt in range(MAX_ROUNDS):
        refused = _refusal(target, workload, attempt, timeout)
        if refused is None or refused[0] not in (400, 422):
            return target, workload, notes  # accepted, or an error the level reports in the server's words
        status, text = refused
        said = f"HTTP {status}: {text}"
        shape = target.shape
        if "ignore_eos" in text and shape.ignore_eos:
            shape, what = shape.without(ignore_eos=False, min_tokens=True), "ignore_eos refused; sending min_tokens"
        elif "min_tokens" in text and shape.min_tokens:
            shape, what = shape.without(min_tokens=False), ("min_tokens refused too: a request that stops before "
                                                            "max_tokens is invalid (wrong length)")
        elif "continuous_usage_stats" in text and shape.continuous_usage:
            shape, what = shape.without(continuous_usage=False), "usage on every chunk refused; counting chunks"
        elif "stream_options" in text and shape.include_usage:
            shape, what = shape.without(include_usage=False, continuous_usage=False), "stream_options refused"
        elif "prompt" in text and "string" in text and workload.prompt_format == "ids":
            if workload.tokenizer is None:
                raise UsageError(f"{target.url}{target.wire.path} refuses token-id prompts ({said}); give the model's "
                                 f"tokenizer (--tokenizer PATH_OR_NAME) to send text prompts of exactly "
                                 f"{workload.isl} tokens")
            workload = dataclasses.replace(workload, prompt_format="text")
            notes.append(f"token-id prompts refused ({said}); sending text prompts made with {workload.tokenizer.name}")
            continue
        else:
            return target, workload, notes
        target = dataclasses.replace(target, shape=shape)
        notes.append(f"{what} ({said})")
    return target, workload, notes


@dataclass(frozen=True)
class Connection:
    """A server the load generator can talk to: where and how (target), what to send (the workload, after
    negotiation), what the server says of itself, the vocabulary it serves (None where it does not say), and what
    negotiation changed, in words."""

    target: Target
    workload: Workload
    server_info: dict = field(default_factory=dict)
    vocab_size: int | None = None
    negotiated: tuple[str, ...] = ()

    def describe(self, engine) -> dict:
        return engine.describe() | {"wire": self.target.wire.name, "prompt_format": self.workload.prompt_format,
                                    "negotiated": list(self.negotiated)}


def connect(url: str, engine, workload: Workload, *, api: str | None = None, prompt_format: str = "ids",
            api_key: str | None = None, model: str | None = None, info: dict | None = None) -> Connection:
    """The engine's bring-up, the same for the suite and `sglperf bench`: what the server says of itself, the
    model to name, the wire, and for a server we know nothing of, what it accepts."""
    info = engine.server_info(url, api_key) if info is None else info
    target = Target.for_engine(url, engine, api=api, prompt_format=prompt_format, api_key=api_key,
                               model=model or engine.served_model(url, api_key, info))
    notes: list[str] = []
    if engine.negotiates:
        target, workload, notes = negotiate(target, workload)
    return Connection(target, workload, info, engine.vocab_size(url, api_key, info), tuple(notes))


def vocabulary_problem(workload: Workload, vocab_size: int | None) -> str | None:
    """Prompt ids the served model does not have: every request would be refused (llama.cpp: "Prompt contains
    invalid tokens") or, worse, silently clamped."""
    if vocab_size is not None and workload.prompt_format == "ids" and workload.vocab_high > vocab_size:
        return (f"prompt ids are drawn from [{workload.vocab_low}, {workload.vocab_high}) but the served model's "
                f"vocabulary has {vocab_size} tokens")
    return None
