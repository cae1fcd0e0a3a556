"""Trace replay: real arrival times and lengths, sent on their timestamps (an open loop), in the Mooncake layout that
AIPerf and Mooncake's traces use: one JSON object a line, `timestamp` (ms from the trace's start), `input_length`,
`output_length` and `hash_ids`, each naming one block of `block_tokens` prompt tokens (the last block may be
shorter). Prompts are built so that equal hash_ids are equal token blocks: requests that share blocks share a prefix,
as the trace's users did, and a prefix cache may serve exactly the leading blocks an earlier request sent.

What the replay reports: how late each request was sent against its (sped-up) timestamp, and the prefix cache's share
of prompt tokens against what the shared blocks allow."""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..categories import UsageError
from ..records import RequestRecord
from .client import sent_and_settled, stop_or_timeout
from .prompts import MAX_TOKENS, Prompt

# Mooncake's traces and AIPerf's reader: 512 tokens a block.
BLOCK_TOKENS = 512


@dataclass(frozen=True)
class TraceRequest:
    at_s: float  # from the trace's start
    isl: int
    osl: int
    hash_ids: tuple[int, ...]


class TraceError(UsageError):
    pass


def read_mooncake(path: str | Path, block_tokens: int = BLOCK_TOKENS) -> list[TraceRequest]:
    """The trace's requests in time order; a line that is not one is refused naming the file, line and field."""
    out, where = [], Path(path)
    try:
        lines = where.read_text().splitlines()
    except OSError as e:
        raise TraceError(f"--trace {where}: {e.strerror or e}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise TraceError(f"--trace {where}:{n}: not JSON ({e})") from None
        out.append(_request(obj, f"--trace {where}:{n}", block_tokens))
    if not out:
        raise TraceError(f"--trace {where}: no requests")
    return sorted(out, key=lambda r: r.at_s)


def _request(obj, where: str, block: int) -> TraceRequest:
    if not isinstance(obj, dict):
        raise TraceError(f"{where}: not an object")

    def count(key: str, low: int) -> int:
        v = obj.get(key)
        if type(v) is not int or not low <= v <= MAX_TOKENS:
            raise TraceError(f"{where}: {key} {v!r} is not a whole number in [{low}, {MAX_TOKENS}]")
        return v

    t = obj.get("timestamp")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        raise TraceError(f"{where}: timestamp {t!r} is not a time in ms from the trace's start")
    isl, osl = count("input_length", 1), count("output_length", 1)
    ids = obj.get("hash_ids", [])
    if not isinstance(ids, list) or any(type(h) is not int for h in ids):
        raise TraceError(f"{where}: hash_ids {str(ids)[:80]} is not a list of whole numbers")
    if ids and not (len(ids) - 1) * block < isl <= len(ids) * block:
        raise TraceError(f"{where}: {len(ids)} hash_ids of {block} tokens do not make input_length {isl}")
    return TraceRequest(t / 1000.0, isl, osl, tuple(ids))


def prompt(req: TraceRequest, *, seed: int, low: int, high: int, block: int = BLOCK_TOKENS, index: int = 0) -> Prompt:
    """The request's prompt ids: block k is seeded by its hash_id alone (the same id, the same tokens, in any request),
    the last one cut to the input length. A request without hash_ids gets ids of its own."""
    if not req.hash_ids:
        rng = np.random.default_rng([seed, 0x7ACE, index])
        return Prompt(ids=rng.integers(low, high, req.isl).tolist(), tokens=req.isl, max_tokens=req.osl)
    ids: list[int] = []
    for h in req.hash_ids:
        ids += np.random.default_rng([seed, 0xB10C, h & ((1 << 63) - 1)]).integers(low, high, block).tolist()
    return Prompt(ids=ids[:req.isl], tokens=req.isl, max_tokens=req.osl)


def shared_tokens(trace: list[TraceRequest], block: int = BLOCK_TOKENS) -> list[int]:
    """Per request, the prompt tokens a prefix cache may serve: the tokens of its leading blocks that an earlier
    request sent in the same place (a prefix of blocks, as a radix tree matches; an earlier request that sent only
    part of a block shares only that part, and the match ends there), less the one token every prefill computes."""
    sent: dict[tuple[int, ...], int] = {}  # a prefix of blocks -> the most tokens of its last block sent before
    out = []
    for r in trace:
        shared = 0
        for k in range(1, len(r.hash_ids) + 1):
            got = sent.get(r.hash_ids[:k], 0)
            shared += got
            if got < block:
                break
        out.append(max(0, min(shared, r.isl - 1)))
        for k in range(1, len(r.hash_ids) + 1):
            here = min(block, r.isl - (k - 1) * block)
            sent[r.hash_ids[:k]] = max(sent.get(r.hash_ids[:k], 0), here)
    return out


async def replay(gen, trace: list[TraceRequest], prompts: list[Prompt], speedup: float, stop: asyncio.Event
                 ) -> dict[int, float]:
    """Send request i at its timestamp / speedup after the start, whatever the server's answers (an open loop);
    {index: when it was due, on the generator's clock}. Stops sending once `stop` is set."""
    t0 = gen.clock()
    due: dict[int, float] = {}
    tasks: set[asyncio.Task] = set()

    async def send() -> None:
        for i, (req, p) in enumerate(zip(trace, prompts)):
            at = t0 + req.at_s / speedup
            wait = at - gen.clock()
            if wait > 0:
                await stop_or_timeout(stop, wait)
            if stop.is_set():
                break
            due[i] = at
            tasks.add(asyncio.create_task(gen.one_request(i, p)))

    await sent_and_settled(send(), tasks)
    return due


def summary(records: list[RequestRecord], due: dict[int, float], allowed: list[int]) -> dict:
    """The replay in numbers: requests sent and failed, send lateness (p50, p99, max in ms), output tok/s over the
    replay, TTFT and TPOT percentiles, and the prefix cache's share of prompt tokens against what shared blocks
    allow."""
    sent = [r for r in records if r.index in due]
    ok = [r for r in sent if r.ok]
    late = np.array([max(0.0, r.send_time - due[r.index]) * 1000 for r in sent]) if sent else np.array([0.0])
    span = (max(r.end_time for r in ok) - min(r.send_time for r in ok)) if ok else 0.0
    ttft = [1000 * (t - r.send_time) for r in ok if (t := r.first_token_time) is not None]
    tpot = [1000 * (r.end_time - t) / (r.output_tokens - 1) for r in ok
            if (t := r.first_token_time) is not None and r.output_tokens > 1]
    rated = [r for r in ok if r.server_cached_tokens is not None]
    prompt_tokens = sum(r.prompt_tokens for r in rated)

    def pct(xs, q):
        return round(float(np.percentile(xs, q)), 2) if len(xs) else None

    return {
        "requests": len(sent), "failed": len(sent) - len(ok),
        "send_late_ms": {"p50": pct(late, 50), "p99": pct(late, 99), "max": round(float(late.max()), 2)},
        "output_tps": round(sum(r.output_tokens for r in ok) / span, 1) if span > 0 else None,
        "ttft_ms": {"p50": pct(ttft, 50), "p99": pct(ttft, 99)},
        "tpot_ms": {"p50": pct(tpot, 50), "p99": pct(tpot, 99)},
        "cache_share": round(sum(min(r.server_cached_tokens or 0, r.prompt_tokens) for r in rated) / prompt_tokens, 4)
        if prompt_tokens else None,
        "cache_allowed": round(sum(allowed[r.index] for r in rated) / prompt_tokens, 4) if prompt_tokens else None,
    }
