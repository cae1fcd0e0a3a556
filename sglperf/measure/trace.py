"""Trace replay: real arrival times and lengths, sent on their timestamps (an open loop). Two layouts are read:
- Mooncake's, as AIPerf and Mooncake's traces use: one JSON object a line, `timestamp` (ms from the trace's start),
  `input_length`, `output_length` and `hash_ids`, each naming one block of `block_tokens` prompt tokens (the last
  block may be shorter). Prompts are built so that equal hash_ids are equal token blocks: requests that share blocks
  share a prefix, as the trace's users did, and a prefix cache may serve exactly the leading blocks an earlier request
  sent.
- Azure's public LLM inference traces (a `.csv` file): `TIMESTAMP` (a date and time), `ContextTokens`,
  `GeneratedTokens` a row. They name no blocks, so every prompt is its own.

What the replay reports: how late each request was sent against its (sped-up) timestamp, and the prefix cache's share
of prompt tokens against what the shared blocks allow."""

from __future__ import annotations

import csv
import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..categories import UsageError
from ..records import RequestRecord
from .prompts import MAX_TOKENS, Prompt
from .workload_metrics import lateness_ms, prefix_cache

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


@dataclass(frozen=True)
class Trace:
    """A trace as a judged workload replays it: its requests, looped for as long as a level runs. Pass p of the loop
    renames every hash_id (h + p x (the largest + 1)), so each pass sends blocks no earlier pass sent, and a prefix
    cache may serve in each pass exactly what the trace's own shared blocks allow (`allowed`). A level's offered
    rate sets the speed-up: rate / the trace's own mean rate, so the trace's bursts and lulls keep their shape."""

    requests: tuple[TraceRequest, ...]
    block_tokens: int
    name: str  # the file's name, in the fingerprint (a path differs between machines)
    digest: str  # the file's sha256, first 12 hex digits: a baseline of one trace never judges another
    allowed: tuple[int, ...] = field(init=False)  # per request, the prompt tokens a prefix cache may serve
    rename_step: int = field(init=False)  # the largest hash_id + 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "allowed", tuple(shared_tokens(list(self.requests), self.block_tokens)))
        object.__setattr__(self, "rename_step", max((h for q in self.requests for h in q.hash_ids), default=0) + 1)

    @property
    def period_s(self) -> float:
        """One pass, recorded time: the last request's timestamp and one mean gap more, before the next pass."""
        n, last = len(self.requests), self.requests[-1].at_s
        return last + (last / (n - 1) if n > 1 and last > 0 else 1.0)

    @property
    def rate(self) -> float:
        """The trace's own mean rate, requests a second of recorded time."""
        return len(self.requests) / self.period_s

    @property
    def longest(self) -> tuple[int, int]:
        return max(r.isl for r in self.requests), max(r.osl for r in self.requests)

    def kv_basis(self) -> tuple[int, int, int]:
        """The mean request's input and output lengths (what the KV pool holds on average) and the 90th percentile
        of a request's tokens, as a length mix predicts its ceiling."""
        n = len(self.requests)
        whole = sorted(r.isl + r.osl for r in self.requests)
        return (round(sum(r.isl for r in self.requests) / n), round(sum(r.osl for r in self.requests) / n),
                whole[int(0.9 * n)])

    def describe(self) -> str:
        blocks = (f", {self.block_tokens}-token blocks" if any(r.hash_ids for r in self.requests) else
                  ", every prompt its own")
        return f"trace {self.name} ({self.digest}): {len(self.requests)} requests over {self.period_s:.2f} s{blocks}"

    def due_s(self, k: int, speedup: float) -> float:
        """When request k of the loop (pass k // n, request k % n) is due, seconds from the replay's start."""
        p, i = divmod(k, len(self.requests))
        return (p * self.period_s + self.requests[i].at_s) / speedup

    def prompt(self, k: int, *, seed: int, low: int, high: int) -> Prompt:
        p, i = divmod(k, len(self.requests))
        r = self.requests[i]
        renamed = TraceRequest(r.at_s, r.isl, r.osl, tuple(h + p * self.rename_step for h in r.hash_ids))
        return prompt(renamed, seed=seed, low=low, high=high, block=self.block_tokens, index=k)


