"""`sglperf replay --url URL --trace FILE`: a Mooncake-layout trace sent on its timestamps (measure/trace.py) against
a running server, reporting how late each request was sent, the latencies, and the prefix cache's share against what
the trace's shared blocks allow. Exit status: 0 replayed with every request answered, 1 some failed, 2 bad input."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from .. import engines
from ..argtypes import positive
from ..categories import SglperfError, UsageError
from ..fileio import atomic_write_json, check_file_target
from ..measure import trace as tr
from ..measure.client import LoadGenerator, Workload
from ..measure.negotiate import connect
from ..redact import api_key_from_env, register, url_secrets
from .bench import vocab_range, vocabulary


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:30000")
    p.add_argument("--trace", required=True, help="a Mooncake-layout JSONL trace (timestamp ms, input_length, "
                                                  "output_length, hash_ids), or Azure's LLM inference layout (.csv: "
                                                  "TIMESTAMP, ContextTokens, GeneratedTokens)")
    p.add_argument("--speedup", type=positive("--speedup"), default=1.0,
                   help="send the trace this many times faster than it was recorded (default 1)")
    p.add_argument("--block-tokens", type=int, default=tr.BLOCK_TOKENS,
                   help=f"prompt tokens a hash_id names (default {tr.BLOCK_TOKENS}, Mooncake's)")
    p.add_argument("--engine", choices=list(engines.NAMES), default=None, help="default: detected")
    p.add_argument("--vocab-range", type=vocab_range, default=None, help="prompt ids are drawn from [LOW,HIGH)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--request-timeout", type=positive("--request-timeout"), default=600.0)
    p.add_argument("--json", dest="json_path", default=None, help="write the summary as JSON")


def main(args: argparse.Namespace) -> int:
    try:
        if args.block_tokens < 1:
            raise UsageError(f"--block-tokens {args.block_tokens}: a block holds at least one token")
        if args.json_path:
            check_file_target(args.json_path, "--json")
        trace = tr.load(args.trace, args.block_tokens)
        result = asyncio.run(_replay(args, trace))
    except SglperfError as e:
        print(f"sglperf replay: {e.report()}", file=sys.stderr)
        return 2 if isinstance(e, UsageError) else 1
    print(json.dumps(result, indent=2))
    if args.json_path:
        atomic_write_json(args.json_path, result)
    return 1 if result["failed"] else 0


async def _replay(args: argparse.Namespace, trace: tr.Trace) -> dict:
    key = api_key_from_env()
    register(*url_secrets(args.url))
    url = engines.check_url(args.url, "--url")
    engine = engines.get(args.engine) if args.engine else engines.detect(url, key)
    info = engine.server_info(url, key)
    lo, hi = vocabulary(args.vocab_range, engine.vocab_size(url, key, info), None, url)
    isl, osl = trace.longest
    conn = connect(url, engine, Workload(isl, osl, seed=args.seed, vocab_low=lo, vocab_high=hi, trace=trace),
                   api_key=key, info=info)
    async with LoadGenerator(conn.target, conn.workload, request_timeout=args.request_timeout) as gen:
        await gen.replay(trace, args.speedup, asyncio.Event(), passes=1)
        records = gen.records
    return {"trace": str(args.trace), "speedup": args.speedup, "engine": engine.name, **tr.summary(records)}
