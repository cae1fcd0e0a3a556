"""The output canary's requests: a few fixed prompts, one at a time, greedy, before a config's ladder. What came
back (ids where the wire gives them, text where it does) goes to judge/canary.py and the run document.

Why not the load generator: it counts tokens and keeps no ids; the canary needs the ids and costs seconds. The
request and the answer are the wire's (Wire.greedy, Wire.answer), so the canary speaks whatever the ladder speaks.
"""

from __future__ import annotations

import dataclasses
import json
import time

import requests

from ..categories import InfraError
from ..records import CanaryOutput
from ..redact import auth_headers
from .client import Target, Workload
from .prompts import Prompt


class CanaryStalled(InfraError):
    """The server did not answer a canary request within its timeout (the stall timeout): it is hung."""


def _events(sse: str) -> list[dict]:
    """The JSON objects of an SSE answer (a server that streams though asked not to)."""
    out = []
    for line in sse.splitlines():
        data = line[5:].strip() if line.startswith("data:") else ""
        if data and data != "[DONE]":
            try:
                obj = json.loads(data)
            except ValueError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
    return out


def run_canary(target: Target, workload: Workload, prompts: list[list[int]] | None, texts: list[str] | None,
               osl: int, *, timeout: float = 120.0) -> list[CanaryOutput]:
    """Each prompt once, in order, at concurrency 1, greedy; a server that refuses one is an InfraError in its
    words."""
    wire, w = target.wire, dataclasses.replace(workload, osl=osl, temperature=0.0)
    items = [Prompt(ids=p) for p in prompts] if texts is None else [Prompt(text=t) for t in texts]
    out = []
    for prompt in items:
        # as the ladder sends it, the profile's extra fields too, but never streamed
        body = {**wire.greedy(prompt, w, target.model, target.shape), **w.extra_body, "stream": False}
        t0 = time.monotonic()
        try:
            r = requests.post(target.url + wire.path, json=body, headers=auth_headers(target.api_key),
                              timeout=timeout)
        except requests.Timeout as e:
            raise CanaryStalled(f"output canary: POST {wire.path}: no answer within {timeout:g} s ({e})") from None
        except requests.RequestException as e:
            raise InfraError(f"output canary: POST {wire.path} failed: {type(e).__name__}: {e}") from None
        if r.status_code != 200:
            raise InfraError(f"output canary: POST {wire.path} answered HTTP {r.status_code}: {r.text[:300]}")
        if r.headers.get("Content-Type", "").startswith("text/event-stream"):
            got_ids, got_text = wire.answer_of_stream(_events(r.text))
        else:
            try:
                answer = r.json()
            except ValueError:
                raise InfraError(f"output canary: POST {wire.path} answered with something that is not JSON: "
                                 f"{r.text[:200]!r}") from None
            got_ids, got_text = wire.answer(answer if isinstance(answer, dict) else {})
        out.append(CanaryOutput(tuple(prompt.ids) if prompt.ids is not None else None, prompt.text, got_ids,
                                got_text, round(time.monotonic() - t0, 3)))
    return out