def load(path: str | Path, block_tokens: int = BLOCK_TOKENS) -> Trace:
    """A trace file read into the record a workload replays: a `.csv` in Azure's layout, anything else Mooncake's."""
    where = Path(path)
    reqs = read_azure(where) if where.suffix.lower() == ".csv" else read_mooncake(where, block_tokens)
    digest = hashlib.sha256(where.read_bytes()).hexdigest()[:12]
    return Trace(tuple(reqs), block_tokens, where.name, digest)


def _lines(where: Path) -> list[str]:
    try:
        return where.read_text().splitlines()
    except OSError as e:
        raise TraceError(f"--trace {where}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise TraceError(f"--trace {where}: not text ({e.reason} at byte {e.start})") from None


AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def read_azure(path: str | Path) -> list[TraceRequest]:
    """Azure's LLM inference trace layout, in time order from its first row; a row that is not a request is refused
    naming the file, line and column."""
    where = Path(path)
    rows = list(csv.reader(_lines(where)))
    if not rows or tuple(c.strip() for c in rows[0][:3]) != AZURE_COLUMNS:
        raise TraceError(f"--trace {where}:1: a .csv trace starts with the header {','.join(AZURE_COLUMNS)} (Azure's "
                         f"LLM inference trace layout)")
    stamped = []
    for n, row in enumerate(rows[1:], 2):
        if not row:
            continue
        at = f"--trace {where}:{n}"
        try:
            t = np.datetime64(row[0].strip().replace(" ", "T"), "ns")
        except ValueError:
            t = np.datetime64("NaT")
        if np.isnat(t):
            raise TraceError(f"{at}: TIMESTAMP {row[0]!r} is not a date and time")
        counts = [_count(row, k, at) for k in (1, 2)]
        stamped.append((t, counts[0], counts[1]))
    if not stamped:
        raise TraceError(f"--trace {where}: no requests")
    t0 = min(t for t, _, _ in stamped)
    return sorted((TraceRequest(float((t - t0) / np.timedelta64(1, "s")), i, o, ()) for t, i, o in stamped),
                  key=lambda r: r.at_s)


def _count(row: list[str], k: int, at: str) -> int:
    v = row[k].strip() if k < len(row) else ""
    if not v.isdigit() or not 1 <= int(v) <= MAX_TOKENS:
        raise TraceError(f"{at}: {AZURE_COLUMNS[k]} {v!r} is not a whole number in [1, {MAX_TOKENS}]")
    return int(v)


def read_mooncake(path: str | Path, block_tokens: int = BLOCK_TOKENS) -> list[TraceRequest]:
    """The trace's requests in time order; a line that is not one is refused naming the file, line and field."""
    out, where = [], Path(path)
    lines = _lines(where)
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


def summary(records: list[RequestRecord]) -> dict:
    """The replay in numbers: requests sent and failed, send lateness (p50, p99, max in ms), output tok/s over the
    replay, TTFT and TPOT percentiles, and the prefix cache's share of prompt tokens against what shared blocks
    allow (workload_metrics reads both as it does for a level)."""
    sent = [r for r in records if r.due_time is not None]
    ok = [r for r in sent if r.ok]
    late = np.array(lateness_ms(sent)) if sent else np.array([0.0])
    span = (max(r.end_time for r in ok) - min(r.send_time for r in ok)) if ok else 0.0
    ttft = [1000 * (t - r.send_time) for r in ok if (t := r.first_token_time) is not None]
    tpot = [1000 * (r.end_time - t) / (r.output_tokens - 1) for r in ok
            if (t := r.first_token_time) is not None and r.output_tokens > 1]
    cache = prefix_cache(ok, None, [], None)

    def pct(xs, q):
        return round(float(np.percentile(xs, q)), 2) if len(xs) else None

    return {
        "requests": len(sent), "failed": len(sent) - len(ok),
        "send_late_ms": {"p50": pct(late, 50), "p99": pct(late, 99), "max": round(float(late.max()), 2)},
        "output_tps": round(sum(r.output_tokens for r in ok) / span, 1) if span > 0 else None,
        "ttft_ms": {"p50": pct(ttft, 50), "p99": pct(ttft, 99)},
        "tpot_ms": {"p50": pct(tpot, 50), "p99": pct(tpot, 99)},
        "cache_share": cache.get("prefix_cache_share"), "cache_allowed": cache.get("prefix_cache_allowed"),
    }
