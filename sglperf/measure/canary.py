"""The output canary's requests: a few fixed prompts, one at a time, greedy, before a config's ladder. What came
back (ids where the wire gives them, text where it does) goes to judge/canary.py and the run document.

Why not the load generator: it counts tokens and keeps no ids; the canary needs the ids and costs seconds.
"""

from __future__ import annotations

import json
import time

import requests

from ..categories import InfraError
from ..records import CanaryOutput
from ..redact import auth_headers
from .client import Target


def _body(target: Target, ids: list[int] | None, text: str | None, osl: int) -> tuple[str, dict]:
    prompt = ids if ids is not None else text
    if target.wire.name == "sglang":
        key = "input_ids" if ids is not None else "text"
        sp = {"max_new_tokens": osl, "temperature": 0.0, **({"ignore_eos": True} if target.shape.ignore_eos else {})}
        return "/generate", {key: prompt, "sampling_params": sp, "stream": False}
    body = {"prompt": prompt, "max_tokens": osl, "temperature": 0.0, "seed": 0, "stream": False}
    if target.model:
        body["model"] = target.model
    if target.shape.ignore_eos:
        body["ignore_eos"] = True
    return "/v1/completions", body


def _read(target: Target, answer: dict) -> tuple[tuple[int, ...] | None, str | None]:
    if target.wire.name == "sglang":
        ids = answer.get("output_ids")
        return (tuple(int(i) for i in ids) if isinstance(ids, list) else None), answer.get("text")
    choices = answer.get("choices") or [{}]
    return None, choices[0].get("text")


def _joined(sse: str) -> dict:
    """An SSE answer's chunks as one non-streamed answer: the text joined (ids: SGLang's last chunk holds them all)."""
    text, last = [], {}
    for line in sse.splitlines():
        data = line[5:].strip() if line.startswith("data:") else ""
        if not data or data == "[DONE]":
            continue
        try:
            obj = json.loads(data)
        except ValueError:
            continue
        last = obj if isinstance(obj, dict) else last
        for ch in (obj.get("choices") or []) if isinstance(obj, dict) else []:
            text.append(ch.get("text") or (ch.get("delta") or {}).get("content") or "")
    return {"choices": [{"text": "".join(text)}]} if text else last


def run_canary(target: Target, prompts: list[list[int]] | None, texts: list[str] | None, osl: int, *,
               timeout: float = 120.0) -> list[CanaryOutput]:
    """Each prompt once, in order, at concurrency 1; a server that refuses one is an InfraError in its words."""
    if target.wire.name == "chat":
        raise InfraError("the output canary speaks /generate and /v1/completions; this profile's wire is chat")
    items = [(p, None) for p in prompts] if texts is None else [(None, t) for t in texts]
    out = []
    for ids, text in items:
        path, body = _body(target, ids, text, osl)
        t0 = time.monotonic()
        try:
            r = requests.post(target.url + path, json=body, headers=auth_headers(target.api_key), timeout=timeout)
        except requests.RequestException as e:
            raise InfraError(f"output canary: POST {path} failed: {type(e).__name__}: {e}") from None
        if r.status_code != 200:
            raise InfraError(f"output canary: POST {path} answered HTTP {r.status_code}: {r.text[:300]}")
        if r.headers.get("Content-Type", "").startswith("text/event-stream"):  # a server that always streams
            answer = _joined(r.text)
        else:
            answer = None
        try:
            answer = answer if answer is not None else r.json()
        except ValueError:
            raise InfraError(f"output canary: POST {path} answered with something that is not JSON: "
                             f"{r.text[:200]!r}") from None
        got_ids, got_text = _read(target, answer if isinstance(answer, dict) else {})
        out.append(CanaryOutput(tuple(ids) if ids is not None else None, text, got_ids, got_text,
                                round(time.monotonic() - t0, 3)))
    return out
